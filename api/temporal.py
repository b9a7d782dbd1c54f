"""The API's side of Temporal: one client, a check that a control worker is listening, and every workflow call
bounded by a timeout and translated into an HTTP answer.

Temporal accepts a workflow start even when no worker polls its task queue, and an update then waits for ever
(sdk-python#514). So before acting, the API asks the server who has polled the control queue lately: nobody means
503 and nothing written, rather than an allocation that silently never moves. The answer is cached for a few
seconds so a burst of requests costs one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, PositiveFloat
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, RPCTimeoutOrCancelledError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from api.errors import ApiError, conflict, unavailable
from contracts.allocation import DrainNotice, HealthNotice
from contracts.task_queues import Queues
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import AllocationInput, AllocationStatus, ExtendRequest, RetryAccepted
from workflows.client_calls import Rejected, WorkerUnavailable


class TemporalTimeouts(BaseModel):
    model_config = ConfigDict(frozen=True)

    connect_seconds: PositiveFloat = 5.0
    call_seconds: PositiveFloat = 10.0  # start, cancel, retry, release
    status_seconds: PositiveFloat = 2.0  # the live status query on a read; the read falls back to PostgreSQL
    worker_check_seconds: PositiveFloat = 3.0
    worker_cache_seconds: PositiveFloat = 5.0
    # A worker re-polls at least once a minute (the server's long-poll window); one not seen for longer is gone.
    poller_fresh_seconds: PositiveFloat = 90.0


# Statuses after which a start may or may not have reached the server.
_ANSWER_LOST = frozenset(
    {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED, RPCStatusCode.UNKNOWN}
)
# Statuses with which a reachable but loaded server drops a call; UNAVAILABLE (nothing listening) is not one.
_DROPPED = frozenset({RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED})


class StartResult(BaseModel):
    """What a start found: it started the workflow, or one was already running under the id with `fingerprint`
    (empty when that workflow was started without one)."""

    started: bool
    fingerprint: str | None = None


NO_WORKER = (
    "no Berth control worker is polling the task queue {queue!r}, so the request would never be acted on; "
    "nothing was changed. Start one with `berth worker control` and retry."
)


class Refused(ApiError):
    """409 `invalid_state`: the workflow refused the action, with its own words. `state`: the allocation's state as
    the workflow's update validator saw it when it refused (None when the refusal names none), so that a route can
    answer in its own words, naming the state the workflow, not a row a step behind it, was in."""

    def __init__(self, message: str, state: str | None) -> None:
        super().__init__(409, "invalid_state", message)
        self.state = state


class Call(BaseModel):
    """A call that changes something, as a caller is told of it when its answer is lost: what it was, and whether
    sending it again is safe."""

    model_config = ConfigDict(frozen=True)

    action: str  # "the release of allocation a1"
    again: str = "Read it to see whether it was before sending it again."


def _idempotent(action: str, done: str) -> Call:
    return Call(action=action, again=f"It is safe to send again: it answers 202 once the {done}.")


class OutcomeUnknown(ApiError):
    """503 `outcome_unknown`: the call went to Temporal but its answer did not come back in time, so the workflow may
    still carry it out (an update waits in Temporal for the next control worker to poll, and one restarting takes
    it then). Such a caller must not be told "nothing was changed": the allocation's trail keeps who asked, and a
    release or cancel sent again answers 202 once it is done."""

    def __init__(self, call: Call, why: str) -> None:
        super().__init__(
            503,
            "outcome_unknown",
            f"{call.action} was sent, but {why}, so whether it was carried out is unknown: it may still be, once a "
            f"control worker answers. {call.again}",
            headers={"Retry-After": "5"},
        )


class WorkflowGone(ApiError):
    """409: the workflow the call was for has ended (or never ran); a route that can answer from the row does."""

    def __init__(self, message: str) -> None:
        super().__init__(409, "invalid_state", message)


class ControlPlane:
    """Reaches the allocation workflows. `client` is either a connected client or a way to connect lazily (the API
    starts, and answers reads, while Temporal is still coming up)."""

    def __init__(
        self,
        client: Client | Callable[[], Awaitable[Client]],
        queues: Queues,
        timeouts: TemporalTimeouts,
    ) -> None:
        self._client = client if isinstance(client, Client) else None
        self._connect = None if isinstance(client, Client) else client
        self._connecting = asyncio.Lock()
        self.queues = queues
        self.timeouts = timeouts
        self._workers_seen: tuple[float, int] | None = None  # (monotonic time, count)

    async def client(self) -> Client:
        if self._client is not None:
            return self._client
        async with self._connecting:
            if self._client is None:
                assert self._connect is not None
                try:
                    self._client = await asyncio.wait_for(self._connect(), self.timeouts.connect_seconds)
                except Exception as error:  # connection refused, TLS, timeout: all mean the same to the caller
                    raise unavailable("temporal_unavailable", f"Temporal is unreachable: {error}") from error
        return self._client

    async def control_workers(self) -> int:
        """How many control workers have polled the control queue lately. A positive answer is cached briefly; a
        zero is not, so a worker that has just started is seen at once. When the server drops the describe call itself
        (a loaded server answers "operation was canceled"), a worker seen within the poller freshness window still
        counts: the server's own answer would have counted a poll that old too."""
        now = time.monotonic()
        if self._workers_seen is not None and now - self._workers_seen[0] < self.timeouts.worker_cache_seconds:
            return self._workers_seen[1]
        client = await self.client()
        request = DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=self.queues.control, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
        try:
            response = await client.workflow_service.describe_task_queue(
                request, timeout=timedelta(seconds=self.timeouts.worker_check_seconds)
            )
        except RPCError as error:
            seen = self._workers_seen
            if error.status in _DROPPED and seen is not None and now - seen[0] < self.timeouts.poller_fresh_seconds:
                return seen[1]
            raise unavailable("temporal_unavailable", f"Temporal is unreachable: {error.message}") from error
        oldest = datetime.now(UTC) - timedelta(seconds=self.timeouts.poller_fresh_seconds)
        count = sum(1 for p in response.pollers if p.last_access_time.ToDatetime(tzinfo=UTC) >= oldest)
        self._workers_seen = (now, count) if count else None
        return count

    async def require_worker(self) -> None:
        if await self.control_workers() == 0:
            raise unavailable("no_control_worker", NO_WORKER.format(queue=self.queues.control))

    @contextlib.asynccontextmanager
    async def call(self, missing: ApiError, change: Call | None = None) -> AsyncIterator[None]:
        """Translate what Temporal says into HTTP: refused -> 409, no such workflow -> `missing`, and no answer in
        time -> 503 naming whether Temporal itself or the control worker is missing. For a `change` that answer is
        `outcome_unknown`: the call may still be carried out; a read that got no answer changed nothing."""
        try:
            async with asyncio.timeout(self.timeouts.call_seconds):
                yield
        except (WorkerUnavailable, TimeoutError, RPCTimeoutOrCancelledError) as error:
            raise await self._no_answer(change) from error
        except Rejected as error:
            raise Refused(str(error), error.state) from error
        except WorkflowAlreadyStartedError as error:
            raise conflict(f"workflow {error.workflow_id} is already running or has completed") from error
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                raise missing from error
            if change is not None and error.status in _ANSWER_LOST:
                raise OutcomeUnknown(change, f"Temporal's answer was lost ({error.message})") from error
            raise unavailable("temporal_unavailable", f"Temporal did not accept the call: {error.message}") from error

    async def _no_answer(self, change: Call | None) -> ApiError:
        """Nothing came back in time: Temporal is down (its client retries quietly until our deadline, so a call may
        or may not have reached it), or it is up and no control worker took the task (an update waits there for
        one). Either way a change may yet be carried out."""
        if not await self.reachable():
            if change is None:
                return unavailable("temporal_unavailable", "Temporal is unreachable; nothing was changed. Retry later.")
            return OutcomeUnknown(change, "Temporal stopped answering")
        waited = f"no Berth control worker answered within {self.timeouts.call_seconds:g}s"
        return unavailable("no_control_worker", waited) if change is None else OutcomeUnknown(change, waited)

    async def start(self, input: AllocationInput, fingerprint: str | None = None) -> StartResult:
        """Start the allocation's workflow, exactly once per id.

        The id is the lock: a second start under it (an Idempotency-Key retried after the first answer was lost)
        finds the first workflow, whose memo says which request started it. When the start's answer is lost
        (Temporal went away mid-call), Temporal is asked whether the workflow exists before answering, so a 503
        from here means the workflow was not created."""
        client = await self.client()
        try:
            async with asyncio.timeout(self.timeouts.call_seconds):
                await allocation_client.start_allocation(client, input, fingerprint)
            return StartResult(started=True)
        except WorkflowAlreadyStartedError:
            return StartResult(started=False, fingerprint=await self._fingerprint(input.allocation_id))
        except (TimeoutError, RPCTimeoutOrCancelledError, RPCError) as error:
            if isinstance(error, RPCError) and error.status not in _ANSWER_LOST:
                raise unavailable("temporal_unavailable", f"Temporal refused the start: {error.message}") from error
            try:
                existing = await self._fingerprint(input.allocation_id)
            except ApiError as unknown:
                raise unavailable(
                    "temporal_unavailable",
                    "Temporal stopped answering while the allocation was being started, so whether it was created is "
                    "unknown. A retry with the same Idempotency-Key is safe: it answers with the allocation if it "
                    "was created, and creates it once if it was not.",
                ) from unknown
            if existing is None:
                raise unavailable(
                    "temporal_unavailable", "Temporal did not accept the start; nothing was created. Retry later."
                ) from error
            return StartResult(started=existing == fingerprint, fingerprint=existing)

    async def _fingerprint(self, allocation_id: str) -> str | None:
        """The fingerprint the allocation's workflow was started with; None when there is no such workflow. 503 when
        Temporal cannot say."""
        client = await self.client()
        try:
            async with asyncio.timeout(self.timeouts.status_seconds):
                return await allocation_client.started_fingerprint(client, allocation_id) or ""
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return None
            raise unavailable("temporal_unavailable", f"Temporal is unreachable: {error.message}") from error
        except TimeoutError as error:
            raise unavailable("temporal_unavailable", "Temporal is unreachable") from error

    async def restart(self, input: AllocationInput) -> None:
        client = await self.client()
        async with self.call(
            _gone(input.allocation_id), Call(action=f"the restart of allocation {input.allocation_id}")
        ):
            await allocation_client.restart_failed(client, input)

    async def cancel(self, allocation_id: str) -> None:
        client = await self.client()
        async with self.call(
            _gone(allocation_id),
            _idempotent(f"the cancellation of allocation {allocation_id}", "allocation is cancelled"),
        ):
            await allocation_client.cancel(client, allocation_id)

    async def retry(self, allocation_id: str, exclude_nodes: list[str]) -> RetryAccepted:
        client = await self.client()
        async with self.call(_gone(allocation_id), Call(action=f"the retry of allocation {allocation_id}")):
            return await allocation_client.retry(client, allocation_id, exclude_nodes, self.timeouts.call_seconds)

    async def release(self, allocation_id: str) -> AllocationStatus:
        client = await self.client()
        async with self.call(
            _gone(allocation_id),
            _idempotent(f"the release of allocation {allocation_id}", "allocation is releasing or released"),
        ):
            return await allocation_client.release(client, allocation_id, self.timeouts.call_seconds)

    async def extend(self, allocation_id: str, request: ExtendRequest) -> AllocationStatus:
        client = await self.client()
        async with self.call(_gone(allocation_id), Call(action=f"the extension of allocation {allocation_id}")):
            return await allocation_client.extend(client, allocation_id, request, self.timeouts.call_seconds)

    async def tell_gpu_failure(self, allocation_id: str, notice: HealthNotice) -> None:
        client = await self.client()
        await allocation_client.handle(client, allocation_id).signal("gpu_failed", notice)

    async def tell_drain(self, allocation_id: str, notice: DrainNotice) -> None:
        client = await self.client()
        await allocation_client.handle(client, allocation_id).signal("drain", notice)

    async def live_status(self, allocation_id: str) -> AllocationStatus | None:
        """The running workflow's own account, or None when it cannot answer quickly (reads then rely on
        PostgreSQL alone)."""
        try:
            client = await self.client()
            return await allocation_client.status(client, allocation_id, self.timeouts.status_seconds)
        except Exception:  # unreachable, no worker, query failed or rejected: every one means "not live"
            return None

    async def reachable(self) -> bool:
        try:
            client = await self.client()
            return await client.service_client.check_health(timeout=timedelta(seconds=self.timeouts.status_seconds))
        except (ApiError, RPCError):
            return False


def _gone(allocation_id: str) -> WorkflowGone:
    return WorkflowGone(f"the workflow of allocation {allocation_id} no longer exists")
