"""The shared Temporal test server carries Berth's search attributes, as `berth up` and production must."""

from __future__ import annotations

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.testing import WorkflowEnvironment

from workflows.search_attributes import ALL


async def test_the_custom_search_attributes_are_registered(temporal_env: WorkflowEnvironment) -> None:
    client = temporal_env.client
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    assert {key.name for key in ALL} <= set(response.custom_attributes)
