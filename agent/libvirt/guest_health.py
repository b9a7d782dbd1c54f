"""The guest's view of its GPUs (issue 27), read through the QEMU guest agent while a slice is active, at a modest
interval (`GUEST_CHECK_SECONDS`): a passed-through GPU is invisible to the host's NVIDIA driver, but not to the
guest's.

    nvidia-smi -q     per GPU ("GPU 00000000:06:00.0"), the health fields of its query report: ECC Errors >
                      Volatile (`DRAM Uncorrectable`, or `Double Bit` > `Total` before Ampere), Remapped Rows
                      (`Pending`, `Remapping Failure Occurred`), Retired Pages (`Pending Page Blacklist`); or "GPU
                      is lost" when the driver lost one (exit code 15)
    dmesg             the kernel's Xid lines, "NVRM: Xid (PCI:0000:06:00): 79, pid=..., GPU has fallen off the bus."
                      (NVIDIA, "Xid Errors"): all of them since the guest booted, which is this allocation's life

The guest's GPUs in PCI order are the plan's bundles in order: the domain pins bundle i's GPU on root port 2i+1
(agent/libvirt/domain.py), so the guest's firmware enumerates them in plan order. Each command is started once and
polled on later looks, as the readiness gates do, so a look never blocks. A guest agent that does not answer, an
image without `nvidia-smi`, a command that never finishes: every GPU of the VM is "not answered" (unknown, never
healthy).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.libvirt.guest import Exited, GuestAgent, GuestAgentError, poll, start
from scheduler.host.health import DriverSignals

GUEST_CHECK_SECONDS = 60.0  # a look inside costs the guest two short processes; the host-side checks run every 5 s
NVIDIA_SMI_Q = ["nvidia-smi", "-q"]
KERNEL_LOG = ["dmesg"]

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\s*$")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?\): (\d+)")
_LOST = re.compile(r"GPU is lost", re.IGNORECASE)


@dataclass(frozen=True)
class _Gpu:
    bus: tuple[int, int, int]  # (domain, bus, device)
    fields: dict[str, str]  # "Section > Sub > Key" -> value


def parse_nvidia_smi_q(text: str) -> list[_Gpu]:
    """Every GPU section of `nvidia-smi -q`, its keys flattened by their indentation ("Remapped Rows > Pending")."""
    gpus: list[_Gpu] = []
    path: list[tuple[int, str]] = []
    for line in text.splitlines():
        header = _GPU_HEADER.match(line)
        if header:
            domain, bus, device, _ = (int(part, 16) for part in header.groups())
            gpus.append(_Gpu((domain, bus, device), {}))
            path = []
            continue
        if not gpus or not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, colon, value = line.strip().partition(":")
        while path and path[-1][0] >= indent:
            path.pop()
        if colon and value.strip():
            gpus[-1].fields[" > ".join([*(name for _, name in path), key.strip()])] = value.strip()
        else:
            path.append((indent, key.strip()))
    return sorted(gpus, key=lambda gpu: gpu.bus)


def parse_xids(kernel_log: str) -> dict[tuple[int, int, int], list[int]]:
    """The Xids of each GPU (domain, bus, device) in the kernel's log, in order."""
    found: dict[tuple[int, int, int], list[int]] = {}
    for match in _XID.finditer(kernel_log):
        domain, bus, device = (int(part, 16) for part in match.groups()[:3])
        found.setdefault((domain, bus, device), []).append(int(match.group(4)))
    return found


def guest_signals(nvidia_smi: Exited, kernel_log: Exited | None, gpus: int) -> list[DriverSignals]:
    """One reading per GPU of the plan, in plan order, from the two commands' outcomes."""
    xids = parse_xids(kernel_log.stdout) if kernel_log is not None and kernel_log.exit_code == 0 else {}
    if nvidia_smi.exit_code != 0:
        said = (nvidia_smi.stderr or nvidia_smi.stdout).strip()
        if _LOST.search(said):
            all_xids = sorted({x for seen in xids.values() for x in seen})
            return [DriverSignals(answered=True, lost=True, xids=all_xids) for _ in range(gpus)]
        detail = said.splitlines()[-1][:200] if said else f"exit {nvidia_smi.exit_code}"
        return [DriverSignals(answered=False, detail=f"nvidia-smi -q failed: {detail}") for _ in range(gpus)]
    seen = parse_nvidia_smi_q(nvidia_smi.stdout)
    readings = []
    for position in range(gpus):
        if position >= len(seen):
            readings.append(DriverSignals(answered=False, detail=f"nvidia-smi -q lists {len(seen)} of {gpus} GPUs"))
            continue
        gpu = seen[position]
        readings.append(
            DriverSignals(
                answered=True,
                xids=sorted(set(xids.get(gpu.bus, []))),
                ecc_uncorrectable=_count(
                    gpu, "ECC Errors > Volatile > DRAM Uncorrectable", "ECC Errors > Volatile > Double Bit > Total"
                ),  # fmt: skip
                remap_pending=_yes(gpu, "Remapped Rows > Pending"),
                remap_failed=_yes(gpu, "Remapped Rows > Remapping Failure Occurred"),
                retirement_pending=_yes(
                    gpu, "Retired Pages > Pending Page Blacklist", "Retired Pages > Pending Page Retirement"
                ),  # fmt: skip
            )
        )
    return readings


def _value(gpu: _Gpu, *keys: str) -> str | None:
    return next((gpu.fields[key] for key in keys if key in gpu.fields), None)


def _yes(gpu: _Gpu, *keys: str) -> bool | None:
    value = _value(gpu, *keys)
    return None if value is None or value == "N/A" else value.lower() == "yes"


def _count(gpu: _Gpu, *keys: str) -> int | None:
    value = _value(gpu, *keys)
    return int(value) if value is not None and value.isdigit() else None


@dataclass
class GuestHealthWatch:
    """The guest checks of one agent's VMs: which commands run in which domain, and each domain's last reading."""

    agent: GuestAgent
    interval: float = GUEST_CHECK_SECONDS
    clock: Callable[[], float] = time.monotonic
    _started: dict[str, tuple[float, int, int | None]] = field(default_factory=dict)  # domain -> (at, pids)
    _last: dict[str, list[DriverSignals]] = field(default_factory=dict)
    _at: dict[str, float] = field(default_factory=dict)  # when each domain's last reading was taken

    def look(self, domain: str, gpus: int) -> list[DriverSignals]:
        """The domain's latest reading per GPU (plan order); empty until its first check has finished."""
        now = self.clock()
        started = self._started.get(domain)
        try:
            if started is None:
                if now - self._last_at(domain) >= self.interval:
                    self._started[domain] = (now, start(self.agent, domain, NVIDIA_SMI_Q), self._kernel(domain))
                return self._last.get(domain, [])
            at, smi_pid, log_pid = started
            smi = poll(self.agent, domain, smi_pid)
            log = poll(self.agent, domain, log_pid) if log_pid is not None else None
        except (GuestAgentError, KeyError, ValueError) as error:
            self._started.pop(domain, None)
            return self._keep(domain, now, [DriverSignals(answered=False, detail=_short(error)) for _ in range(gpus)])
        if smi is None or (log_pid is not None and log is None):
            if now - at < self.interval:
                return self._last.get(domain, [])
            self._started.pop(domain, None)
            late = f"nvidia-smi -q did not finish within {self.interval:g}s"
            return self._keep(domain, now, [DriverSignals(answered=False, detail=late) for _ in range(gpus)])
        self._started.pop(domain, None)
        return self._keep(domain, now, guest_signals(smi, log, gpus))

    def forget(self, domain: str) -> None:
        self._started.pop(domain, None)
        self._last.pop(domain, None)
        self._at.pop(domain, None)

    def _kernel(self, domain: str) -> int | None:
        try:
            return start(self.agent, domain, KERNEL_LOG)
        except (GuestAgentError, KeyError, ValueError):
            return None  # no kernel log: nvidia-smi's fields still count

    def _last_at(self, domain: str) -> float:
        return self._at.get(domain, float("-inf"))

    def _keep(self, domain: str, now: float, readings: list[DriverSignals]) -> list[DriverSignals]:
        self._last[domain], self._at[domain] = readings, now
        return readings


def _short(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:200]
