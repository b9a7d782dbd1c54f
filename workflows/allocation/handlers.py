"""How an allocation run answers its messages: the owner's and the operators' (`retry`, `release`, `extend`,
`hand_over`, `drain`), the admission pass's (`wake`, `preempt`) and the API's on an agent's report (`gpu_failed`).

A handler never waits and runs no step: it checks the message against the state (an update's validator refuses it,
unrecorded in the history), records what was asked in the run's `Inbox` (an extension also moves the end the world
sees) and returns; the flow acts on it at its next turn (the candidate loop on a `retry`, the queue on a `wake`, the
hold on the rest). The workflow (workflow.py) declares each handler to Temporal and hands it to `Messages`. What
each message may do when: workflows/README.md, "Operator messages"; their types: messages.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from contracts.allocation import (
        HOLDING_STATES,
        PLACING_STATES,
        RUNNING_STATES,
        DrainNotice,
        HealthNotice,
        PreemptNotice,
    )
    from contracts.durations import format_duration
    from workflows.allocation.calls import Calls
    from workflows.allocation.messages import (
        AllocationStatus,
        ExtendRequest,
        HandOverRequest,
        RetryAccepted,
        RetryRequest,
    )
    from workflows.allocation.state import RunState


class Messages:
    def __init__(self, state: RunState, calls: Calls) -> None:
        self.state = state
        self.status = state.status  # what the messages are checked against
        self.inbox = state.inbox  # where they leave what they asked
        self.calls = calls

    def wake(self) -> None:
        """An admission pass set a node aside for this queued request (activities/control/admission.py)."""
        self.inbox.woken = True

    def preempt(self, notice: PreemptNotice) -> None:
        """An admission pass chose this active allocation to make room for a queued request; a second notice (sent
        again after a lost one) changes nothing."""
        if self.status.state in RUNNING_STATES and self.inbox.notice is None:
            self.inbox.notice = notice

    def gpu_failed(self, notice: HealthNotice) -> None:
        """Its agent judged a GPU of one of its slots failed (sent by the API on the agent's report). Told once: a
        second notice while degraded changes nothing."""
        if self.status.state == "active" and not any(step == "gpu_failed" for _, step, _ in self.inbox.untold):
            then = (
                "its pool moves it to a healthy node"
                if notice.replace
                else "the allocation keeps running: release it and ask again for healthy GPUs"
            )
            self.inbox.untold.append(
                ("degraded", "gpu_failed", f"the GPU of slot {notice.slot} failed ({notice.reason}); {then}")
            )
            if notice.replace:
                self.inbox.replacement = notice

    def drain(self, notice: DrainNotice) -> None:
        """An operator drains its node (`berth nodes drain`): its owner is told, it keeps running until released."""
        if self.status.state in RUNNING_STATES and not self.status.drain_told:
            self.status.drain_told = True
            self.inbox.untold.append(
                (
                    None,
                    "drain_notice",
                    f"node {notice.node} is being drained ({notice.reason}): "
                    "release this allocation and ask again; it keeps running until then",
                )
            )

    def hand_over(self, request: HandOverRequest) -> None:
        """Go on holding in a fresh run, of the current revision (a run still being placed does so once active).
        Sent to the runs of a revision before an upgrade retires it (docs/design.md, "Upgrading the allocation
        workflow")."""
        if self.inbox.hand_over is None:
            self.inbox.hand_over = request

    def retry(self, request: RetryRequest) -> RetryAccepted:
        """Abandon the running attempt (compensating it) and go on with the next candidate."""
        self.state.excluded |= set(request.exclude_nodes)
        abandoned = self.status.node
        self.inbox.retry = True
        return RetryAccepted(abandoned_node=abandoned, excluded_nodes=sorted(self.state.excluded))

    def check_retry(self) -> None:
        if self.status.state not in PLACING_STATES:
            raise self.invalid_state("only an allocation being placed can be retried")

    def release(self) -> AllocationStatus:
        self.inbox.release = True
        return self.status

    def check_release(self) -> None:
        if self.status.state not in HOLDING_STATES:
            hint = " (cancel it instead)" if self.status.state in (*PLACING_STATES, "queued") else ""
            raise self.invalid_state(f"only an active allocation can be released{hint}")

    def extend(self, request: ExtendRequest) -> AllocationStatus:
        """Move the end later: the warning is given again before the new end."""
        ends_at = self.extended_end(request)
        self.status.ends_at, self.status.expiry_warned, self.inbox.end_moved = ends_at, False, True
        self.calls.set_state(self.status.state, "extended", reason=f"ends at {ends_at.isoformat()}", ends_at=ends_at)
        self.calls.mirror.publish_end(ends_at, expiring=False)
        return self.status

    def check_extend(self, request: ExtendRequest) -> None:
        if self.status.state not in RUNNING_STATES:
            raise self.invalid_state("only an active allocation can be extended")
        if self.status.ends_at is None:
            raise self.invalid_state("it has no end to extend")
        self.extended_end(request)

    def extended_end(self, request: ExtendRequest) -> datetime:
        """The new end, or the refusal: not later than the current end, past what its node's reservations allow, or past
        the pool's `maxLease`."""
        current = self.status.ends_at
        assert current is not None
        wanted = request.ends_at if request.ends_at is not None else current + timedelta(seconds=request.seconds or 0)
        if wanted <= current:
            raise ApplicationError(
                f"the new end {wanted.isoformat()} is not later than the current end {current.isoformat()}",
                type="ExtendRefused",
                non_retryable=True,
            )
        if request.not_after is not None and wanted > request.not_after:
            raise ApplicationError(
                f"{request.not_after_reason or 'a reservation needs its GPUs'}: it can end at "
                f"{request.not_after.isoformat()} at the latest",
                type="ExtendRefused",
                non_retryable=True,
            )
        max_lease, active_since = self.state.max_lease, self.state.active_since
        if max_lease is not None and active_since is not None:
            latest = active_since + timedelta(seconds=max_lease)
            if wanted > latest:
                raise ApplicationError(
                    f"the pool grants leases of at most {format_duration(max_lease)}: it can end at "
                    f"{latest.isoformat()} at the latest",
                    type="ExtendRefused",
                    non_retryable=True,
                )
        return wanted

    def invalid_state(self, rule: str) -> ApplicationError:
        """An update refused in this state (a validator's refusal is not recorded in the history); the state travels
        as the failure's detail, so the API answers naming it without reading the words."""
        state = self.status.state
        return ApplicationError(f"allocation is {state}; {rule}", state, type="InvalidState", non_retryable=True)
