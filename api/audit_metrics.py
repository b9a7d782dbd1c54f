"""The reconciler's Prometheus metrics, read from PostgreSQL at scrape time (like the allocation gauges), so every API
replica reports the same figures whichever worker ran the audit:

- `berth_audit_findings{kind}`: the latest finished audit's findings by kind (0 for a kind it did not find);
- `berth_audit_repairs_total{kind, outcome}`: every repair the reconciler recorded, by finding kind and outcome
  (`done`, `skipped`, `failed`). A counter: `audit_repairs` rows are never deleted.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily

from contracts.audit import FindingKind
from store.audit import findings_by_kind, repairs_by_kind
from store.db import AsyncSession


class AuditMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.findings = Gauge(
            "berth_audit_findings", "The latest audit's findings by kind (PostgreSQL).", ["kind"], registry=registry
        )
        self.repairs: dict[tuple[str, str], int] = {}
        registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "berth_audit_repairs",
            "Repairs the reconciler recorded, by finding kind and outcome (PostgreSQL).",
            labels=["kind", "outcome"],
        )
        for (kind, outcome), count in sorted(self.repairs.items()):
            family.add_metric([kind, outcome], count)
        yield family

    async def refresh(self, session: AsyncSession) -> None:
        found = await findings_by_kind(session)
        for kind in FindingKind:
            self.findings.labels(kind.value).set(found.get(kind.value, 0))
        self.repairs = await repairs_by_kind(session)
