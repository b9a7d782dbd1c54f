"""The cluster driver's per-call lookup of a cluster's target, from PostgreSQL.

Driver calls run in worker threads (the activities hand them to `asyncio.to_thread`), while the database is
reached through the worker's asyncio sessions; the lookup therefore runs its query on the worker's event loop and
waits for it from the thread. Answers are kept a few seconds: a readiness probe every fraction of a second must not
cost a query each, and `berth apply` changing a connection takes effect within that time.
"""

from __future__ import annotations

import asyncio
import threading
import time

from contracts.cluster import ClusterTarget
from store.cluster_targets import load_target
from store.db import AsyncSession, async_sessionmaker


class ClusterTargets:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], loop: asyncio.AbstractEventLoop, ttl_seconds: float = 5.0
    ) -> None:
        self.sessions = sessions
        self.loop = loop
        self.ttl_seconds = ttl_seconds
        self._cache: dict[str, tuple[float, ClusterTarget | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, cluster: str) -> ClusterTarget | None:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(cluster)
        if cached is not None and now - cached[0] < self.ttl_seconds:
            return cached[1]
        if _running_loop() is self.loop:
            raise RuntimeError("ClusterTargets is called from a worker thread, never from the event loop it uses")
        target = asyncio.run_coroutine_threadsafe(self._load(cluster), self.loop).result(timeout=30)
        with self._lock:
            self._cache[cluster] = (now, target)
        return target

    async def _load(self, cluster: str) -> ClusterTarget | None:
        async with self.sessions() as session:
            return await load_target(session, cluster)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
