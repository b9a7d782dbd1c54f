"""Thin functions around the `Reconcile` workflow: the Schedule that runs it every minute, and a run now.

The Schedule is created by the control worker on start (`worker.run_control`), idempotently: a second worker, or
the same one restarted, finds it there and leaves it (an operator may have paused it or changed its interval in the
Temporal UI). Its settings come from `BERTH_RECONCILER_*` variables.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)

from contracts.audit import AuditReport
from contracts.task_queues import Queues
from workflows.reconcile.workflow import ReconcileInput, ReconcileWorkflow

SCHEDULE_ID = "berth-reconciler"


class ReconcilerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BERTH_RECONCILER_", extra="ignore")

    schedule_id: str = SCHEDULE_ID
    every_seconds: float = Field(default=60.0, gt=0, description="How often the Schedule runs an audit.")
    repair: bool = Field(default=False, description="Whether scheduled audits repair what is safe (else report only).")
    orphan_grace_seconds: float = Field(default=600.0, ge=0, description="Orphan VMs younger than this wait an audit.")
    agent_pickup_seconds: float = Field(default=5.0, gt=0, description="An agent slower to pick up is unreachable.")


def scheduled_input(settings: ReconcilerSettings, queues: Queues) -> ReconcileInput:
    return ReconcileInput(
        repair=settings.repair,
        trigger="schedule",
        orphan_grace_seconds=settings.orphan_grace_seconds,
        agent_pickup_seconds=settings.agent_pickup_seconds,
        queues=queues,
    )


async def ensure_schedule(client: Client, queues: Queues, settings: ReconcilerSettings | None = None) -> bool:
    """Create the reconciler's Schedule unless it exists; True if this call created it."""
    settings = settings or ReconcilerSettings()
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            ReconcileWorkflow.run,
            scheduled_input(settings, queues),
            id=f"reconcile/{settings.schedule_id}",
            task_queue=queues.control,
            static_summary="reconciler: PostgreSQL vs Temporal vs the hosts",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.every_seconds))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(settings.schedule_id, schedule)
    except ScheduleAlreadyRunningError:
        return False
    return True


async def run_now(
    client: Client, input: ReconcileInput, wait_seconds: float, workflow_id: str | None = None
) -> AuditReport:
    """Start an audit and wait for its report, at most `wait_seconds` (`TimeoutError` after that)."""
    handle = await client.start_workflow(
        ReconcileWorkflow.run,
        input,
        id=workflow_id or f"reconcile/{input.trigger}-{uuid.uuid4().hex[:12]}",
        task_queue=input.queues.control,
        static_summary=f"reconciler ({input.trigger}{', repair' if input.repair else ''})",
        execution_timeout=timedelta(seconds=max(wait_seconds * 4, 300)),
    )
    return await asyncio.wait_for(handle.result(), wait_seconds)
