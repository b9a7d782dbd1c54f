"""Berth against a Temporal frontend that requires mutual TLS, and node agents reaching the gateway over TLS.

The dev server cannot serve TLS, so a TLS relay (tests/tls_relay.py) stands in front of its plaintext port as the
frontend configured with `tls.frontend` and `requireClientAuth: true`. The control plane (`connect`) and the node
gateway (`upstream_channel`) reach it with the BERTH_TEMPORAL_TLS_* settings; a node agent (`connect_node`) reaches
the gateway over TLS with BERTH_NODE_GATEWAY_CA; the clients that lack what TLS asks of them do not get through.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.worker import Worker

from config.settings import Settings
from config.temporal import connect, connect_node
from gateway.serve import start_gateway, upstream_channel
from gateway.server import GatewayPolicy
from tests.tls_relay import Certificates, make_certificates, tls_relay
from tests.workflows.lab import lab_fleet, running_lab


@activity.defn(name="tls_probe_greet")
async def greet(name: str) -> str:
    return f"hello, {name}"


@workflow.defn(name="TlsProbe", sandboxed=False)  # a test module imports what no sandbox allows
class TlsProbe:
    """One activity and a result: a workflow and its worker both talking to Temporal through mutual TLS."""

    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(greet, name, start_to_close_timeout=timedelta(seconds=30))


def mtls_settings(address: str, pki: Certificates, namespace: str, client_certificate: bool = True) -> Settings:
    return Settings(
        temporal_address=address,
        temporal_namespace=namespace,
        temporal_tls=True,
        temporal_tls_ca=pki.ca,
        temporal_tls_cert=pki.client_cert if client_certificate else None,
        temporal_tls_key=pki.client_key if client_certificate else None,
    )


@pytest.fixture
def pki(tmp_path: Path) -> Certificates:
    return make_certificates(tmp_path / "pki")


async def test_the_control_plane_reaches_temporal_over_mutual_tls(
    temporal_env, temporal_client: Client, pki: Certificates
) -> None:
    plain = temporal_client.service_client.config.target_host
    async with tls_relay(plain, pki.server_cert, pki.server_key, client_ca=pki.ca) as frontend:
        client = await connect(mtls_settings(frontend, pki, temporal_client.namespace))
        queue = f"tls-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=queue, workflows=[TlsProbe], activities=[greet]):
            result = await client.execute_workflow(
                TlsProbe.run,
                "berth",
                id=f"tls-probe-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
                execution_timeout=timedelta(seconds=30),
            )
        assert result == "hello, berth"

        # The same CA but no client certificate: the frontend ends the handshake and connect fails.
        with pytest.raises(RuntimeError) as refused:
            await connect(mtls_settings(frontend, pki, temporal_client.namespace, client_certificate=False))
        assert "connect" in str(refused.value).lower(), refused.value


class _Records(logging.Handler):
    """Keeps the agent's log records and says when the first arrives."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.first = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.first.set()


async def test_the_gateway_reaches_temporal_over_mutual_tls_and_serves_agents_over_tls(
    temporal_env, temporal_client: Client, sessions, tmp_path: Path, pki: Certificates
) -> None:
    plain = temporal_client.service_client.config.target_host
    namespace = temporal_client.namespace
    fleet = lab_fleet({"small": {"gpus": 2}})
    async with (
        tls_relay(plain, pki.server_cert, pki.server_key, client_ca=pki.ca) as frontend,
        running_lab(
            temporal_client, temporal_client, sessions, tmp_path / "lab", fleet, agents=[], control=False
        ) as lab,
    ):
        upstream = upstream_channel(frontend, mtls_settings(frontend, pki, namespace))
        policy = GatewayPolicy(namespace=namespace, queue_prefix=lab.queues.node_prefix)
        tls = (pki.server_key.read_bytes(), pki.server_cert.read_bytes())
        gateway = await start_gateway("127.0.0.1:0", upstream, lab.sessions, os.urandom(32), policy, tls=tls)
        try:
            address = f"127.0.0.1:{gateway.port}"
            token = await lab.node_token("small")

            # agent -TLS-> gateway -mTLS-> the frontend (the relay) -> Temporal
            node = await connect_node(
                Settings(node_gateway=address, node_gateway_ca=pki.ca, temporal_namespace=namespace), token
            )
            info = await node.workflow_service.get_system_info(GetSystemInfoRequest())
            direct = await temporal_client.workflow_service.get_system_info(GetSystemInfoRequest())
            assert info.server_version and info.server_version == direct.server_version, (info, direct)

            # An agent not told the gateway's CA speaks plaintext to a TLS port: it never connects, and says so
            # while it keeps trying (as an agent does for a gateway that is not up yet).
            records = _Records()
            agent_log = logging.getLogger("berth.temporal")
            agent_log.addHandler(records)
            plaintext = asyncio.create_task(
                connect_node(Settings(node_gateway=address, temporal_namespace=namespace), token)
            )
            try:
                await asyncio.wait_for(records.first.wait(), timeout=30)
            finally:
                agent_log.removeHandler(records)
                plaintext.cancel()
            with pytest.raises(asyncio.CancelledError):
                await plaintext  # cancelled while still trying: it never got a client
            assert f"the node gateway at {address} does not answer yet" in records.messages[0], records.messages
        finally:
            await gateway.stop(grace=None)
            await upstream.close()
