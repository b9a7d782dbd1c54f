"""Which node agents are live: what the cluster scheduler needs so it never ranks a node whose agent is gone.

An agent is live from its report until `expires_at` (a few report intervals later), or until a control activity saw
it miss a task's pickup timeout, whichever comes first. Three writers, none of them per decision:

    agent report (API)       -> live, expires_at moved on            (heartbeats batched: one statement per flush)
    pickup timeout (workflow) -> down at once                          (`mark_down`, with the audit trail)
    expiry sweep             -> down once expires_at has passed        (`expire_stale`, an indexed range scan)

A row-level trigger moves `liveness_version` only when an agent's state really changes (migration 0003), and another
names the node in the inventory change log (migration 0008): a control worker's `InventoryCache` re-reads just that
node, so neither the cost per allocation nor the cost of one agent going live or down grows with the fleet.
`load_liveness` (the whole down set) serves full reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from store.db import among
from store.models import LivenessVersionRow, NodeAgentRow, NodeRow

STALE_AFTER_INTERVALS = 3.0  # an agent that missed this many reports in a row is down


@dataclass(frozen=True)
class Liveness:
    version: int
    down: frozenset[str]  # every node without a live agent, including nodes that never had one


async def liveness_version(session: AsyncSession) -> int:
    return int(await session.scalar(select(LivenessVersionRow.version)) or 0)


async def load_liveness(session: AsyncSession) -> Liveness:
    version = await liveness_version(session)  # first: the set read below is at least this new
    live = select(NodeAgentRow.node).where(NodeAgentRow.state == "live")
    down = (await session.scalars(select(NodeRow.name).where(NodeRow.name.not_in(live)))).all()
    return Liveness(version=version, down=frozenset(down))


async def expire_stale(session: AsyncSession) -> list[str]:
    """Mark down every live agent whose last report is older than its expiry; returns those nodes."""
    rows = await session.execute(
        text(
            "UPDATE node_agents SET state = 'down', down_at = now(), "
            "down_reason = 'no report since ' || to_char(seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
            "WHERE state = 'live' AND expires_at < now() RETURNING node"
        )
    )
    return sorted(node for (node,) in rows)


async def mark_down(session: AsyncSession, node: str, reason: str, at: datetime | None = None) -> bool:
    """A control activity saw the node's agent miss a task: take it out of ranking until it reports again.
    A report newer than `at` (the agent came back meanwhile) wins."""
    result = await session.execute(
        text(
            "UPDATE node_agents SET state = 'down', down_at = coalesce(CAST(:at AS timestamptz), now()), down_reason = :reason "
            "WHERE node = :node AND state = 'live' AND seen_at < coalesce(CAST(:at AS timestamptz), now())"
        ),
        {"node": node, "reason": reason, "at": at},
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def record_heartbeats(
    session: AsyncSession, beats: Sequence[tuple[str, datetime, float]]
) -> dict[str, str | None]:
    """(node, seen at, report interval) for agents whose host has not changed: one statement for any number.
    An agent marked down after its heartbeat was sent stays down until its next one. Returns each of those nodes'
    approval hash as PostgreSQL has it now (a node that is gone is missing), so a process answering heartbeats from
    memory can tell which agents must hear their new slots."""
    if not beats:
        return {}
    await session.execute(
        text(
            "UPDATE node_agents AS a SET seen_at = b.seen, interval_seconds = b.every, state = 'live', "
            "expires_at = b.seen + make_interval(secs => b.every * :stale) "
            "FROM unnest(CAST(:nodes AS text[]), CAST(:seen AS timestamptz[]), CAST(:every AS float8[])) "
            "AS b(node, seen, every) "
            "WHERE a.node = b.node AND b.seen > a.seen_at AND (a.down_at IS NULL OR b.seen > a.down_at)"
        ),
        {
            "nodes": [node for node, _, _ in beats],
            "seen": [seen for _, seen, _ in beats],
            "every": [every for _, _, every in beats],
            "stale": STALE_AFTER_INTERVALS,
        },
    )
    nodes = [node for node, _, _ in beats]
    rows = await session.execute(
        select(NodeAgentRow.node, NodeAgentRow.approved).where(among(NodeAgentRow.node, nodes))
    )
    return dict(rows.all())
