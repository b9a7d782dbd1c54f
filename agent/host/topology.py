"""The real `TopologyDriver`: the host this agent runs on, discovered from sysfs (and NVML, where the host driver
still holds a GPU). `root` is `/` on a host; tests point it at a fixture tree shaped like `/sys`."""

from __future__ import annotations

from pathlib import Path

from agent.host.gpu_details import GpuDetails, NvmlDetails
from agent.host.health import read_signals
from agent.host.rootfs import HostRoot
from agent.host.sysfs import discover_host
from fleet.node import Slot
from scheduler.host.health import SlotSignals
from scheduler.host.inventory import HostInventory


class HostTopology:
    def __init__(self, root: Path = Path("/"), gpu_details: GpuDetails | None = None) -> None:
        root = Path(root)
        self.root = root
        # NVML describes the machine it runs on: ask it only when `root` is that machine.
        self.gpu_details = gpu_details if gpu_details is not None else (NvmlDetails() if root == Path("/") else None)

    def discover(self) -> HostInventory:
        return discover_host(self.root, gpu_details=self.gpu_details)

    def signals(self, slots: list[Slot], host: HostInventory) -> list[SlotSignals]:
        return read_signals(HostRoot(self.root), slots, host)
