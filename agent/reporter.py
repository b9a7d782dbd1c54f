"""The node agent's report loop: tell the control plane the agent is alive and what its host is, and learn the
node's approved slots in return.

    start ─► discover ─► report (whole host, every slot's health) ─► reply: approved slots? keep them
                 ▲                                                            │
                 └── every few seconds: rediscover and judge each slot's health (scheduler.host.health); the whole
                     host at once when its topology hash moved, the verdicts at once when one changed, a heartbeat
                     when the interval has passed, nothing otherwise

A report that fails (API down, network) is retried sooner than the interval and never stops the agent: its
activities keep serving whatever the control plane sends. The transport is a `ReportSink`; `HttpReportSink` posts
to the API with the node's own token (`POST /v1/nodes/<node>/report`), the only credential an agent holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Protocol

from agent.activities import NodeAgent
from scheduler.host.health import SlotHealth, SlotSignals, assess
from scheduler.host.inventory import HostInventory
from scheduler.host.report import AgentInfo, NodeReport, ReportReply

log = logging.getLogger("berth.agent")

CHECK_SECONDS = 5.0  # how often the agent looks for a changed host between reports
DEFAULT_INTERVAL_SECONDS = 60.0  # 10,000 agents: 167 reports a second (docs/benchmarks.md)
AGENT_VERSION = "berth-agent/0.1"


class ReportRefused(RuntimeError):
    """The control plane answered the report with an error that retrying will not fix (wrong node, bad token)."""


class ReportFailed(RuntimeError):
    """The control plane answered with an error worth retrying (it is restarting, overloaded)."""


class ReportSink(Protocol):
    async def send(self, node: str, report: NodeReport) -> ReportReply: ...


class HttpReportSink:
    """Reports through the HTTP API with a node-scoped bearer token.

    The standard library's client, on a thread: an agent posts one small report a minute, and httpx (with the
    command-line extras its package imports: click, rich, pygments) cost every host about 5 MB of resident memory
    for it. Proxies come from the environment as with any urllib client; certificates are
    loaded only for an https API."""

    def __init__(self, api_url: str, token: str, timeout: float = 10.0) -> None:
        self._api = api_url.rstrip("/")
        self.token = token  # replaced when the agent rereads a rotated token (agent/credential.py)
        self._timeout = timeout

    async def send(self, node: str, report: NodeReport) -> ReportReply:
        return await asyncio.to_thread(self._post, node, report.model_dump_json(exclude_none=True).encode())

    def _post(self, node: str, body: bytes) -> ReportReply:
        request = urllib.request.Request(
            f"{self._api}/v1/nodes/{urllib.parse.quote(node, safe='')}/report",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:  # noqa: S310 - the API's URL
                return ReportReply.model_validate_json(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", "replace")
            if error.code in (401, 403, 404, 422):
                raise ReportRefused(f"the control plane refused the report ({error.code}): {detail}") from None
            raise ReportFailed(f"the control plane answered {error.code}: {detail}") from None

    async def close(self) -> None:
        """Nothing held between reports: each is one request on a connection of its own."""


class NodeReporter:
    def __init__(self, agent: NodeAgent, sink: ReportSink, interval_seconds: float = DEFAULT_INTERVAL_SECONDS) -> None:
        self.agent = agent
        self.sink = sink
        self.interval = interval_seconds
        self._sent_topology: str | None = None  # the topology the control plane has from us
        self.last_reply: ReportReply | None = None
        self._signals: dict[int, SlotSignals] = {}  # each slot's last reading, to judge counters by their rise
        self._unsent: dict[int, SlotHealth] = {}  # the worst verdict per slot not yet delivered
        self.sent_health: list[SlotHealth] | None = None  # the verdicts the control plane has from us

    def judge_health(self, host: HostInventory) -> list[SlotHealth]:
        """Each approved slot's verdict now (`scheduler.host.health.assess`), kept at its worst until a report
        delivers it: a counter that rose between two looks is news once, and a failed report must not lose it."""
        signals = self.with_agent_signals(self.agent.topology.signals(self.agent.approved.slots, host))
        verdicts = []
        for now in signals:
            verdict = assess(now, self._signals.get(now.index))
            pending = self._unsent.get(now.index)
            if pending is not None and pending.state.rank > verdict.state.rank:
                verdict = pending.model_copy(update={"signals": verdict.signals})  # the worst verdict, today's values
            self._unsent[now.index] = verdict
            verdicts.append(verdict)
        self._signals = {s.index: _seen(s, self._signals.get(s.index)) for s in signals}
        return verdicts

    def with_agent_signals(self, signals: list[SlotSignals]) -> list[SlotSignals]:
        """Add what the agent itself saw to what the host shows: each active VM's guest (its driver's view of the
        GPU) and a GPU reset that failed at the slot's last wipe."""
        guest = self.agent.vms.guest_signals()
        resets = self.agent.reset_failures
        return [
            s.model_copy(update={"guest": guest.get(s.index), "wipe_failed": resets.get(s.index) or s.wipe_failed})
            if s.index in guest or s.index in resets
            else s
            for s in signals
        ]

    async def report_once(self, host: HostInventory | None = None) -> ReportReply:
        """One report: the whole host the first time and whenever it changed, the slots' health the first time and
        whenever a verdict changed, a heartbeat otherwise."""
        host = host or await asyncio.to_thread(self.agent.discover)
        health = await asyncio.to_thread(self.judge_health, host)
        topology = host.topology_hash()
        info = AgentInfo(version=AGENT_VERSION, interval_seconds=self.interval)
        changed = health if _verdicts(health) != _verdicts(self.sent_health) else None

        def report(with_host: bool) -> NodeReport:
            return NodeReport(
                agent=info,
                topology=topology,
                approved=self.agent.approved.hash,
                host=host if with_host else None,
                health=changed,
            )

        reply = await self.sink.send(self.agent.node, report(topology != self._sent_topology))
        if reply.send_host:
            reply = await self.sink.send(self.agent.node, report(True))
        self._sent_topology = topology
        if changed is not None:
            self.sent_health = changed
        self._unsent.clear()
        if reply.send_health:  # a slot was repaired: the control plane wants every verdict again
            self.sent_health = None
        if reply.slots is not None:
            self.agent.approved.replace(reply.slots, reply.approved)
            log.info("node %s: %d approved slots (approval %s)", self.agent.node, len(reply.slots), reply.approved)
        self.last_reply = reply
        return reply

    def _health_moved(self, host: HostInventory) -> bool:
        """Whether a slot's verdict differs from the one the control plane has: judged now, reported at once."""
        return _verdicts(self.judge_health(host)) != _verdicts(self.sent_health)

    async def run(self) -> None:
        """Report until cancelled: a changed host at once (discovery is cheap: a few milliseconds), a heartbeat
        every interval. Failures are logged and retried within a few seconds, never fatal."""
        check_every = min(self.interval, CHECK_SECONDS)
        reported_at = float("-inf")
        while True:
            try:
                host = await asyncio.to_thread(self.agent.discover)
                due = time.monotonic() - reported_at >= self.interval
                sick = self.sent_health is None or await asyncio.to_thread(self._health_moved, host)
                if due or sick or host.topology_hash() != self._sent_topology:
                    await self.report_once(host)
                    reported_at = time.monotonic()
            except ReportRefused as refused:
                log.error("node %s: %s", self.agent.node, refused)
                reported_at = time.monotonic()  # retrying at once will not help: wait for the interval
                await asyncio.sleep(self.interval)
                continue
            except Exception as error:  # noqa: BLE001 - the API being down must not stop the agent
                log.warning("node %s: report failed (%s); retrying", self.agent.node, error)
            await asyncio.sleep(check_every)


def _verdicts(health: list[SlotHealth] | None) -> list[tuple[object, ...]] | None:
    return None if health is None else [h.verdict for h in health]


def _seen(now: SlotSignals, before: SlotSignals | None) -> SlotSignals:
    """The reading the next look is judged against: this one, except that a device gone from the bus is compared
    with its last reading while present, so it stays `failed` for as long as this agent runs, not for one look."""
    if before is None:
        return now
    kept = {
        role: getattr(before, role)
        for role in ("gpu", "fabric", "nvme")
        if getattr(now, role) is not None
        and not getattr(now, role).present
        and getattr(before, role) is not None
        and getattr(before, role).present
    }
    return now.model_copy(update=kept) if kept else now
