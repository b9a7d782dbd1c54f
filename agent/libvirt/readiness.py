"""The readiness gates of a VM, each by name (docs/seeds.md, "Readiness gates"):

    ssh         a TCP connection to the VM's address on port 22
    cloud_init  `cloud-init status --long` in the guest, asked again at each probe once the last answer came:
                `not run` or `running` waits; 0 done; 2 done with recoverable errors (passes, logged); 1 failed,
                with cloud-init's own words from its `detail` and `errors` (the gate fails: waiting longer will not
                help); `disabled` fails (the image would never read the seed)
    gpus        `nvidia-smi -L` in the guest, once cloud-init is done: exactly the plan's GPU count (a different
                count fails the gate; a non-zero exit, a driver still loading, is retried until the timeout)

A probe never blocks: a guest command is started once and polled on later probes (`Gates` remembers its pid).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from agent.libvirt.guest import GuestAgent, GuestAgentError, poll, start

log = logging.getLogger("berth.agent")

# Not `--wait`: a probe asks and gets its answer; a `--wait` started early in a slow boot was seen never to return.
CLOUD_INIT = ["cloud-init", "status", "--long"]
NVIDIA_SMI = ["nvidia-smi", "-L"]


_STATUS_FIELDS = ("status", "extended_status", "boot_status_code", "last_update", "time", "detail", "errors")
_STATUS_FIELDS += ("recoverable_errors",)


def cloud_init_status(output: str) -> str | None:
    """The `status:` of `cloud-init status` (`running`, `done`, `error`, ...), None when it printed none."""
    for line in output.splitlines():
        key, colon, rest = line.lstrip(".").partition(":")
        if colon and key == "status":
            return rest.strip()
    return None


def cloud_init_says(output: str) -> str:
    """What `cloud-init status --long` says, on one line: its status, then what went wrong in its own words.

    cloud-init 22.4 (Debian 12) names the failing module under `detail:`; 23.4 on list them under `errors:` (and a
    degraded `done`'s warnings under `recoverable_errors:`, by level), keeping `detail:` for the datasource; 24.4 on
    print `--wait`'s dots on the status line itself (`....status: error`). A field runs until the next of
    `status --long`'s own field names at the start of a line, so an error's text is never cut at a colon in it."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    level = ""  # recoverable errors come grouped under their level (`WARNING:`)
    for raw in output.splitlines():
        line = raw.rstrip()
        head = line.lstrip(".")
        key, colon, rest = head.partition(":")
        if colon and key in _STATUS_FIELDS and not raw[:1].isspace():
            current, level = key, ""
            sections[current] = [rest.strip()] if rest.strip() and rest.strip() not in ("[]", "{}") else []
        elif current is not None and line.strip():
            item = line.strip()
            if item.endswith(":") and item[:-1].isupper():
                level = item[:-1]
                continue
            item = item[2:] if item.startswith("- ") else item
            sections[current].append(f"{level}: {item}" if level else item)
    status = " ".join(sections.get("status", [])) or None
    if status is None and not sections:
        lines = [line for line in output.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""
    said = sections.get("errors") or (sections.get("detail") if status == "error" else None) or []
    if status and status.startswith("done"):
        said = [*said, *sections.get("recoverable_errors", [])]
    return "; ".join([f"status: {status}" if status else "", *said]).strip("; ")


class GateState(StrEnum):
    PASSED = "passed"
    PENDING = "pending"
    FAILED = "failed"


@dataclass(frozen=True)
class GateResult:
    name: str
    state: GateState
    message: str = ""


def _forgot_pid(error: GuestAgentError) -> bool:
    """The guest agent's answer to `guest-exec-status` of a pid it does not know (QEMU: "Invalid parameter 'pid'")."""
    text = str(error).lower()
    return "invalid parameter" in text and "pid" in text


def probe_ssh(address: str | None, port: int = 22, timeout: float = 1.0) -> GateResult:
    if address is None:
        return GateResult("ssh", GateState.PENDING, "the VM has no address to reach")
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return GateResult("ssh", GateState.PASSED, f"{address}:{port} accepts connections")
    except OSError as error:
        return GateResult("ssh", GateState.PENDING, f"{address}:{port}: {error.strerror or error}")


@dataclass
class Gates:
    """Probe state for the VMs of one agent: which guest commands are running, by (domain, gate)."""

    agent: GuestAgent
    ssh_port: int = 22
    skip_gpus: bool = False  # a host whose GPUs are bookkeeping only: nothing to look for inside
    # A command the guest agent still calls running after this long is given up and asked again: QEMU's agent was
    # seen to report a `cloud-init status` as running for ever after the process had gone (its output pipes never
    # closed), and the gate must not wait out the whole readiness timeout on one lost answer.
    command_seconds: float = 90.0
    # SSH is knocked on at most this often while it is not up, and not again once it was: every connection makes
    # the guest's sshd fork, and a probe every quarter second kept a software-emulated guest so busy that its own
    # `cloud-init status` never finished.
    ssh_every: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _pids: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)  # (domain, gate) -> (pid, since)
    _ssh: dict[str, tuple[float, GateResult]] = field(default_factory=dict)  # domain -> (when, last answer)

    def probe(self, domain: str, address: str | None, gpu_count: int, no_address: str = "") -> list[GateResult]:
        """`no_address`: why there is no address yet, for the `ssh` gate's message."""
        ssh = self._ssh_gate(domain, address, no_address)
        cloud_init = self._cloud_init(domain)
        if self.skip_gpus:
            gpus = GateResult("gpus", GateState.PASSED, "skipped: this host passes no GPU through (bookkeeping only)")
        elif cloud_init.state is GateState.PASSED:
            gpus = self._gpus(domain, gpu_count)
        else:
            gpus = GateResult("gpus", GateState.PENDING, "waits for cloud-init")
        return [ssh, cloud_init, gpus]

    def _ssh_gate(self, domain: str, address: str | None, no_address: str) -> GateResult:
        if address is None:
            return GateResult("ssh", GateState.PENDING, no_address or "the VM has no address to reach")
        now = self.clock()
        last = self._ssh.get(domain)
        if last is not None and (last[1].state is GateState.PASSED or now - last[0] < self.ssh_every):
            return last[1]
        result = probe_ssh(address, self.ssh_port)
        self._ssh[domain] = (now, result)
        return result

    def forget(self, domain: str) -> None:
        for key in [key for key in self._pids if key[0] == domain]:
            del self._pids[key]
        self._ssh.pop(domain, None)

    def _run(self, domain: str, gate: str, argv: list[str]) -> tuple[int, str] | GateResult:
        """(exit code, output) once the command exited; a PENDING result while it runs or the agent is away.

        A command once started is polled until it exits, never started again while it may still run: a guest agent
        that is slow to answer (a loaded guest, software emulation) would otherwise get a second `cloud-init status`
        at every timeout, each slowing the guest further, until none ever finishes. Only a guest agent that no longer
        knows the pid (the guest rebooted, the agent restarted) makes it start afresh."""
        key, command = (domain, gate), " ".join(argv)
        try:
            if key not in self._pids:
                self._pids[key] = (start(self.agent, domain, argv), self.clock())
            pid, since = self._pids[key]
            exited = poll(self.agent, domain, pid)
        except GuestAgentError as error:
            if _forgot_pid(error):
                self._pids.pop(key, None)
            return GateResult(gate, GateState.PENDING, f"guest agent not answering: {error}")
        if exited is None:
            if self.clock() - since >= self.command_seconds:
                del self._pids[key]
                return GateResult(gate, GateState.PENDING, f"`{command}` gave no answer in {self.command_seconds:g}s")
            return GateResult(gate, GateState.PENDING, f"`{command}` still running")
        del self._pids[key]
        return exited.exit_code, (exited.stdout + "\n" + exited.stderr).strip()

    def _cloud_init(self, domain: str) -> GateResult:
        outcome = self._run(domain, "cloud_init", CLOUD_INIT)
        if isinstance(outcome, GateResult):
            return outcome
        code, output = outcome
        said = cloud_init_says(output)
        status = cloud_init_status(output)
        if code in (0, 2) and status in ("not run", "running"):
            return GateResult("cloud_init", GateState.PENDING, f"cloud-init is {status}")
        if code == 0 and status == "disabled":
            return GateResult("cloud_init", GateState.FAILED, "cloud-init is disabled in the image: no seed is read")
        if code == 0:
            return GateResult("cloud_init", GateState.PASSED, "done")
        if code == 2:
            log.warning("cloud-init in %s finished with recoverable errors: %s", domain, output)
            return GateResult("cloud_init", GateState.PASSED, f"done with recoverable errors: {said}")
        return GateResult("cloud_init", GateState.FAILED, said or f"cloud-init status exited {code}")

    def _gpus(self, domain: str, expected: int) -> GateResult:
        outcome = self._run(domain, "gpus", NVIDIA_SMI)
        if isinstance(outcome, GateResult):
            return outcome
        code, output = outcome
        if code != 0:
            return GateResult("gpus", GateState.PENDING, output.splitlines()[0] if output else f"exit {code}")
        seen = sum(1 for line in output.splitlines() if line.startswith("GPU "))
        if seen != expected:
            return GateResult("gpus", GateState.FAILED, f"nvidia-smi lists {seen} GPUs, the plan has {expected}")
        return GateResult("gpus", GateState.PASSED, f"nvidia-smi sees {seen} GPUs")
