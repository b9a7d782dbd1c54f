"""The control worker's connection to Temporal (`berth worker control`): a server that does not answer yet is waited
for, and said so, instead of ending the process (a pod that starts before Temporal, a server restarting)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from config.settings import Settings
from config.temporal import connect
from devstack.balancer import LoopbackBalancer
from devstack.ports import free_port


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.first = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.first.set()


async def test_the_control_worker_waits_for_a_temporal_that_is_not_up_yet(temporal_client: Client) -> None:
    port = free_port()
    settings = Settings(temporal_address=f"127.0.0.1:{port}", temporal_namespace=temporal_client.namespace)
    records = _Records()
    logging.getLogger("berth.temporal").addHandler(records)
    try:
        connecting = asyncio.create_task(connect(settings, patiently=True))
        await asyncio.wait_for(records.first.wait(), timeout=30)
        assert not connecting.done()
        assert f"Temporal at 127.0.0.1:{port} does not answer yet" in records.messages[0], records.messages
        # Temporal comes up at that address (the session's server, behind a loopback relay on the port).
        upstream = int(temporal_client.service_client.config.target_host.rsplit(":", 1)[1])
        relay = LoopbackBalancer(port, [upstream]).start()
        try:
            client = await asyncio.wait_for(connecting, timeout=30)
            info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
            assert info.server_version
        finally:
            relay.stop()
    finally:
        logging.getLogger("berth.temporal").removeHandler(records)


async def test_a_cli_command_fails_at_once_when_temporal_does_not_answer() -> None:
    settings = Settings(temporal_address=f"127.0.0.1:{free_port()}")
    with pytest.raises(RuntimeError, match="Failed client connect"):
        await asyncio.wait_for(connect(settings), timeout=30)
