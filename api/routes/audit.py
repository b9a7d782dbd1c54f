"""`/v1/audit` (admin): the reconciler's findings, and an audit run now.

`GET` answers from PostgreSQL (the latest finished audit, scheduled or not), so it works while Temporal is down.
`POST` starts a `Reconcile` workflow on the control queue and waits for its report, bounded: a Temporal that is
unreachable or a control worker that is absent or silent is a 503 naming which, and the audit is not started (or,
after a timeout, may still finish: `GET` shows it then).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import AwareDatetime
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from api.auth import Operator
from api.errors import error_responses, unavailable
from api.services import Services, services
from contracts.audit import AuditReport, Finding
from contracts.http import AuditRequest, AuditView, RequestRecord, RequestRecords
from store import requests
from store.audit import latest_run, report_of
from workflows.reconcile.client import ReconcilerSettings, run_now
from workflows.reconcile.workflow import ReconcileInput

router = APIRouter(prefix="/v1/audit", tags=["admin"])
App = Annotated[Services, Depends(services)]

AUDIT_WAIT_SECONDS = 60.0  # an unreachable agent costs its pickup timeout; repairs wipe slots


def _view(report: AuditReport | None) -> AuditView:
    if report is None:
        return AuditView(ran=False)
    return AuditView(ran=True, counts=_counts(report.findings), report=report)


def _counts(findings: list[Finding]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.kind.value] = counts.get(finding.kind.value, 0) + 1
    return dict(sorted(counts.items()))


@router.get("", response_model=AuditView, responses=error_responses(401, 403, 503))
async def latest(app: App, _: Operator) -> AuditView:
    """The findings of the latest finished audit (the Schedule runs one every minute)."""
    async with app.sessions() as session:
        run = await latest_run(session)
        return _view(await report_of(session, run) if run is not None else None)


@router.post("", response_model=AuditView, responses=error_responses(401, 403, 422, 503))
async def audit_now(app: App, _: Operator, request: AuditRequest | None = None) -> AuditView:
    """Run an audit now and answer its findings and, with `repair`, what it fixed."""
    request = request or AuditRequest()
    await app.control.require_worker()
    client = await app.control.client()
    settings = ReconcilerSettings()
    input = ReconcileInput(
        repair=request.repair,
        trigger="api",
        orphan_grace_seconds=settings.orphan_grace_seconds,
        agent_pickup_seconds=app.timing.agent_pickup_seconds,
        queues=app.control.queues,
    )
    try:
        report = await run_now(client, input, AUDIT_WAIT_SECONDS)
    except TimeoutError as error:
        raise unavailable(
            "no_control_worker",
            f"the audit did not finish within {AUDIT_WAIT_SECONDS:g}s; it may still finish: GET /v1/audit shows it",
        ) from error
    except WorkflowFailureError as error:
        cause = error.cause
        message = getattr(cause, "message", None) or str(cause or error)
        raise unavailable("audit_failed", f"the audit could not finish: {message}") from error
    except RPCError as error:
        raise unavailable("temporal_unavailable", f"Temporal did not accept the audit: {error.message}") from error
    return _view(report)


@router.get("/requests", response_model=RequestRecords, responses=error_responses(401, 403, 422))
async def requests_made(
    app: App,
    _: Operator,
    actor: Annotated[str | None, Query(max_length=400, description="Only this actor's.")] = None,
    since: Annotated[
        AwareDatetime | None, Query(description="Only from this instant (RFC 3339, with an offset).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> RequestRecords:
    """Mutating requests, who made them and how they were answered (api/request_log.py): actions on nodes, the
    fleet and deployments as well as allocations, refusals included."""
    async with app.sessions() as session:
        rows = await requests.newest(session, actor=actor, since=since, limit=limit)
    return RequestRecords(
        requests=[
            RequestRecord(
                at=r.at, actor=r.actor, role=r.role, method=r.method, route=r.route, path=r.path, status=r.status
            )
            for r in rows
        ]
    )
