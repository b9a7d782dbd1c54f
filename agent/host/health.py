"""What the host can see of each approved slot's devices: read from sysfs every report interval, whether
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
fault. The NVMe controller is the PCI function discovery found behind the slot's namespace; its SMART / Health log's
critical-warning byte comes from `nvme smart-log <namespace> -o json` (nvme-cli), at most once a minute
(`SmartLog`). Where the host's NVIDIA driver holds a GPU, NVML's reading of it is added (agent/host/nvml_health.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable

from agent.host.rootfs import HostRoot
from agent.host.wipe import HostRunner
from contracts.pci import normalise_pci
from fleet.node import Slot
from scheduler.host.health import DriverSignals, PcieSignals, SlotSignals
from scheduler.host.inventory import HostInventory

SMART_SECONDS = 60.0  # a SMART log read is an admin command to the controller: once a minute is plenty

_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")
_TOTALS = {
    "aer_dev_fatal": "TOTAL_ERR_FATAL",
    "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL",
    "aer_dev_correctable": "TOTAL_ERR_COR",
}


def read_signals(
    host: HostRoot,
    slots: Iterable[Slot],
    inventory: HostInventory,
    smart: SmartLog | None = None,
    nvml: dict[str, DriverSignals] | None = None,
) -> list[SlotSignals]:
    """This interval's signals of every approved slot: sysfs, and the NVMe SMART log and NVML where given."""
    controllers = {n.name: n.controller_pci for n in inventory.nvme}
    nvml = nvml or {}
    found = []
    for slot in slots:
        if not slot.approved:
            continue
        namespace = None
        if slot.nvme_device is not None:
            namespace = next((n for n in inventory.nvme if n.known_as(slot.nvme_device)), None)
        nvme_pci = controllers.get(namespace.name) if namespace is not None else None
        found.append(
            SlotSignals(
                index=slot.index,
                gpu=pcie(host, slot.gpu_pci),
                fabric=pcie(host, slot.fabric_vf_pci) if slot.fabric_vf_pci else None,
                nvme=pcie(host, nvme_pci) if nvme_pci else None,
                nvme_critical_warning=smart.critical_warning(namespace.device_path) if smart and namespace else None,
                nvml=nvml.get(normalise_pci(slot.gpu_pci)),
            )
        )
    return found


class SmartLog:
    """Each NVMe's SMART / Health critical-warning byte (NVM Express Base Specification, log page 02h, byte 0), read
    with `nvme smart-log <device> -o json` at most every `interval` seconds; a failed read is no signal."""

    def __init__(
        self, runner: HostRunner, interval: float = SMART_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.runner, self.interval, self.clock = runner, interval, clock
        self._read: dict[str, tuple[float, int | None]] = {}

    def critical_warning(self, device: str) -> int | None:
        now = self.clock()
        last = self._read.get(device)
        if last is not None and now - last[0] < self.interval:
            return last[1]
        ran = self.runner.run(["nvme", "smart-log", device, "-o", "json"], timeout=10)
        value = _critical_warning(ran.stdout) if ran.exit_code == 0 else None
        self._read[device] = (now, value)
        return value


def _critical_warning(text: str) -> int | None:
    """nvme-cli prints `"critical_warning": 0`; some versions an object whose `value` is the byte."""
    try:
        field = json.loads(text).get("critical_warning")
    except (ValueError, AttributeError):
        return None
    if isinstance(field, dict):
        field = field.get("value")
    return field if isinstance(field, int) and not isinstance(field, bool) and 0 <= field <= 255 else None


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
