"""A node's credential reaches only its own node's work, against the real Temporal server and PostgreSQL.

Every client here is what a compromised GPU host has: its own node token and the node gateway's address. With
them it cannot start, signal, update, cancel, terminate, describe or list any workflow or read any history, poll
another node's task queue, or answer or heartbeat a task the gateway gave to another node; it can still do its own
node's work, cancellation still reaches its running activities, and a revoked token stops working within seconds.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payloads
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice import v1 as service
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from store.tokens import create_token, revoke_tokens
from tests.workflows.lab import Lab, lab_fleet, running_lab
from workflows.allocation import client as allocation_client


@workflow.defn(name="GatewayProbe", sandboxed=False)  # a test module imports what no sandbox allows
class Probe:
    """One activity on a node's task queue: what the control plane asks of a node, in miniature."""

    @workflow.run
    async def run(self, queue: str) -> str:
        return await workflow.execute_activity(
            "probe_step",
            "hello",
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


@workflow.defn(name="GatewayCancelProbe", sandboxed=False)
class CancelProbe:
    """Starts a long node activity, then cancels it when signalled and reports what the activity said."""

    def __init__(self) -> None:
        self.cancel_now = False

    @workflow.run
    async def run(self, queue: str) -> str:
        step = workflow.start_activity(
            "wait_for_cancel",
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=5),
            retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        await workflow.wait_condition(lambda: self.cancel_now)
        step.cancel()
        try:
            await step
        except ActivityError as error:
            return type(error.cause).__name__
        return "not cancelled"

    @workflow.signal
    def cancel(self) -> None:
        self.cancel_now = True


async def refused(call: Callable[[], Awaitable[Any]], code: RPCStatusCode = RPCStatusCode.PERMISSION_DENIED) -> str:
    with pytest.raises(RPCError) as raised:
        await call()
    assert raised.value.status == code, raised.value
    return raised.value.message


async def _iterate(client: Client) -> list[Any]:
    return [execution async for execution in client.list_workflows()]


@pytest.fixture
def hosts() -> dict[str, dict[str, Any]]:
    return {"small": {"gpus": 2}, "big": {"gpus": 4}}


@pytest.fixture
async def lab(temporal_env, temporal_client, sessions, tmp_path: Path, hosts) -> AsyncIterator[Lab]:
    """The hosts' fleet, its database and a node gateway, with no agent and no control worker running: each test
    plays the hosts itself with their own tokens."""
    fleet = lab_fleet(hosts)
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, fleet, agents=[], control=False
    ) as lab:
        yield lab


async def test_a_node_token_reaches_no_workflow_not_even_on_its_own_node(
    temporal_env, temporal_client, sessions, tmp_path: Path, hosts
) -> None:
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, lab_fleet(hosts)) as lab:
        handle = await lab.allocate("victim-1", gpus=2)
        status = await lab.wait_for_state(handle, "active")
        host = await lab.node_client(status.node or "")  # the allocation's own host, which runs its VM
        victim = host.get_workflow_handle(handle.id)
        message = await refused(lambda: victim.execute_update("release", id="stolen"))
        assert "may not call UpdateWorkflowExecution" in message
        await refused(lambda: victim.signal("release"))
        await refused(lambda: victim.cancel())
        await refused(lambda: victim.terminate("taken over"))
        await refused(lambda: victim.describe())
        await refused(lambda: victim.query("status_query"))
        await refused(lambda: victim.fetch_history())
        await refused(lambda: _iterate(host))
        await refused(
            lambda: host.start_workflow("GatewayProbe", "x", id=f"intruder-{uuid.uuid4().hex[:6]}", task_queue="q")
        )
        await refused(
            lambda: host.workflow_service.respond_activity_task_completed_by_id(
                service.RespondActivityTaskCompletedByIdRequest(
                    namespace=host.namespace, workflow_id=handle.id, activity_id="1"
                )
            )
        )
        # Nothing of that reached the allocation: still active, as its owner left it, and released only by the owner.
        assert (await lab.wait_for_state(handle, "active")).state == "active"
        await allocation_client.release(temporal_client, "victim-1")
        assert (await handle.result()).state == "released"


async def _poll(client: Client, queue: str) -> service.PollActivityTaskQueueResponse:
    request = service.PollActivityTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), identity="probe"
    )
    return await client.workflow_service.poll_activity_task_queue(request)


async def test_a_node_polls_only_its_own_queue_and_answers_only_the_tasks_it_was_given(
    lab: Lab, temporal_client
) -> None:
    small, big = await lab.node_client("small"), await lab.node_client("big")
    queue = lab.queues.node("small")
    message = await refused(lambda: _poll(big, queue))
    assert "may poll only its own task queue" in message
    async with Worker(temporal_client, task_queue=lab.queues.control, workflows=[Probe]):
        run = await temporal_client.start_workflow(
            Probe.run, queue, id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=lab.queues.control
        )
        task = await _poll(small, queue)
        assert task.activity_type.name == "probe_step" and task.task_token
        sealed = bytes(task.task_token)

        def heartbeat(client: Client, token: bytes) -> Awaitable[Any]:
            request = service.RecordActivityTaskHeartbeatRequest(namespace=client.namespace, task_token=token)
            return client.workflow_service.record_activity_task_heartbeat(request)

        def complete(client: Client, token: bytes, result: str) -> Awaitable[Any]:
            payloads = Payloads(payloads=[client.data_converter.payload_converter.to_payload(result)])
            request = service.RespondActivityTaskCompletedRequest(
                namespace=client.namespace, task_token=token, result=payloads
            )
            return client.workflow_service.respond_activity_task_completed(request)

        assert "issued to another node" in await refused(lambda: heartbeat(big, sealed))
        assert "issued to another node" in await refused(lambda: complete(big, sealed, "from big"))
        inner = sealed[2 + len(b"small") + 32 :]  # Temporal's own token, as one built from guessed ids would be
        assert "not issued by the node gateway" in await refused(lambda: complete(small, inner, "forged"))
        tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
        assert "not issued by the node gateway" in await refused(lambda: complete(small, tampered, "tampered"))

        flood = "x" * (2 * 1024 * 1024)  # a host that tries to fill the workflow's history
        await refused(lambda: complete(small, sealed, flood), RPCStatusCode.RESOURCE_EXHAUSTED)

        await heartbeat(small, sealed)  # its own task: heartbeats and completes
        await complete(small, sealed, "from small")
        assert await run.result() == "from small"
        # Temporal's own answers come back as Temporal gave them (the SDK acts on NOT_FOUND: the task is gone).
        await refused(lambda: complete(small, sealed, "again"), RPCStatusCode.NOT_FOUND)
        await refused(lambda: heartbeat(small, sealed), RPCStatusCode.NOT_FOUND)


async def test_cancellation_reaches_a_running_node_activity_through_the_gateway(lab: Lab, temporal_client) -> None:
    seen: list[str] = []

    @activity.defn(name="wait_for_cancel")
    async def wait_for_cancel() -> str:
        while True:
            activity.heartbeat()
            try:
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

    queue = lab.queues.node("small")
    agent = Worker(await lab.node_client("small"), task_queue=queue, activities=[wait_for_cancel])
    async with agent, Worker(temporal_client, task_queue=lab.queues.control, workflows=[CancelProbe]):
        run = await temporal_client.start_workflow(
            CancelProbe.run, queue, id=f"cancel-{uuid.uuid4().hex[:8]}", task_queue=lab.queues.control
        )
        while not (await run.describe()).raw_description.pending_activities:
            await asyncio.sleep(0.1)
        await run.signal(CancelProbe.cancel)
        assert await run.result() == CancelledError.__name__
    assert seen == ["cancelled"]  # the activity on the node saw it, through a heartbeat's answer


async def _refused_within_five_seconds(client: Client) -> None:
    """Call through the gateway with the client's token until it is refused as unknown or revoked (at most 5 s)."""
    since = time.monotonic()
    while True:
        try:
            await client.workflow_service.get_system_info(service.GetSystemInfoRequest())
        except RPCError as error:
            assert error.status == RPCStatusCode.UNAUTHENTICATED, error
            return
        assert time.monotonic() - since < 5, "the token still worked after 5 s"
        await asyncio.sleep(0.1)


async def test_a_revoked_node_token_stops_working_within_five_seconds(lab: Lab, temporal_client) -> None:
    small, big = await lab.node_client("small"), await lab.node_client("big")
    system_info = service.GetSystemInfoRequest()
    await small.workflow_service.get_system_info(system_info)  # cached as verified from here on
    async with lab.sessions.begin() as session:
        assert await revoke_tokens(session, node="small")
    await _refused_within_five_seconds(small)
    await refused(lambda: _poll(small, lab.queues.node("small")), RPCStatusCode.UNAUTHENTICATED)
    await big.workflow_service.get_system_info(system_info)  # another node's token is untouched

    # A node removed from the fleet takes its tokens with it (ON DELETE CASCADE): as good as revoked.
    async with lab.sessions.begin() as session:
        await session.execute(text("DELETE FROM api_tokens WHERE node = 'big'"))
    await _refused_within_five_seconds(big)


async def test_only_a_live_node_token_gets_through_the_gateway(lab: Lab, temporal_client) -> None:
    async with lab.sessions.begin() as session:
        admin = await create_token(session, "admin")
        tenant = await create_token(session, "member", "acme")
    for token, answer in (
        (admin, "serves node agents"),
        (tenant, "serves node agents"),
        ("berth_unknown", "unknown or revoked"),
        ("", "Unauthenticated"),
    ):
        with pytest.raises(RuntimeError, match=answer):
            await lab.node_client("small", token=token or " ")


async def test_a_node_holds_at_most_sixteen_polls_and_its_requests_are_rebuilt(lab: Lab, temporal_client) -> None:
    """One host must not take the namespace's pollers, nor pass Temporal fields of its choosing."""
    small = await lab.node_client("small")
    request = service.PollActivityTaskQueueRequest(
        namespace=small.namespace, task_queue=TaskQueue(name=lab.queues.node("small")), identity="big-pretender"
    )

    async def poll() -> str:
        try:
            await small.workflow_service.poll_activity_task_queue(request, timeout=timedelta(seconds=5))
        except RPCError as error:
            return error.status.name
        return "answered"

    outcomes = await asyncio.gather(*(poll() for _ in range(20)))  # all in flight together: each waits 5 s
    assert outcomes.count("RESOURCE_EXHAUSTED") == 4, outcomes

    async with Worker(temporal_client, task_queue=lab.queues.control, workflows=[Probe]):
        run = await temporal_client.start_workflow(
            Probe.run, lab.queues.node("small"), id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=lab.queues.control
        )
        task = await _poll(small, lab.queues.node("small"))
        answer = service.RespondActivityTaskFailedRequest(
            namespace=small.namespace, task_token=task.task_token, identity="someone-else"
        )
        answer.failure.message = "refused by the host"
        answer.failure.application_failure_info.non_retryable = True
        answer.deployment_options.deployment_name = "intruder"  # would register a worker deployment
        await small.workflow_service.respond_activity_task_failed(answer)
        with pytest.raises(WorkflowFailureError) as failed:
            await run.result()
        assert "refused by the host" in str(failed.value.cause.cause)
        started = next(
            e.activity_task_started_event_attributes
            for e in (await run.fetch_history()).events
            if e.HasField("activity_task_started_event_attributes")
        )
        assert started.identity == "small:probe"  # the gateway's identity: the node's name, then the SDK's
