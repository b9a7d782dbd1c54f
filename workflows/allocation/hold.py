"""Step 4, the hold: the active allocation held until a release, a cancellation, its end or a preemption, then torn
down (destroy_vm@node and its wipe, release_claims*).

While it holds, the hold acts on what the messages left in the run's inbox (handlers.py): an extension moves the
end (its owner is warned `Timing.expiry_warning_seconds` before it: `expiring`), a preemption notice gives the victim
its grace period (`preempting`), a failed GPU or a drained node is told to its owner (`degraded`, the drain notice),
and a failed GPU its pool replaces ends the hold so the placement runs again (placement.py).

The run that placed the allocation holds it; its hold goes on in a fresh run of its own (continue-as-new,
`AllocationInput.held`) when its history grows long or an operator sends `hand_over`, and the fresh run takes the
current revision: its history is this code's from its first event.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.allocation import HOLDING_STATES
    from contracts.durations import format_duration
    from workflows import search_attributes as sa
    from workflows.allocation.calls import Calls
    from workflows.allocation.mirror import search_attributes_of
    from workflows.allocation.revisions import REVISION
    from workflows.allocation.state import RunState
    from workflows.cancellation import wait_unless_cancelled

REPLACE = ("placing", "replace")  # the hold's ending when its pool replaces it off a failed GPU
HAND_OVER = ("active", "hand_over")  # the hold's ending when it goes on in a fresh run (its history grew long)


class Hold:
    def __init__(self, state: RunState, calls: Calls) -> None:
        self.state = state
        self.inbox = state.inbox  # what the messages asked (handlers.py), for the hold to act on
        self.calls = calls
        self.mirror = calls.mirror

    async def hold_until_released(self) -> tuple[str, str]:
        """Hold until a release or, for an allocation with an end, the end (`expired`); its owner is warned
        `Timing.expiry_warning_seconds` before it. An extension moves the end and the warning with it."""
        while True:
            await self.mirror.write_trail()
            if self.inbox.replacement is not None:
                return REPLACE
            if self.hand_over_due() is not None:
                return HAND_OVER
            ends_at = self.state.status.ends_at
            if ends_at is None:
                await wait_unless_cancelled(self.interrupted)
                if self.tell_owner():
                    continue
                if self.inbox.release:
                    return "released", "release"
                if self.inbox.notice is None:
                    continue  # a hand-over is due: the loop's top
                return await self.serve_notice()
            warn_at = ends_at - timedelta(seconds=self.state.input.timing.expiry_warning_seconds)
            now = workflow.now()
            if now >= ends_at:
                return "expired", "expire"
            if now >= warn_at and not self.state.status.expiry_warned:
                self.warn_of_end(ends_at)
                continue
            instant = ends_at if self.state.status.expiry_warned else warn_at
            self.inbox.end_moved = False
            try:
                await wait_unless_cancelled(self.interrupted, instant - now)
            except TimeoutError:
                continue
            if self.tell_owner():
                continue
            if self.inbox.release:
                return "released", "release"
            if self.inbox.notice is not None:
                return await self.serve_notice()

    def interrupted(self) -> bool:
        return (
            self.inbox.release
            or self.inbox.end_moved
            or self.inbox.notice is not None
            or bool(self.inbox.untold)
            or self.hand_over_due() is not None
        )

    def tell_owner(self) -> bool:
        """Record what its owner must be told: a failed GPU (`degraded`) or its node being drained. It
        keeps running, as its owner decides: the event, the state and the Temporal UI say why. True when something
        was told now (the hold then writes the trail)."""
        told, self.inbox.untold = self.inbox.untold, []
        for state, step, reason in told:
            self.calls.set_state(state or self.state.status.state, step, reason=reason)
        return bool(told)

    async def serve_notice(self) -> tuple[str, str]:
        """Preempted: `preempting` for the grace period its PriorityClass gives, then the release saga,
        final state `preempted`. Its owner sees the preemptor's priority, never its tenant; a release meanwhile
        ends it at once, as `released`."""
        notice = self.inbox.notice
        assert notice is not None
        of = f" (class {notice.priority_class})" if notice.priority_class else ""
        reason = (
            f"preempted for a request of priority {notice.priority}{of} ({notice.rule}); released after "
            f"{format_duration(notice.grace_seconds)}"
        )
        self.calls.set_state("preempting", "preempt_notice", reason=reason)
        await self.mirror.write_trail()
        try:
            await wait_unless_cancelled(lambda: self.inbox.release, timedelta(seconds=notice.grace_seconds))
        except TimeoutError:
            return "preempted", "preempt"
        return "released", "release"

    def warn_of_end(self, ends_at: datetime) -> None:
        """`expiring`: the owner sees it in the allocation's events, `berth alloc get` and the Temporal UI."""
        self.state.status.expiry_warned = True
        self.calls.set_state(
            self.state.status.state, "expiring", reason=f"ends at {ends_at.isoformat()}; extend it to keep it"
        )
        self.mirror.publish_end(ends_at, expiring=True)

    def hand_over_due(self) -> str | None:
        """Why the hold should go on in a fresh run now, or None. Its history reached `Timing.hold_history_events`
        (or Temporal suggests it: a history too long to keep replaying), or an operator asked (`hand_over`, before
        an upgrade that retires this run's revision). A release or a preemption under way is served first."""
        if self.inbox.release or self.inbox.notice is not None:
            return None
        info, limit = workflow.info(), self.state.input.timing.hold_history_events
        if self.inbox.hand_over is not None:
            return f"asked: {self.inbox.hand_over.reason or 'an operator asked'}"
        if info.is_continue_as_new_suggested():
            return "Temporal suggested it: the history is long"
        if info.get_current_history_length() >= limit:
            return f"its history reached {limit} events"
        return None

    async def hand_over(self) -> None:
        """Go on holding in a fresh run (continue-as-new) whose input carries the allocation (node, bundles,
        attempts, end) and says which run it continues. This run's search attributes are unset before it closes, so
        a filter on state, region, node or tenant lists the allocation once: by its open run. The fresh run is of the
        current revision, whatever this one's: so handing over is how an upgrade moves a held allocation off a
        revision it retires. Returns, holding on here, when a release or a preemption came while it wrote its
        trail."""
        because = self.hand_over_due()
        assert because is not None
        self.calls.set_state(self.state.status.state, "hand_over", reason=f"the hold goes on in a fresh run: {because}")
        await wait_unless_cancelled(workflow.all_handlers_finished)
        while self.mirror.trail:  # a handler's step written too, before the run closes
            await self.mirror.write_trail()
            await wait_unless_cancelled(workflow.all_handlers_finished)
        if self.hand_over_due() is None:
            return  # released or preempted meanwhile: served here
        held = self.state.held(handed_over_because=because)
        workflow.upsert_search_attributes([key.value_unset() for key in sa.ALL])
        workflow.continue_as_new(
            self.state.input.model_copy(update={"held": held, "revision": REVISION}),
            search_attributes=search_attributes_of(self.state.input, self.state.status, self.mirror.published),
        )

    async def teardown(self, final_state: str, step: str) -> None:
        """Give everything back: destroy the VM and wipe its slots, release the claims. Runs to completion even
        when the workflow is being cancelled.

        The row says `releasing` before the host's part starts, and the final state is written with the release of
        the claims, in its transaction: the row is never `active` while the VM goes, nor final while its GPUs are
        still claimed, and the release costs no more actions than a write of its own would."""
        await self.calls.leave_queue()  # cancelled while waiting: nothing is held, only the queue's entry
        if self.state.status.state in HOLDING_STATES:
            self.calls.set_state("releasing", step)
            await self.mirror.write_trail()  # the row says `releasing` while the host's part runs
            attempt = self.state.status.attempts[-1]
            await self.calls.destroy_vm(
                attempt.node,
                attempt.number,
                [b.slot_index for b in self.state.status.bundles],
                deadline=self.calls.clock.time_left(),
            )
            self.state.status.bundles = []
            self.calls.set_state(final_state, final_state)  # rides with the release of the claims
            await self.calls.release_claims(None)
        self.state.status.bundles = []
        if self.state.status.state != final_state:
            self.calls.set_state(final_state, final_state)
        await self.mirror.write_trail()  # nothing left to write when the final state rode with the release
