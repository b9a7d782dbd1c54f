"""The allocation's row and its audit trail in PostgreSQL, kept in step with the workflow.

Temporal's history is the source of truth while an allocation is in flight, but it is dropped after the namespace's
retention; `allocation_events` keeps the story for as long as the platform team needs it.

The workflow hands over its steps as an `AuditTrail`: usually inside the input of the next control activity, which
calls `write_trail` (store/trail.py: one statement per trail) before its own work, and as the local activity
`record_trail` before a wait that no control step follows (readiness, holding an active allocation, the end of the
run). `open_allocation` and `record_state` are the per-step activities of workflows started before the trail
existed; they stay registered so those runs replay and finish.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from contracts.allocation import AllocationRecord, AuditTrail, StateChange
from store.trail import write_trail


class RecordActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    @activity.defn(name="record_trail")
    async def record_trail(self, trail: AuditTrail) -> None:
        """Write the steps taken since the last control activity (a local activity, before a wait)."""
        await write_trail(self.sessions, trail)

    @activity.defn(name="open_allocation")
    async def open_allocation(self, record: AllocationRecord) -> None:
        """Runs started before the trail existed: create the allocation's row if it is missing."""
        await write_trail(self.sessions, AuditTrail(opening=record))

    @activity.defn(name="record_state")
    async def record_state(self, change: StateChange) -> None:
        """Runs started before the trail existed: one step."""
        await write_trail(self.sessions, AuditTrail(changes=[change]))

    def activities(self) -> list[object]:
        return [self.record_trail, self.open_allocation, self.record_state]
