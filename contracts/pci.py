"""PCI addresses as Berth writes them: `dddd:bb:dd.f`, lower case, 4-digit domain (sysfs and libvirt style).

A GPU is named by its address in a request that pins it, in a host's inventory and in a VM's plan, and nvidia-smi
writes the same address with an 8-digit domain and capitals: every side normalises with the one function here, so
the addresses compare equal wherever they came from.
"""

from __future__ import annotations

import re

_PCI = re.compile(r"^(?:[0-9a-fA-F]{4}|[0-9a-fA-F]{8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def normalise_pci(address: str) -> str:
    """`00000000:3C:00.0` (nvidia-smi) or `0000:3c:00.0` (sysfs) -> `0000:3c:00.0`. Raises ValueError otherwise."""
    value = address.strip()
    if not _PCI.match(value):
        raise ValueError(f"{address!r} is not a PCI address")
    domain, rest = value.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"
