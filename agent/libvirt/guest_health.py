"""The guest checks of a libvirt host's VMs: `nvidia-smi -q` and `dmesg` in each ready guest, through
the QEMU guest agent, at a modest interval (`GUEST_CHECK_SECONDS`); parsed and judged by agent/guest_health.py. Each
command is started once and polled on later looks, as the readiness gates do, so a look never blocks. A guest agent
that does not answer, an image without `nvidia-smi`, a command that never finishes: every GPU of the VM is "not
answered" (unknown, never healthy).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.guest_health import KERNEL_LOG, NVIDIA_SMI_Q, guest_signals
from agent.libvirt.guest import GuestAgent, GuestAgentError, poll, start
from scheduler.host.health import DriverSignals

GUEST_CHECK_SECONDS = 60.0  # a look inside costs the guest two short processes; the host-side checks run every 5 s


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
