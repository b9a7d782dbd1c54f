"""What the libvirt tests need, and what happens when it is missing.

`scripts/test-prerequisites.sh` (the first step of the README's test command) installs libvirt's Debian packages
when the machine allows it: as root with apt, as CI runs. There, a missing piece is a failure, not a skip: the real
driver must be tested. Only where installing is impossible (not root, not Debian) do the tests skip, in one loud line
naming the packages.
"""

from __future__ import annotations

import os
import shutil
from types import ModuleType

import pytest

PACKAGES = "libvirt-dev libvirt-clients libxml2-utils"


def _missing(what: str) -> None:
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        pytest.fail(
            f"{what} is missing although this machine can install {PACKAGES} (root, apt): run the README's test "
            "command, whose first step scripts/test-prerequisites.sh installs them",
            pytrace=False,
        )
    pytest.skip(
        f"LOUD: {what} is missing and this machine cannot install {PACKAGES} (not root or no apt): "
        "the libvirt tests did NOT run",
        allow_module_level=True,
    )


def libvirt_module() -> ModuleType:
    """libvirt-python (call at module level)."""
    try:
        import libvirt
    except ImportError:
        _missing("libvirt-python")
        raise
    return libvirt


def tools(*names: str) -> None:
    """Command-line tools a test runs (call inside the test)."""
    absent = [name for name in names if shutil.which(name) is None]
    if absent:
        _missing(", ".join(absent))
