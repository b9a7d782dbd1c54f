"""The real `TopologyDriver`: the host this agent runs on, discovered from sysfs (and NVML, where the host driver
still holds a GPU). `root` is `/` on a host; tests point it at a fixture tree shaped like `/sys`."""

from __future__ import annotations

from pathlib import Path

from agent.host.gpu_details import GpuDetails, NvmlDetails
from agent.host.health import SmartLog, read_signals
from agent.host.nvml_health import NvmlHealth, PynvmlHealth
from agent.host.rootfs import HostRoot
from agent.host.sysfs import discover_host
from agent.host.wipe import HostRunner, SubprocessRunner
from fleet.node import Slot
from scheduler.host.health import SlotSignals
from scheduler.host.inventory import HostInventory


class HostTopology:
    def __init__(
        self,
        root: Path = Path("/"),
        gpu_details: GpuDetails | None = None,
        runner: HostRunner | None = None,
        nvml: NvmlHealth | None = None,
    ) -> None:
        root = Path(root)
        self.root = root
        # NVML and nvme-cli describe the machine they run on: ask them only when `root` is that machine.
        here = root == Path("/")
        self.gpu_details = gpu_details if gpu_details is not None else (NvmlDetails() if here else None)
        runner = runner if runner is not None else (SubprocessRunner() if here else None)
        self.smart = SmartLog(runner) if runner is not None else None
        self.nvml = nvml if nvml is not None else (PynvmlHealth() if here else None)

    def discover(self) -> HostInventory:
        return discover_host(self.root, gpu_details=self.gpu_details)

    def signals(self, slots: list[Slot], host: HostInventory) -> list[SlotSignals]:
        nvml = self.nvml.read() if self.nvml is not None else None
        return read_signals(HostRoot(self.root), slots, host, self.smart, nvml)
