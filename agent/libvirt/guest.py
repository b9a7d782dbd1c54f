"""Commands inside a VM through its QEMU guest agent (the `org.qemu.guest_agent.0` channel every domain has).

`guest-exec` starts a process and returns its pid; `guest-exec-status` answers only once the process has exited,
with its exit code and base64 output (capped at 16 MiB by QEMU). The readiness gates start a command once and poll it
across probes, so a gate never blocks an activity for longer than one probe.

The real agent is reached through libvirt (`libvirt_qemu.qemuAgentCommand`); libvirt's test driver has no guest
agent, so tests answer with `RecordedGuestAgent`, which follows the documented replies.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.guest_health import Exited


class GuestAgentError(RuntimeError):
    """The guest agent did not answer (not running yet, blocked by the image, or the VM is gone)."""


class GuestAgent(Protocol):
    def command(self, domain: str, request: dict[str, Any], timeout_seconds: int = 5) -> dict[str, Any]:
        """Send one guest-agent command to the named domain; the reply's `return` value."""
        ...


def start(agent: GuestAgent, domain: str, argv: list[str]) -> int:
    reply = agent.command(
        domain, {"execute": "guest-exec", "arguments": {"path": argv[0], "arg": argv[1:], "capture-output": True}}
    )
    return int(reply["pid"])


def poll(agent: GuestAgent, domain: str, pid: int) -> Exited | None:
    """The process's outcome once it has exited; None while it runs."""
    status = agent.command(domain, {"execute": "guest-exec-status", "arguments": {"pid": pid}})
    if not status.get("exited"):
        return None
    return Exited(
        exit_code=int(status.get("exitcode", -1)),
        stdout=_decode(status.get("out-data")),
        stderr=_decode(status.get("err-data")),
    )


def _decode(data: str | None) -> str:
    return base64.b64decode(data).decode("utf-8", "replace") if data else ""


class LibvirtGuestAgent:
    """The real thing: the guest agent of a domain on the agent's libvirt connection."""

    def __init__(self, connection: Callable[[], Any]) -> None:
        self.connection = connection  # the driver's, reopened after a libvirtd restart

    def command(self, domain: str, request: dict[str, Any], timeout_seconds: int = 5) -> dict[str, Any]:
        import libvirt
        import libvirt_qemu

        try:
            handle = self.connection().lookupByName(domain)
            reply = libvirt_qemu.qemuAgentCommand(handle, json.dumps(request), timeout_seconds, 0)
        except (libvirt.libvirtError, RuntimeError) as error:  # RuntimeError: the driver's reconnect failed
            raise GuestAgentError(str(error)) from error
        return json.loads(reply).get("return", {})


@dataclass
class Recorded:
    """A recorded outcome of one command, as `guest-exec-status` reports it once the process exited."""

    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    polls_before_exit: int = 0  # how many status polls answer `exited: false` first


@dataclass
class RecordedGuestAgent:
    """Answers `guest-exec` / `guest-exec-status` from recorded outcomes keyed by the command line, for libvirt's
    test driver (no guest agent). `reachable=False` plays an agent not running yet. Follows QEMU's documented
    replies: a pid, then `exited: false` until the process ends, then the exit code and base64 output."""

    outcomes: dict[str, Recorded] = field(default_factory=dict)
    reachable: bool = True
    started: list[tuple[str, str]] = field(default_factory=list)  # (domain, command line), for tests
    _running: dict[int, tuple[Recorded, int]] = field(default_factory=dict)

    def command(self, domain: str, request: dict[str, Any], timeout_seconds: int = 5) -> dict[str, Any]:
        if not self.reachable:
            raise GuestAgentError("Guest agent is not responding: QEMU guest agent is not connected")
        arguments = request.get("arguments", {})
        if request["execute"] == "guest-exec":
            line = " ".join([arguments["path"], *arguments.get("arg", [])])
            outcome = self.outcomes.get(line, Recorded(exit_code=127, stderr=f"{arguments['path']}: not found"))
            pid = 1000 + len(self.started)
            self.started.append((domain, line))
            self._running[pid] = (outcome, outcome.polls_before_exit)
            return {"pid": pid}
        if request["execute"] == "guest-exec-status":
            outcome, left = self._running[arguments["pid"]]
            if left > 0:
                self._running[arguments["pid"]] = (outcome, left - 1)
                return {"exited": False}
            reply: dict[str, Any] = {"exited": True, "exitcode": outcome.exit_code}
            if outcome.stdout:
                reply["out-data"] = base64.b64encode(outcome.stdout.encode()).decode()
            if outcome.stderr:
                reply["err-data"] = base64.b64encode(outcome.stderr.encode()).decode()
            return reply
        raise GuestAgentError(f"unsupported guest-agent command {request['execute']!r}")
