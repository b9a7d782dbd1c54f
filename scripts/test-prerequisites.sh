#!/usr/bin/env bash
# What the tests need beyond Python packages, installed with apt when missing and allowed (CI runs as root on Debian):
#
# - libvirt's headers (libvirt-python builds against them), its clients (virsh, virt-xml-validate) and xmllint, so
#   the libvirt VM runtime is tested against real libvirt;
# - QEMU, libvirt's QEMU driver, dnsmasq and mmdebstrap, so the `real_vm` tests boot real guests: the daemons
#   (virtlogd, libvirtd) are started here when they are not running, as there is no init system to start them;
# - Debian's chromium, the browser that opens the allocation's page in the Temporal UI (driven by Playwright, which
#   never downloads a browser of its own here).
#
# Otherwise it says, in one loud line each, which tests will be skipped and what to install. Never fails the run:
# `pip install -e '.[dev]' && berth demo` needs none of this.
set -uo pipefail

PACKAGES=(libvirt-dev libvirt-clients libxml2-utils pkg-config gcc)
VM_PACKAGES=(qemu-system-x86 qemu-utils libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-system dnsmasq-base
    iptables mmdebstrap e2fsprogs openssh-client)
BROWSER=(chromium)

have_all() {
    pkg-config --exists libvirt 2>/dev/null && command -v virt-xml-validate >/dev/null && command -v xmllint >/dev/null \
        && command -v gcc >/dev/null
}

have_vm_tools() {
    command -v qemu-system-x86_64 >/dev/null && command -v qemu-img >/dev/null && command -v libvirtd >/dev/null \
        && command -v virtlogd >/dev/null && command -v dnsmasq >/dev/null && command -v mmdebstrap >/dev/null \
        && command -v ssh >/dev/null && command -v iptables >/dev/null \
        && [ -e /usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so ]
}

virtlogd_running() {
    local pid
    pid=$(cat /run/virtlogd.pid 2>/dev/null) && [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = virtlogd ]
}

have_browser() {
    command -v chromium >/dev/null
}

missing=()
have_all || missing+=("${PACKAGES[@]}")
have_vm_tools || missing+=("${VM_PACKAGES[@]}")
have_browser || missing+=("${BROWSER[@]}")
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} for the libvirt, real-VM and browser tests ..."
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"; } >/dev/null 2>&1 || true
fi

if have_all; then
    python -c "import libvirt" 2>/dev/null || pip install -q 'libvirt-python>=9.0' \
        || echo "LOUD: libvirt-python did not build: the libvirt VM runtime tests will be SKIPPED"
else
    echo "LOUD: ${PACKAGES[*]} are not installed (and could not be): the libvirt VM runtime tests will be SKIPPED"
fi

# The daemons of libvirt's QEMU driver, started by hand where no init system runs them (a container, CI). Only as
# root, and only when not already running: a machine whose libvirtd is managed is left as it is.
if have_vm_tools && [ "$(id -u)" = 0 ]; then
    # udev's rule gives /dev/kvm to the kvm group; without udev it stays root's alone, and libvirt, which checks
    # it as QEMU's user, then throws away its cached QEMU capabilities and probes QEMU again at every define (90 s).
    if [ -e /dev/kvm ] && getent group kvm >/dev/null; then
        chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
    fi
    if ! virsh -c qemu:///system version >/dev/null 2>&1; then
        # A socket file proves nothing: /run can outlive the daemons (a machine restored from a snapshot keeps
        # /run/libvirt/virtlogd-sock with no one listening, and every guest start then fails on it). The pid file's
        # process, checked by name, is what says virtlogd runs.
        if ! virtlogd_running; then
            rm -f /run/libvirt/virtlogd-sock /run/libvirt/virtlogd-admin-sock
            virtlogd --daemon
            for _ in $(seq 50); do
                [ -S /run/libvirt/virtlogd-sock ] && break
                sleep 0.1
            done
        fi
        libvirtd --daemon >/dev/null 2>&1
        for _ in $(seq 50); do
            virsh -c qemu:///system version >/dev/null 2>&1 && break
            sleep 0.2
        done
        # Ours to restart: the real_vm test that restarts libvirtd under a running guest does so only then.
        cp /run/libvirtd.pid /run/berth-test-libvirtd.pid 2>/dev/null || true
    fi
    virsh -c qemu:///system version >/dev/null 2>&1 \
        || echo "LOUD: libvirtd did not start: the real_vm tests will be SKIPPED (see libvirtd's own log)"
elif ! have_vm_tools; then
    echo "LOUD: ${VM_PACKAGES[*]} are not installed (and could not be): the real_vm tests will be SKIPPED"
fi

have_browser || echo "LOUD: chromium is not installed (and could not be): the Temporal UI browser test will be SKIPPED"
exit 0
