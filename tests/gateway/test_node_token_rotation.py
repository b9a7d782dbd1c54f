"""A node's token rotated under its running agent: the agent rereads its file, keeps serving through the node
gateway with the new token, and the old one, once revoked, is refused: rotation without a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.api.workflowservice import v1 as service
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from agent.credential import NodeCredential
from agent.liveness import HeartbeatWhileRunning
from agent.reporter import NodeReporter
from agent.serve import token_uses
from config.context import write_private
from store.tokens import create_token, revoke_tokens, verify
from tests.workflows.lab import StoreSink, lab_fleet, running_lab


async def test_a_rotated_token_is_taken_without_a_restart_and_the_old_one_stops(
    temporal_env, temporal_client, sessions, tmp_path: Path
) -> None:
    fleet = lab_fleet({"small": {"gpus": 2}})
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet, agents=[]) as lab:
        (tmp_path / "tokens").mkdir()
        token_file = write_private(tmp_path / "tokens" / "small", await lab.node_token("small") + "\n")
        credential = NodeCredential(path=token_file)
        client = await lab.node_client("small", token=credential.current())
        agent = lab.agent("small")
        worker = Worker(
            client,
            task_queue=lab.queues.node("small"),
            activities=agent.activities(),
            activity_executor=lab.executor,
            interceptors=[HeartbeatWhileRunning()],
        )
        watching = asyncio.create_task(credential.watch(*token_uses(client, None)))
        async with worker:
            await NodeReporter(agent, StoreSink(lab.sessions)).report_once()
            old = credential.current()
            async with lab.sessions.begin() as session:
                new = await create_token(session, "node", node="small", label="rotated")
                keep = await verify(session, new)
            assert keep is not None
            write_private(token_file, new + "\n")  # what `berth tokens rotate` does, then it waits and revokes
            deadline = asyncio.get_running_loop().time() + 5
            while client.api_key != new:
                assert asyncio.get_running_loop().time() < deadline, "the agent did not reread its token file"
                await asyncio.sleep(0.1)
            async with lab.sessions.begin() as session:
                assert await revoke_tokens(session, node="small", keep=keep.token_id)
            stale = await lab.node_client("small", token=new)
            stale.api_key = old
            deadline = asyncio.get_running_loop().time() + 5
            while True:
                try:
                    await stale.workflow_service.get_system_info(service.GetSystemInfoRequest())
                except RPCError as error:
                    assert error.status == RPCStatusCode.UNAUTHENTICATED
                    break
                assert asyncio.get_running_loop().time() < deadline, "the old token still worked after 5 s"
                await asyncio.sleep(0.1)
            handle = await lab.allocate("rotated-1", gpus=1)  # the agent works on, with its new token
            status = await lab.wait_for_state(handle, "active")
            assert status.node == "small"
            await handle.cancel()
        watching.cancel()
