"""The allocation's row and its audit trail in PostgreSQL, kept in step with the workflow.

Temporal's history is the source of truth while an allocation is in flight, but it is dropped after the namespace's
retention; `allocation_events` keeps the story for as long as the platform team needs it.

The workflow hands over its steps as an `AuditTrail`: usually inside the input of the next control activity, which
calls `write_trail` (store/trail.py: one statement per trail) before its own work, and as the local activity
`record_trail` before a wait that no control step follows (readiness, holding an active allocation, the end of the
run).
"""

from __future__ import annotations

from temporalio import activity

from contracts.allocation import AuditTrail
from store.db import AsyncSession, async_sessionmaker
from store.trail import write_trail


class RecordActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    @activity.defn(name="record_trail")
    async def record_trail(self, trail: AuditTrail) -> None:
        """Write the steps taken since the last control activity (a local activity, before a wait)."""
        await write_trail(self.sessions, trail)

    def activities(self) -> list[object]:
        return [self.record_trail]
