"""Prometheus metrics of the API (`GET /metrics`).

- `berth_api_requests_total{method, route, status}`: every request, by route template (not raw path, so ids do not
  explode the label set);
- `berth_allocations{state}`: allocations by state, read from PostgreSQL at scrape time, so every API replica
  reports the same truth whoever started the allocations;
- `berth_allocation_refusals{reason}`: failed allocations by the reason code their workflow failed with
  (`sku_unavailable`, `quota_exceeded`, `insufficient_capacity`, ...), also from PostgreSQL;
- `berth_explain_refusals_total{reason}`: dry-run explanations that ended in a refusal, by reason code;
- `berth_auth_refusals_total{code}`: requests refused at authentication (401, and 503 when the identity provider
  cannot be read), by code: the only trace of callers who never proved who they are (api/auth.py);
- `berth_audit_findings{kind}`, `berth_audit_repairs_total{kind, outcome}`: the reconciler's (api/audit_metrics.py);
- `berth_gpu_seconds_total{tenant, product, region}`: GPU-seconds allocations held, from the usage ledger at scrape
  time, so it survives restarts of every part (api/usage_metrics.py);
- `berth_queue_length{region, tenant, priority}`, `berth_queue_longest_wait_seconds{region, tenant, priority}`:
  requests waiting for capacity and the longest wait among them, from PostgreSQL at scrape time;
- `berth_gpu_health{pool, health, reason}`: approved slots by their GPU's health and the first word of its reason
  (`aer`, `link`, `gone`, `xid`, ...), from PostgreSQL at scrape time;
- for dashboards and alerts (deploy/grafana, deploy/prometheus), from PostgreSQL at scrape time:
  `berth_slots{pool, state}` (free, placeable, reserved, quarantined), `berth_agents{state}` (live, down),
  `berth_agent_down_allocations{node}` (unfinished allocations on a node whose agent is down),
  `berth_allocation_oldest_seconds{state}` (the longest any allocation has been in each unfinished state),
  `berth_placement_seconds{quantile}` and `berth_placements` (create to `active`, over the last hour);
  from Temporal: `berth_control_workers` (control workers polling; -1 when Temporal does not answer).

Each application has its own registry, so several apps in one process (tests) never collide.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.audit_metrics import AuditMetrics
from api.usage_metrics import UsageMetrics
from contracts.allocation import ALLOCATION_STATES
from store import dashboard, queue
from store.allocations import count_by_state, failures_by_reason
from store.db import AsyncSession
from store.nodes import slot_health

_REASON_CODE = re.compile(r"^[a-z][a-z_]*$")


def reason_code(failure_reason: str | None) -> str:
    """`"sku_unavailable: 2 H200 GPU slices could not ..."` -> `sku_unavailable`; anything else -> `other`."""
    head = (failure_reason or "").split(":", 1)[0].strip()
    return head if _REASON_CODE.match(head) else "other"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "berth_api_requests", "HTTP requests answered.", ["method", "route", "status"], registry=self.registry
        )
        self.allocations = Gauge(
            "berth_allocations", "Allocations by state (PostgreSQL).", ["state"], registry=self.registry
        )
        self.allocation_refusals = Gauge(
            "berth_allocation_refusals",
            "Failed allocations by the reason code of their failure (PostgreSQL).",
            ["reason"],
            registry=self.registry,
        )
        self.explain_refusals = Counter(
            "berth_explain_refusals",
            "Dry-run explanations that refused, by reason code.",
            ["reason"],
            registry=self.registry,
        )
        self.auth_refusals = Counter(
            "berth_auth_refusals", "Requests refused at authentication, by code.", ["code"], registry=self.registry
        )
        self.audit = AuditMetrics(self.registry)  # the reconciler's findings and repairs
        self.usage = UsageMetrics(self.registry)  # GPU-seconds per tenant, from the usage ledger
        queued = ["region", "tenant", "priority"]
        self.queue_length = Gauge(
            "berth_queue_length", "Requests waiting for capacity (PostgreSQL).", queued, registry=self.registry
        )
        self.gpu_health = Gauge(
            "berth_gpu_health",
            "Approved slots by their GPU's health and the kind of its reason (PostgreSQL).",
            ["pool", "health", "reason"],
            registry=self.registry,
        )
        self.queue_longest_wait = Gauge(
            "berth_queue_longest_wait_seconds",
            "How long the longest-waiting of those requests has waited (PostgreSQL).",
            queued,
            registry=self.registry,
        )
        self.slots = Gauge(
            "berth_slots",
            "Approved slots by pool and state: free, placeable, reserved, quarantined (PostgreSQL).",
            ["pool", "state"],
            registry=self.registry,
        )
        self.agents = Gauge("berth_agents", "Node agents by state (PostgreSQL).", ["state"], registry=self.registry)
        self.down_allocations = Gauge(
            "berth_agent_down_allocations",
            "Unfinished allocations on a node whose agent is down (PostgreSQL).",
            ["node"],
            registry=self.registry,
        )
        self.oldest = Gauge(
            "berth_allocation_oldest_seconds",
            "How long the longest allocation in each unfinished state has been in it (PostgreSQL).",
            ["state"],
            registry=self.registry,
        )
        self.placement = Gauge(
            "berth_placement_seconds",
            "Create to active, over the allocations that became active in the last hour (PostgreSQL).",
            ["quantile"],
            registry=self.registry,
        )
        self.placements = Gauge(
            "berth_placements", "Allocations that became active in the last hour (PostgreSQL).", registry=self.registry
        )
        self.control_workers = Gauge(
            "berth_control_workers",
            "Control workers polling the control task queue (Temporal; -1 when it does not answer).",
            registry=self.registry,
        )

    async def render(self, session: AsyncSession, control_workers: int | None = None) -> bytes:
        """Refresh the PostgreSQL-backed gauges (and the control workers Temporal counts, when given: None, it did
        not answer), then the text exposition of everything."""
        by_state = await count_by_state(session)
        for state in ALLOCATION_STATES:
            self.allocations.labels(state).set(by_state.get(state, 0))
        refusals: dict[str, int] = {}
        for reason, count in await failures_by_reason(session):
            refusals[reason_code(reason)] = refusals.get(reason_code(reason), 0) + count
        self.allocation_refusals.clear()
        for code, count in refusals.items():
            self.allocation_refusals.labels(code).set(count)
        await self.audit.refresh(session)
        await self.usage.refresh(session)
        self.queue_length.clear()  # a queue that emptied is gone from the scrape, not stuck at its last length
        self.queue_longest_wait.clear()
        for region, tenant, priority, count, longest in await queue.queue_lengths(session):
            self.queue_length.labels(region, tenant, str(priority)).set(count)
            self.queue_longest_wait.labels(region, tenant, str(priority)).set(round(longest, 3))
        self.gpu_health.clear()
        for pool, health, reason, count in await slot_health(session):
            self.gpu_health.labels(pool, health, reason).set(count)
        await self._operations(session)
        self.control_workers.set(-1 if control_workers is None else control_workers)
        return generate_latest(self.registry)

    async def _operations(self, session: AsyncSession) -> None:
        """What deploy/grafana's dashboard and deploy/prometheus's alerts read."""
        for gauge in (self.slots, self.agents, self.down_allocations, self.oldest, self.placement):
            gauge.clear()  # a pool, node or state that went away is gone from the scrape, not stuck
        for pool, state, count in await dashboard.slot_counts(session):
            self.slots.labels(pool, state).set(count)
        agents = await dashboard.agents_by_state(session)
        for state in ("live", "down"):
            self.agents.labels(state).set(agents.get(state, 0))
        for node, count in await dashboard.allocations_on_down_agents(session):
            self.down_allocations.labels(node).set(count)
        for state, seconds in await dashboard.oldest_in_state(session):
            self.oldest.labels(state).set(round(seconds, 3))
        count, quantiles = await dashboard.placement_seconds(session)
        self.placements.set(count)
        for quantile, seconds in quantiles.items():
            self.placement.labels(f"{quantile:g}").set(round(seconds, 3))


class RequestCounter:
    """ASGI middleware counting each answered request under its route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the server answers if the app dies before starting a response

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
