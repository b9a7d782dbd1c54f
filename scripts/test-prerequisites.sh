#!/usr/bin/env bash
# What the tests need beyond Python packages: libvirt's headers (libvirt-python builds against them), its clients
# (virsh, virt-xml-validate) and xmllint, so the libvirt VM runtime is tested against real libvirt (its test driver);
# and Debian's chromium, the browser that opens the allocation's page in the Temporal UI (driven by Playwright,
# which never downloads a browser of its own here). Installs them with apt when missing and allowed (CI runs as
# root on Debian); otherwise says, in one loud line each, which tests will be skipped and what to install. Never
# fails the run: `pip install -e '.[dev]' && berth demo` needs none of this.
set -uo pipefail

PACKAGES=(libvirt-dev libvirt-clients libxml2-utils pkg-config gcc)
BROWSER=(chromium)

have_all() {
    pkg-config --exists libvirt 2>/dev/null && command -v virt-xml-validate >/dev/null && command -v xmllint >/dev/null \
        && command -v gcc >/dev/null
}

have_browser() {
    command -v chromium >/dev/null
}

missing=()
have_all || missing+=("${PACKAGES[@]}")
have_browser || missing+=("${BROWSER[@]}")
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} for the libvirt and browser tests ..."
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"; } >/dev/null 2>&1 || true
fi

if have_all; then
    python -c "import libvirt" 2>/dev/null || pip install -q 'libvirt-python>=9.0' \
        || echo "LOUD: libvirt-python did not build: the libvirt VM runtime tests will be SKIPPED"
else
    echo "LOUD: ${PACKAGES[*]} are not installed (and could not be): the libvirt VM runtime tests will be SKIPPED"
fi
have_browser || echo "LOUD: chromium is not installed (and could not be): the Temporal UI browser test will be SKIPPED"
exit 0
