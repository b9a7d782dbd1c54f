"""What the host can see of each approved slot's devices (issue 27): read from sysfs every report interval, whether
the slot is in use or not, with no vendor driver (a slice's GPU is bound to vfio-pci: the host's NVIDIA driver cannot
see it). Judged by `scheduler.host.health.assess`.

    /sys/bus/pci/devices/<addr>                 present at its address (a GPU that fell off the bus is not)
      driver@                                   the bound driver
      aer_dev_fatal, aer_dev_nonfatal,          lines "<error> <count>", the last "TOTAL_ERR_FATAL <n>",
      aer_dev_correctable                       "TOTAL_ERR_NONFATAL <n>", "TOTAL_ERR_COR <n>" (Linux,
                                                Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats)
      current_link_speed, max_link_speed        "32.0 GT/s PCIe" (Linux, sysfs-bus-pci); "Unknown" when not trained
      current_link_width, max_link_width        "16"

A file that is absent (AER not enabled, a function without a link of its own) reads as None: no signal, never a
fault. The NVMe controller is the PCI function discovery found behind the slot's namespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from agent.host.rootfs import HostRoot
from fleet.node import Slot
from scheduler.host.health import PcieSignals, SlotSignals
from scheduler.host.inventory import HostInventory

_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")
_TOTALS = {"aer_dev_fatal": "TOTAL_ERR_FATAL", "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL",
           "aer_dev_correctable": "TOTAL_ERR_COR"}  # fmt: skip


def read_signals(host: HostRoot, slots: Iterable[Slot], inventory: HostInventory) -> list[SlotSignals]:
    """This interval's signals of every approved slot."""
    controllers = {n.name: n.controller_pci for n in inventory.nvme}
    found = []
    for slot in slots:
        if not slot.approved:
            continue
        nvme_pci = None
        if slot.nvme_device is not None:
            namespace = next((n for n in inventory.nvme if n.known_as(slot.nvme_device)), None)
            nvme_pci = controllers.get(namespace.name) if namespace is not None else None
        found.append(
            SlotSignals(
                index=slot.index,
                gpu=pcie(host, slot.gpu_pci),
                fabric=pcie(host, slot.fabric_vf_pci) if slot.fabric_vf_pci else None,
                nvme=pcie(host, nvme_pci) if nvme_pci else None,
            )
        )
    return found


def pcie(host: HostRoot, address: str) -> PcieSignals:
    base = f"/sys/bus/pci/devices/{address}"
    if not _exists(host, base):
        return PcieSignals(address=address, present=False)
    counts = {name: _aer_total(host, f"{base}/{name}", total) for name, total in _TOTALS.items()}
    return PcieSignals(
        address=address,
        present=True,
        driver=_driver(host, f"{base}/driver"),
        aer_fatal=counts["aer_dev_fatal"],
        aer_nonfatal=counts["aer_dev_nonfatal"],
        aer_correctable=counts["aer_dev_correctable"],
        link_speed=_speed(_read(host, f"{base}/current_link_speed")),
        max_link_speed=_speed(_read(host, f"{base}/max_link_speed")),
        link_width=_int(_read(host, f"{base}/current_link_width")),
        max_link_width=_int(_read(host, f"{base}/max_link_width")),
    )


def _exists(host: HostRoot, path: str) -> bool:
    try:
        host.real(path)
        return True
    except OSError:
        return False


def _read(host: HostRoot, path: str) -> str | None:
    try:
        return host.read_text(path).strip()
    except (OSError, ValueError):
        return None


def _driver(host: HostRoot, path: str) -> str | None:
    try:
        return host.real(path).rstrip("/").rsplit("/", 1)[-1] if host.readlink(path) is not None else None
    except OSError:
        return None


def _aer_total(host: HostRoot, path: str, total: str) -> int | None:
    text = _read(host, path)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, count = line.strip().partition(" ")
        if name == total:
            return _int(count)
    return None


def _speed(text: str | None) -> float | None:
    match = _SPEED.match(text or "")
    return float(match.group(1)) if match else None


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None
