"""With Temporal's authorizer on, the control plane and the node gateway call Temporal with the control plane's own
token, and a node agent's calls through the gateway carry that token, never the node's.

The dev server checks no tokens, so a frontend that does stands in front of its port, as Temporal's default JWT
claim mapper and authorizer do it (docs: "Temporal JWT authorization"): every call must carry `authorization:
Bearer <JWT>` signed by one of the issuer's keys (its JWKS), whose `permissions` claim holds `<namespace>:write`;
anything else is refused, UNAUTHENTICATED. It forwards what it allows to the dev server, as the gateway forwards
(the SDK's client headers, the namespace).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from config.settings import Settings
from config.temporal import connect, connect_node
from config.temporal_credentials import ClientCredentials
from gateway.serve import start_gateway, upstream_channel
from gateway.server import FORWARDED_METADATA, GatewayPolicy
from tests.identity.provider import Provider
from tests.workflows.lab import lab_fleet, running_lab

CONTROL_PLANE = "berth-control-plane"


class AuthorizingFrontend(grpc.GenericRpcHandler):
    def __init__(self, upstream: grpc.aio.Channel, keys: KeySet, namespace: str) -> None:
        self.upstream, self.keys, self.namespace = upstream, keys, namespace
        self.callers: list[dict[str, Any]] = []  # the claims of every call let through
        self.refused: list[str] = []  # the bearer (or none) of every call refused

    def _claims(self, bearer: str) -> dict[str, Any] | None:
        try:
            claims = jwt.decode(bearer.removeprefix("Bearer "), self.keys).claims
        except (JoseError, ValueError):
            return None
        return claims if f"{self.namespace}:write" in claims.get("permissions", []) else None

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method

        async def call(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            metadata = {k: str(v) for k, v in (context.invocation_metadata() or ())}
            claims = self._claims(metadata.get("authorization", ""))
            if claims is None:
                self.refused.append(metadata.get("authorization", ""))
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "Request unauthorized.")
            self.callers.append(claims or {})
            forwarded = [(k, v) for k, v in metadata.items() if k in (*FORWARDED_METADATA, "temporal-namespace")]
            return await self.upstream.unary_unary(method)(
                request, metadata=forwarded, timeout=context.time_remaining()
            )  # type: ignore[no-any-return]

        return grpc.unary_unary_rpc_method_handler(call)


@asynccontextmanager
async def authorizing_frontend(temporal: Client, provider: Provider) -> AsyncIterator[tuple[str, AuthorizingFrontend]]:
    keys = KeySet.import_key_set(httpx.get(provider.discovery()["jwks_uri"]).json())
    upstream = grpc.aio.insecure_channel(temporal.service_client.config.target_host)
    frontend = AuthorizingFrontend(upstream, keys, temporal.namespace)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([frontend])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", frontend
    finally:
        await server.stop(None)
        await upstream.close()


def _settings(address: str, namespace: str, provider: Provider, **more: Any) -> Settings:
    return Settings(
        temporal_address=address,
        temporal_namespace=namespace,
        temporal_oidc_token_url=provider.discovery()["token_endpoint"],
        temporal_oidc_client_id=CONTROL_PLANE,
        temporal_oidc_client_secret="its-secret",
        temporal_oidc_scope=f"{namespace}:write",
        **more,
    )


async def test_the_control_plane_is_let_in_with_its_own_token_and_nobody_without_one(
    temporal_client: Client, oidc_provider: Provider
) -> None:
    async with authorizing_frontend(temporal_client, oidc_provider) as (address, frontend):
        client = await connect(_settings(address, temporal_client.namespace, oidc_provider))
        await client.workflow_service.get_system_info(GetSystemInfoRequest())
        assert frontend.callers and {c["sub"] for c in frontend.callers} == {CONTROL_PLANE}

        with pytest.raises(RuntimeError, match="unauthorized"):
            await connect(Settings(temporal_address=address, temporal_namespace=temporal_client.namespace))
        assert frontend.refused == [""]


async def test_a_node_agent_goes_through_the_gateway_under_the_control_planes_token_never_its_own(
    temporal_client: Client, oidc_provider: Provider, sessions, tmp_path: Path
) -> None:
    namespace = temporal_client.namespace
    async with (
        authorizing_frontend(temporal_client, oidc_provider) as (address, frontend),
        running_lab(
            temporal_client,
            temporal_client,
            sessions,
            tmp_path / "lab",
            lab_fleet({"small": {"gpus": 2}}),
            agents=[],
            control=False,
        ) as lab,
    ):
        upstream = upstream_channel(address, Settings())
        policy = GatewayPolicy(namespace=namespace, queue_prefix=lab.queues.node_prefix)
        credentials = ClientCredentials(
            oidc_provider.discovery()["token_endpoint"], CONTROL_PLANE, "its-secret", f"{namespace}:write"
        )
        gateway = await start_gateway(
            "127.0.0.1:0", upstream, lab.sessions, os.urandom(32), policy, credentials=credentials
        )
        try:
            token = await lab.node_token("small")
            node = await connect_node(
                Settings(node_gateway=f"127.0.0.1:{gateway.port}", temporal_namespace=namespace), token
            )
            info = await node.workflow_service.get_system_info(GetSystemInfoRequest())
            assert info.server_version
            assert frontend.callers and {c["sub"] for c in frontend.callers} == {CONTROL_PLANE}
            assert frontend.refused == []  # the node's token never reached the frontend, not even refused
        finally:
            await gateway.stop(grace=None)
            await upstream.close()
