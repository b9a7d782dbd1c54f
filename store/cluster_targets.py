"""Where the control worker learns how to reach a real cluster: its connection reference (migration 0007), the
taints its workloads tolerate and its autoscaled pools, from the rows `berth apply` wrote."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.cluster import ClusterConnection, ClusterTarget
from contracts.manifest import Toleration
from store.models import ClusterRow, PoolRow


async def load_target(session: AsyncSession, cluster: str) -> ClusterTarget | None:
    """None for a cluster that is unknown or has no connection (it stays on the simulated driver)."""
    row = await session.get(ClusterRow, cluster)
    if row is None or not row.connection:
        return None
    pools = (await session.scalars(select(PoolRow).where(PoolRow.cluster == cluster))).all()
    return ClusterTarget(
        connection=ClusterConnection.model_validate(row.connection),
        # An Equal toleration of each taint (a keyless taint, which Kubernetes does not allow, none can tolerate).
        tolerations=[
            Toleration(key=t["key"], operator="Equal", value=t.get("value"), effect=t.get("effect"))
            for t in row.taints or []
            if t.get("key")
        ],
        autoscaled={p.name: p.max_node_count for p in pools if p.max_node_count is not None},
    )
