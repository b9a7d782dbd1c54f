"""`berth_gpu_seconds_total{tenant, product, region}`: GPU-seconds allocations held, from the usage ledger at scrape
time (store/usage.py `gpu_seconds_totals`: closed intervals' totals plus the open ones so far). Nothing is kept in
memory, so the counter survives a restart of every part and reads the same from every API process, whether
Prometheus scrapes each as its own target or one behind a load balancer. It only grows: the ledger's totals are
added to at each interval's close, never taken from, and an open interval is counted only up to the start of the
oldest transaction still in progress (`counted_until`), where a release still to commit can end it, never past."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from store.db import AsyncSession
from store.usage import gpu_seconds_totals


class UsageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.totals: list[tuple[str, str, str, float]] = []
        registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "berth_gpu_seconds",
            "GPU-seconds allocations held, by tenant, GPU product and region (the usage ledger).",
            labels=["tenant", "product", "region"],
        )
        for tenant, product, region, seconds in self.totals:
            family.add_metric([tenant, product, region], round(seconds, 3))
        yield family

    async def refresh(self, session: AsyncSession) -> None:
        self.totals = await gpu_seconds_totals(session)
