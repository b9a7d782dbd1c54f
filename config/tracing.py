"""Traces: OpenTelemetry, on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, the
standard variables, and off otherwise (nothing of OpenTelemetry is even imported then: a node agent stays lean).

    POST /v1/allocations                      FastAPI's instrumentation (the API)
      StartWorkflow:Allocation                temporalio's TracingInterceptor, on every Temporal client; the span
        RunWorkflow:Allocation                context travels in Temporal's headers, so one trace runs on
          StartActivity:choose_placement      through the control worker's workflow and activities
            RunActivity:choose_placement
          StartActivity:plan_bundles -> RunActivity:plan_bundles   on the node agent, through the node gateway
          StartActivity:create_vm    -> RunActivity:create_vm

Every span of an allocation's workflow carries `berth.allocation_id` (`AllocationIds`, from the workflow id the
interceptor records), and so do the API's spans of the create from the moment the id is made (the request's own
span included; FastAPI's dependency resolution, which runs before, cannot). Spans leave over OTLP/HTTP in batches
(`OTEL_EXPORTER_OTLP_*`, `OTEL_SERVICE_NAME` as the SDK reads them).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

ALLOCATION_ID = "berth.allocation_id"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_installed = False


def enabled() -> bool:
    return any(os.environ.get(name) for name in _ENDPOINTS)


def configure(service: str) -> bool:
    """Install the OTLP exporter as this process's tracer provider, once; True when tracing is on."""
    global _installed
    if not enabled():
        return False
    if not _installed:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(
            resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
        )
        provider.add_span_processor(allocation_ids())
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _installed = True
    return True


def interceptors(on: bool | None = None) -> list[Any]:
    """The Temporal client interceptors: temporalio's TracingInterceptor when tracing is on (a worker built on the
    client uses it too), none otherwise."""
    if not (enabled() if on is None else on):
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]


def instrument(app: FastAPI, on: bool | None = None) -> None:
    """FastAPI's instrumentation on the app, when tracing is on."""
    if enabled() if on is None else on:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        # The ASGI layer's own receive/send spans are left out: every span Berth exports names what it did.
        FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,metrics", exclude_spans=["receive", "send"])


def tag_allocation(allocation_id: str) -> None:
    """Put the allocation's id on the current span and on its ancestors in this process (the API's request span,
    above FastAPI's endpoint span), when they are being recorded."""
    from opentelemetry import trace  # the API only: a node agent never calls this

    span: Any = trace.get_current_span()
    while span is not None and span.is_recording():
        span.set_attribute(ALLOCATION_ID, allocation_id)
        parent = getattr(span, "parent", None)
        span = _LIVE.get(parent.span_id) if parent is not None else None


# The spans of this process that have started and not ended, by span id (`AllocationIds` keeps it): how
# `tag_allocation` finds a span's ancestors, which OpenTelemetry's API does not hand out.
_LIVE: dict[int, Any] = {}


def allocation_ids() -> Any:
    """A span processor that names the allocation on every span of an allocation's workflow (from the workflow id
    temporalio's interceptor records) and keeps the live spans for `tag_allocation`."""
    from opentelemetry.sdk.trace import SpanProcessor

    class AllocationIds(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            _LIVE[span.context.span_id] = span
            workflow_id = str((span.attributes or {}).get("temporalWorkflowID", ""))
            parent = _LIVE.get(span.parent.span_id) if span.parent is not None else None
            if workflow_id.startswith("allocation/"):
                span.set_attribute(ALLOCATION_ID, workflow_id.removeprefix("allocation/"))
            elif parent is not None and ALLOCATION_ID in (parent.attributes or {}):
                span.set_attribute(ALLOCATION_ID, parent.attributes[ALLOCATION_ID])  # a later step of the request

        def on_end(self, span: Any) -> None:
            _LIVE.pop(span.context.span_id, None)

    return AllocationIds()
