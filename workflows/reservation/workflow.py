"""The reservation workflow: GPUs promised for a window, kept by a timer that cannot be lost.

    1. reserved         admitted by the API (scheduler/admission/reservations.py) and recorded; its GPUs are held from every
                        request that would overlap its window; wait for its start (cancellable)
    2. start            start_reservation*: `started`, and the preemptible allocations on its node that must leave,
                        each told with the `preempt` signal (a reservation's start outranks them)
    3. its allocation   a child Allocation workflow, pinned to the reserved node, ending with the window, waiting in
                        the region's queue ahead of every other request until its node has room; placed there, it
                        becomes active and expires at the window's end like any allocation with an end
    4. end              finish_reservation*: ended (its allocation ended), cancelled or failed

A reservation cancelled before its start holds nothing more; cancelled after, its allocation is cancelled too and
gives everything back. `*` marks local activities.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.exceptions import is_cancelled_exception
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contracts import steps
    from contracts.allocation import Lease, PreemptNotice, ReservationRef
    from contracts.placement import PlacementRequest
    from contracts.task_queues import Queues
    from fleet.priority_class import MAX_PRIORITY
    from workflows import control_calls
    from workflows.allocation.messages import AllocationInput, QueueWait, Timing
    from workflows.allocation.mirror import initial_search_attributes
    from workflows.allocation.revisions import REVISION
    from workflows.allocation.workflow import AllocationWorkflow
    from workflows.saga import shielded

FIRST = MAX_PRIORITY + 1  # a reservation's allocation goes before any PriorityClass in its region's queue


class ReservationInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    reservation_id: str
    tenant: str
    request: PlacementRequest  # pinned to the reserved node, with the reservation's id
    starts_at: datetime
    ends_at: datetime
    timing: Timing = Timing()
    queues: Queues = Queues()
    actor: str | None = None  # who reserved it: who asked for its allocation too (`BerthActor`)


class ReservationStatus(BaseModel):
    reservation_id: str
    state: str  # reserved, started, ended, cancelled, failed
    allocation_id: str | None = None
    reason: str | None = None


@workflow.defn(name="Reservation")
class ReservationWorkflow:
    @workflow.init
    def __init__(self, input: ReservationInput) -> None:
        self.input = input
        self.status = ReservationStatus(reservation_id=input.reservation_id, state="reserved")

    @workflow.run
    async def run(self, input: ReservationInput) -> ReservationStatus:
        try:
            await self.until_start()  # 1
            allocation = await self.start()  # 2, 3
            result = await allocation
            await shielded(self.finish("ended", f"its allocation ended {result.state}"))  # 4
        except BaseException as error:
            if is_cancelled_exception(error):
                await shielded(self.finish("cancelled", "cancelled"))
            else:
                await shielded(self.finish("failed", str(error)))
            raise
        return self.status

    async def until_start(self) -> None:
        left = (self.input.starts_at - workflow.now()).total_seconds()
        workflow.set_current_details(f"**reserved** until {self.input.starts_at.isoformat()}")
        if left > 0:
            await workflow.sleep(left)

    async def start(self) -> workflow.ChildWorkflowHandle:
        ref = ReservationRef(reservation_id=self.input.reservation_id)
        started = await control_calls.local(steps.start_reservation, ref, retry=control_calls.DEFAULT_RETRY)
        self.status.state, self.status.allocation_id = "started", started.allocation_id
        for victim, grace in started.victims:
            notice = PreemptNotice(
                priority=FIRST, priority_class=None, grace_seconds=grace, rule="a reservation starts on its node"
            )
            await workflow.get_external_workflow_handle(f"allocation/{victim}").signal("preempt", notice)
        length = (self.input.ends_at - self.input.starts_at).total_seconds()
        allocation = AllocationInput(
            allocation_id=started.allocation_id,
            tenant=self.input.tenant,
            request=self.input.request,
            timing=self.input.timing,
            queues=self.input.queues,
            revision=REVISION,
            lease=Lease(ends_at=self.input.ends_at),
            queue=QueueWait(timeout_seconds=max(length, 1.0), priority=FIRST, priority_class=None),
            request_body={"reservation": self.input.reservation_id},
            actor=self.input.actor,
        )
        workflow.set_current_details(f"**started**: allocation `{started.allocation_id}` until {self.input.ends_at}")
        return await workflow.start_child_workflow(
            AllocationWorkflow.run,
            allocation,
            id=f"allocation/{started.allocation_id}",
            task_queue=self.input.queues.control,
            search_attributes=initial_search_attributes(allocation),
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            static_summary=f"reservation {self.input.reservation_id}",
        )

    async def finish(self, state: str, reason: str) -> None:
        self.status.state, self.status.reason = state, reason
        ref = ReservationRef(reservation_id=self.input.reservation_id, state=state, reason=reason)
        await control_calls.local(steps.finish_reservation, ref, retry=control_calls.DEFAULT_RETRY)

    @workflow.query
    def status_query(self) -> ReservationStatus:
        return self.status


__all__ = ["ReservationInput", "ReservationStatus", "ReservationWorkflow"]
