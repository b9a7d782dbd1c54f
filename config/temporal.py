"""One way to reach Temporal: the address, namespace and TLS from settings, and the pydantic data converter that
every client and worker of Berth must share."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from config.context import temporal_target
from config.settings import Settings


def _tls(settings: Settings) -> TLSConfig | bool:
    if not settings.temporal_tls:
        return False
    return TLSConfig(
        server_root_ca_cert=settings.temporal_tls_ca.read_bytes() if settings.temporal_tls_ca else None,
        client_cert=settings.temporal_tls_cert.read_bytes() if settings.temporal_tls_cert else None,
        client_private_key=settings.temporal_tls_key.read_bytes() if settings.temporal_tls_key else None,
    )


async def connect(settings: Settings) -> Client:
    address, namespace = temporal_target(settings)
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter, tls=_tls(settings)
    )
