"""The API's calls to ModelDeployment workflows, each bounded by a timeout and translated into an HTTP answer:
refused by the workflow's validator -> 409, no worker answering -> 503, like the allocation calls in temporal.py."""

from __future__ import annotations

import asyncio
from typing import Any

from api.errors import not_found
from api.temporal import Call, ControlPlane
from contracts.manifest import DEFAULT_NAMESPACE
from workflows.deployment import client as deployment_client
from workflows.deployment.messages import DeploymentStatus, DeploymentTiming, qualified_name


async def apply(
    control: ControlPlane,
    name: str,
    manifest: dict[str, Any],
    timing: DeploymentTiming,
    namespace: str = DEFAULT_NAMESPACE,
) -> bool:
    client = await control.client()
    change = Call(
        action=f"the spec of deployment {qualified_name(name, namespace)}",
        again="The same PUT is safe to send again: it applies the spec once.",
    )
    async with control.call(not_found("deployment", qualified_name(name, namespace)), change):
        return await deployment_client.apply(
            client,
            name,
            manifest,
            queues=control.queues,
            timing=timing,
            wait_seconds=control.timeouts.call_seconds,
            namespace=namespace,
        )


async def running(control: ControlPlane, name: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
    client = await control.client()
    async with control.call(not_found("deployment", qualified_name(name, namespace))):
        return await deployment_client.running(client, name, namespace)


async def delete(control: ControlPlane, name: str, namespace: str = DEFAULT_NAMESPACE) -> DeploymentStatus:
    client = await control.client()
    change = Call(action=f"the deletion of deployment {qualified_name(name, namespace)}")
    async with control.call(not_found("deployment", qualified_name(name, namespace)), change):
        return await deployment_client.delete(client, name, control.timeouts.call_seconds, namespace)


async def live_status(control: ControlPlane, name: str, namespace: str = DEFAULT_NAMESPACE) -> DeploymentStatus | None:
    """The running workflow's own account, or None when it cannot answer quickly."""
    try:
        client = await control.client()
        return await deployment_client.status(client, name, control.timeouts.status_seconds, namespace)
    except Exception:  # unreachable, no worker, not running: every one means "not live"
        return None


async def inventory_changed(control: ControlPlane, reason: str) -> int | None:
    """Best effort: tell running deployments to re-plan now (their resync timer would, later); how many were told,
    None when Temporal could not be told. Never fails the caller: the inventory is already written."""
    try:
        client = await control.client()
        async with asyncio.timeout(control.timeouts.status_seconds):
            return await deployment_client.notify_inventory_changed(client, control.queues, reason)
    except Exception:  # noqa: BLE001 - unreachable Temporal or a slow visibility store: the resync covers it
        return None
