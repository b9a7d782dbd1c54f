"""The control plane's own identity at Temporal: a token from the OIDC provider's client-credentials grant, carrying
the `permissions` claim Temporal's default claim mapper reads, sent as the client's bearer and replaced before it
expires (config/temporal_credentials.py)."""

from __future__ import annotations

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.testing import WorkflowEnvironment

from config.identity import unverified_claims
from config.settings import Settings
from config.temporal import connect
from config.temporal_credentials import ClientCredentials
from tests.identity.provider import Provider


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_control_plane_gets_a_writer_token_and_renews_it_before_it_expires(oidc_provider: Provider) -> None:
    token_url = oidc_provider.discovery()["token_endpoint"]
    clock = Clock()
    credentials = ClientCredentials(token_url, "berth-control-plane", "its-secret", "berth:write", clock=clock)
    first = await credentials.token()
    claims = unverified_claims(first)
    assert (claims["sub"], claims["permissions"], claims["iss"]) == (
        "berth-control-plane",
        ["berth:write"],
        oidc_provider.issuer,
    )
    assert credentials.expires_at == clock.now + 3600  # the provider's tokens last an hour
    assert await credentials.token() == first and credentials.expires_at == clock.now + 3600  # kept while it holds
    clock.now += 3600 - 30  # within a minute of its end
    assert not credentials.fresh()
    second = await credentials.token()
    assert credentials.expires_at == clock.now + 3600 and credentials.fresh()  # a new one, fetched now
    assert unverified_claims(second)["permissions"] == ["berth:write"]


async def test_connect_sends_the_token_as_the_bearer(
    oidc_provider: Provider, temporal_env: WorkflowEnvironment
) -> None:
    client = temporal_env.client
    settings = Settings(
        temporal_address=client.service_client.config.target_host,
        temporal_namespace=client.namespace,
        temporal_oidc_token_url=oidc_provider.discovery()["token_endpoint"],
        temporal_oidc_client_id="berth-control-plane",
        temporal_oidc_client_secret="its-secret",
        temporal_oidc_scope="default:write",
    )
    connected = await connect(settings)
    assert unverified_claims(connected.api_key or "")["permissions"] == ["default:write"]
    await connected.workflow_service.get_system_info(GetSystemInfoRequest())  # a call goes through with it


def test_the_three_settings_go_together() -> None:
    settings = Settings(temporal_oidc_token_url="http://127.0.0.1:9/token")
    with pytest.raises(ValueError, match="go together"):
        _ = settings.temporal_credentials
