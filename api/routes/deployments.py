"""`/v1/deployments` and `/v1/namespaces/{namespace}/deployments` (admin): create or update, read, list and delete
ModelDeployments.

Deployments are namespaced, as Modelplane's are: the same name in two namespaces is two deployments, each its own
workflow (`deployment/<name>` in `default`, `deployment/<namespace>/<name>` elsewhere). `/v1/deployments/{name}`
is the `default` namespace, as it always was; `GET /v1/deployments` lists every namespace (`?namespace=` filters),
at most `limit` (1,000) a page, with `next_cursor` for the next (api/cursor.py).
A body whose `metadata.namespace` is not the one addressed is a 422 naming that field.

Deployments are admin-scoped: the schema has no tenant for them (a ModelDeployment is platform capacity placed on
the platform's clusters), so a tenant token gets 403. A PUT validates the whole manifest first (schema, then every
CEL selector compiled): a bad one is a 422 naming each field, and nothing is started or changed. A good one starts
the deployment's workflow, or hands the running one the new spec as a validated update. Reads come from the
running workflow's status query, or, when it cannot answer, from the status it last recorded in PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Depends, Path, Query, Request

from api import cursor, deployment_control
from api.auth import Admin
from api.cursor import CursorParam
from api.errors import ApiError, error_responses, not_found
from api.long_poll import Wait, waiting
from api.services import Services, services
from contracts.deployment import DEPLOYMENT_FINAL_STATES, DEPLOYMENT_STATES
from contracts.http import DeploymentAccepted, DeploymentList, DeploymentSummary, DeploymentView
from contracts.manifest import DEFAULT_NAMESPACE, Name
from store.deployments import deployment_page, load_deployment
from workflows.deployment.client import workflow_id
from workflows.deployment.messages import DeploymentStatus, qualified_name
from workflows.deployment.spec import InvalidSpec, check_manifest, normalised

router = APIRouter(prefix="/v1", tags=["deployments"])
App = Annotated[Services, Depends(services)]
NamePath = Annotated[Name, Path(description="The deployment's name (its metadata.name).")]
NamespacePath = Annotated[Name, Path(description="The deployment's namespace (its metadata.namespace).")]
LEGACY = "/deployments/{name}"  # the `default` namespace
NAMESPACED = "/namespaces/{namespace}/deployments/{name}"

_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"type": "object", "description": "A ModelDeployment (Modelplane's shape)."}},
        "application/yaml": {"schema": {"type": "string", "description": "The same, as one YAML document."}},
    },
}


def _invalid_body(message: str) -> ApiError:
    problem = {"field": "body", "message": message, "type": "unparsable"}
    return ApiError(422, "invalid_request", f"the request is not valid: {message}", [problem])


async def _manifest(request: Request) -> Any:
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _invalid_body(f"the body is not UTF-8 text: {error.reason}") from error
    if not text.strip():
        raise _invalid_body("the body is empty; send a ModelDeployment")
    try:
        if "yaml" in request.headers.get("content-type", ""):
            return yaml.safe_load(text)
        return json.loads(text)
    except (ValueError, yaml.YAMLError, RecursionError) as error:
        raise _invalid_body(f"the body does not parse: {' '.join(str(error).split())[:200]}") from error


def _view(status: DeploymentStatus, live: bool) -> DeploymentView:
    return DeploymentView(
        **status.model_dump(exclude={"reconciles"}), workflow_id=workflow_id(status.name, status.namespace), live=live
    )


def _accepted(namespace: str, name: str, created: bool) -> DeploymentAccepted:
    """The workflow id tells the namespace apart (`deployment/<namespace>/<name>` outside `default`)."""
    return DeploymentAccepted(name=name, created=created, workflow_id=workflow_id(name, namespace))


def _not_found(namespace: str, name: str) -> ApiError:
    return not_found("deployment", qualified_name(name, namespace))


async def _put(namespace: str, name: str, request: Request, app: Services) -> DeploymentAccepted:
    manifest = await _manifest(request)
    try:
        deployment = check_manifest(manifest, name, namespace)
    except InvalidSpec as error:
        details = [
            {**p.model_dump(), "field": f"body.{p.field}" if p.field != "body" else "body"} for p in error.problems
        ]
        raise ApiError(422, "invalid_request", str(error), details) from error
    await app.control.require_worker()
    created = await deployment_control.apply(
        app.control, name, normalised(deployment), app.deployment_timing, namespace
    )
    return _accepted(namespace, name, created)


async def _get(namespace: str, name: str, app: Services) -> DeploymentView:
    live = await deployment_control.live_status(app.control, name, namespace)
    if live is not None and live.state != "deleted":
        return _view(live, live=True)
    async with app.sessions() as session:
        row = await load_deployment(session, namespace, name)
    if row is None:
        raise _not_found(namespace, name)
    recorded = DeploymentStatus.model_validate(
        {"name": name, "desired": row.replicas, **(row.status or {}), "namespace": namespace}
    )
    return _view(recorded, live=False)


async def _delete(namespace: str, name: str, app: Services) -> DeploymentAccepted:
    if not await deployment_control.running(app.control, name, namespace):
        raise _not_found(namespace, name)
    await app.control.require_worker()
    await deployment_control.delete(app.control, name, namespace)
    return _accepted(namespace, name, created=False)


_PUT = {
    "status_code": 202,
    "response_model": DeploymentAccepted,
    "responses": {**error_responses(401, 403, 409, 422, 503)},
    "openapi_extra": {"requestBody": _BODY},
}
_GET = {"response_model": DeploymentView, "responses": error_responses(401, 403, 404, 422)}
_DELETE = {
    "status_code": 202,
    "response_model": DeploymentAccepted,
    "responses": error_responses(401, 403, 404, 409, 503),
}


@router.put(LEGACY, **_PUT)
async def put_deployment(name: NamePath, request: Request, caller: Admin, app: App) -> DeploymentAccepted:
    """Create the deployment (namespace `default`), or give it a new spec; its workflow reconciles the replicas to
    match."""
    return await _put(DEFAULT_NAMESPACE, name, request, app)


@router.put(NAMESPACED, **_PUT)
async def put_namespaced_deployment(
    namespace: NamespacePath, name: NamePath, request: Request, caller: Admin, app: App
) -> DeploymentAccepted:
    """Create the deployment in `namespace`, or give it a new spec; its workflow reconciles the replicas to match."""
    return await _put(namespace, name, request, app)


Waiting = Annotated[Wait | None, Depends(waiting("deployment", DEPLOYMENT_STATES, DEPLOYMENT_FINAL_STATES))]


async def _get_waiting(namespace: str, name: str, app: Services, wait: Wait | None) -> DeploymentView:
    if wait is None:
        return await _get(namespace, name, app)
    return await wait.until(lambda: _get(namespace, name, app), lambda view: view.state)


@router.get(LEGACY, **_GET)
async def get_deployment(name: NamePath, caller: Admin, app: App, wait: Waiting) -> DeploymentView:
    """Desired vs available replicas, each replica's cluster and pools, and the scheduler's explanation (namespace
    `default`). With `wait_for`, answered once it is in one of those states or deleted, or at `timeout`
    (api/long_poll.py)."""
    return await _get_waiting(DEFAULT_NAMESPACE, name, app, wait)


@router.get(NAMESPACED, **_GET)
async def get_namespaced_deployment(
    namespace: NamespacePath, name: NamePath, caller: Admin, app: App, wait: Waiting
) -> DeploymentView:
    """Desired vs available replicas, each replica's cluster and pools, and the scheduler's explanation. With
    `wait_for`, answered once it is in one of those states or deleted, or at `timeout` (api/long_poll.py)."""
    return await _get_waiting(namespace, name, app, wait)


@router.get("/deployments", response_model=DeploymentList, responses=error_responses(401, 403, 422))
async def list_deployments(
    caller: Admin,
    app: App,
    namespace: Annotated[Name | None, Query(description="Only the deployments of this namespace.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many on the page.")] = 1000,
    cursor_: Annotated[CursorParam, Query(alias="cursor")] = None,
) -> DeploymentList:
    """Every deployment (of every namespace, unless one is given) with the status its workflow last recorded, by
    namespace and name, a page at a time (keyset on the primary key): follow `next_cursor` until it is null."""
    after = None
    if cursor_ is not None:
        after_namespace, after_name = cursor.decode(cursor_, "deployments", 2)
        after = (after_namespace, after_name)
    async with app.sessions() as session:
        found = await deployment_page(session, namespace=namespace, after=after, limit=limit + 1)
    rows = found[:limit]
    more = len(found) > limit
    return DeploymentList(
        next_cursor=cursor.encode("deployments", rows[-1].namespace, rows[-1].name) if more else None,
        deployments=[
            DeploymentSummary(
                namespace=row.namespace,
                name=row.name,
                state=(row.status or {}).get("state"),
                desired=row.replicas,
                available=int((row.status or {}).get("available") or 0),
                phase=(row.status or {}).get("phase"),
                message=str((row.status or {}).get("message") or ""),
            )
            for row in rows
        ],
    )


@router.delete(LEGACY, **_DELETE)
async def delete_deployment(name: NamePath, caller: Admin, app: App) -> DeploymentAccepted:
    """Tear down every replica (workloads deleted, ledger released), then the deployment itself (namespace
    `default`)."""
    return await _delete(DEFAULT_NAMESPACE, name, app)


@router.delete(NAMESPACED, **_DELETE)
async def delete_namespaced_deployment(
    namespace: NamespacePath, name: NamePath, caller: Admin, app: App
) -> DeploymentAccepted:
    """Tear down every replica (workloads deleted, ledger released), then the deployment itself."""
    return await _delete(namespace, name, app)
