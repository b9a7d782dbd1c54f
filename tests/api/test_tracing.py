"""One trace from `POST /v1/allocations` to the node agent: FastAPI's instrumentation on the API and
temporalio's tracing interceptor on every Temporal client (the API's, the control worker's, the node agents' through
the node gateway), spans kept by an in-memory exporter. The trace holds the request, the workflow's start and run,
its control steps and the agent's plan and VM create, and every one of its spans names the allocation (but FastAPI's
dependency resolution, which runs before the id exists)."""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from config import tracing
from tests.api.stack import api_fleet, running_stack

_EXPORTER: InMemorySpanExporter | None = None


def exporter() -> InMemorySpanExporter:
    """This process's tracer provider, once: what config.tracing installs, with an in-memory exporter."""
    global _EXPORTER
    if _EXPORTER is None:
        _EXPORTER = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(tracing.allocation_ids())
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    return _EXPORTER


async def test_one_trace_runs_from_the_api_through_the_workflow_to_the_node_agent(
    temporal_client: Client, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    spans = exporter()
    traced = await Client.connect(
        temporal_client.service_client.config.target_host,
        namespace=temporal_client.namespace,
        data_converter=pydantic_data_converter,
        interceptors=tracing.interceptors(on=True),
    )
    async with running_stack(traced, sessions, tmp_path, api_fleet(), traced=True) as stack:
        allocation = await stack.create(2)
        assert (await stack.wait_for(allocation, "active"))["node"] == "small"
        assert (await stack.http.delete(f"/v1/allocations/{allocation}", headers=stack.acme)).status_code == 202
        await stack.wait_for(allocation, "released")

    finished: tuple[ReadableSpan, ...] = spans.get_finished_spans()
    [request] = [s for s in finished if s.name == "POST /v1/allocations"]
    assert request.attributes is not None and request.attributes[tracing.ALLOCATION_ID] == allocation
    assert request.context is not None
    in_trace = [s for s in finished if s.context is not None and s.context.trace_id == request.context.trace_id]
    names = {s.name for s in in_trace}
    for step in (
        "StartWorkflow:Allocation",
        "RunWorkflow:Allocation",
        "StartActivity:choose_placement",
        "RunActivity:choose_placement",
        "StartActivity:plan_bundles",
        "RunActivity:plan_bundles",
        "StartActivity:record_claims",
        "RunActivity:record_claims",
        "StartActivity:create_vm",
        "RunActivity:create_vm",  # with the first readiness look: this host's VMs are ready the moment they exist
    ):
        assert step in names, f"{step} is not in the trace: {sorted(names)}"
    unnamed = [s.name for s in in_trace if (s.attributes or {}).get(tracing.ALLOCATION_ID) != allocation]
    # FastAPI's dependency resolution, where the instrumentation records it, runs before the request's id is made.
    assert set(unnamed) <= {"fastapi.dependencies"}, unnamed
    # The agent's steps ran on the agent's own worker, reached through the node gateway, in the same trace.
    [plan] = [s for s in in_trace if s.name == "RunActivity:plan_bundles"]
    assert plan.parent is not None and plan.parent.trace_id == request.context.trace_id
