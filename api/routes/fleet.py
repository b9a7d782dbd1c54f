"""`PUT /v1/fleet` (admin): apply a fleet file sent as the body, YAML or JSON, exactly as `berth apply -f` does.

The body may hold several YAML documents (several files sent as one stream, `---` between them). The whole file is
validated first and every problem is reported at once (400); an apply that would prune capacity still held by
allocations is refused as a whole (409). Kubernetes NodeLists become the cluster `cluster` names (in `region`, its
pools offering `capabilities`), and the nodes no pool took come back in `skipped`. `dry_run` validates and counts,
writing nothing. Tenants that appear for the first time get a token, returned once in the answer; running
deployments are told to re-plan where a placement input changed (`deployments_told`, null when Temporal could not
be told: they re-plan at their next resync).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from api import deployment_control
from api.auth import Admin
from api.errors import ApiError, error_responses
from api.services import Services, services
from contracts.http import FleetApplied, FleetCounts, SkippedNode
from contracts.manifest import Name
from fleet.byo import adopt_node_lists, capability_list
from fleet.errors import FleetError
from fleet.fleet import Fleet
from fleet.kinds import KINDS
from fleet.loader import parse_fleet
from fleet.meta import API_VERSIONS
from store.apply import ApplyRefused, apply_fleet, refuse_non_inventory
from store.outage import DATABASE_ERRORS, refused_value
from store.tokens import ensure_tenant_tokens

router = APIRouter(prefix="/v1", tags=["admin"])
App = Annotated[Services, Depends(services)]

# What the route reads before it looks at a kind's fields: a document is a mapping with apiVersion, kind and
# metadata.name, or a `List` of them (a NodeList of Kubernetes Nodes too). The same shape in JSON or YAML (a YAML
# body may also hold several such documents). Each kind's fields, and how the documents fit together, are checked
# by the route: 400 `invalid_fleet`, every problem listed. A body that declares nothing (empty, `null`, only
# comments, an empty List) is refused too (schemathesis found `null` applied as "no changes"): the schema states it,
# as a document or a List of at least one.
_DOCUMENT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata"],
    "properties": {
        "apiVersion": {"enum": list(API_VERSIONS)},
        "kind": {"enum": sorted(KINDS)},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    },
}
_LIST = {
    "type": "object",
    "required": ["kind", "items"],
    "properties": {
        "kind": {"enum": ["List", "NodeList"]},
        "items": {"type": "array", "minItems": 1, "items": {"type": "object"}},
    },
}
_FLEET = {"anyOf": [_DOCUMENT, _LIST], "description": "A fleet document, or a `kind: List` of them."}
_BODY = {"required": True, "content": {"application/yaml": {"schema": _FLEET}, "application/json": {"schema": _FLEET}}}


def _invalid(message: str, details: object = None) -> ApiError:
    return ApiError(400, "invalid_fleet", _encodable(message), _encodable(details))


def _encodable(value: Any) -> Any:
    """Problems quote the file, and a JSON body may spell lone surrogates (`"\\udc80"`) that no UTF-8 answer can
    carry: each becomes `?` instead of the answer failing (schemathesis found a 500)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_encodable(item) for item in value]
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    return value


def _counts(fleet: Fleet) -> FleetCounts:
    return FleetCounts(
        regions=len(fleet.regions),
        tenants=len(fleet.tenants),
        classes=len(fleet.classes),
        clusters=len(fleet.clusters),
        nodes=sum(len(pool.nodes) for pool in fleet.pools()),
    )


def _problems(error: FleetError) -> ApiError:
    problems = [problem.model_dump(exclude_none=True) for problem in error.problems]
    count = len(problems)
    return _invalid(f"the fleet file has {count} problem{'s' if count != 1 else ''}: {error.problems[0]}", problems)


@router.put(
    "/fleet",
    response_model=FleetApplied,
    responses=error_responses(400, 401, 403, 409, 422),
    openapi_extra={"requestBody": _BODY},
)
async def put_fleet(
    request: Request,
    caller: Admin,
    app: App,
    prune: Annotated[bool, Query(description="Delete what the file no longer declares (refused if held).")] = False,
    dry_run: Annotated[bool, Query(description="Only validate the file (NodeLists adopted); write nothing.")] = False,
    cluster: Annotated[
        Name | None, Query(description="The cluster that NodeList documents (`kubectl get nodes -o yaml`) describe.")
    ] = None,
    region: Annotated[Name | None, Query(description="The region of the cluster a NodeList creates.")] = None,
    capabilities: Annotated[
        str | None,
        Query(
            max_length=4096,
            pattern=r"^[^\x00-\x1f\x7f]*$",
            description="Comma-separated capabilities (vllm,sglang) every pool a NodeList creates offers.",
        ),
    ] = None,
) -> FleetApplied:
    """Make the inventory match the fleet file in the body (one or more YAML documents, or JSON), changing only what
    differs; with `dry_run`, only say whether it is valid and what it declares."""
    try:
        text = (await request.body()).decode("utf-8")
        fleet = parse_fleet([("request body", text)])
        fleet, skipped = adopt_node_lists(fleet, cluster, region, capability_list(capabilities))
    except UnicodeDecodeError as error:
        raise _invalid(f"the body is not UTF-8 text: {error.reason}") from error
    except RecursionError as error:
        raise _invalid("the body is nested too deeply to be a fleet file") from error
    except FleetError as error:
        raise _problems(error) from error
    if not any(getattr(fleet, declared.name) for declared in fields(fleet)):
        raise _invalid(
            "the body declares nothing: send a fleet document (apiVersion, kind, metadata) or a List of them"
        )
    left_out = [SkippedNode(name=node.name, reason=node.reason) for node in skipped]
    counts = _counts(fleet)
    if dry_run:
        try:
            refuse_non_inventory(fleet)
        except ApplyRefused as error:
            raise ApiError(409, "apply_refused", str(error)) from error
        declared = ", ".join(f"{number} {kind}" for kind, number in counts.model_dump().items())
        return FleetApplied(
            summary=f"valid: {declared}",
            dry_run=True,
            counts=counts,
            changes=[],
            unchanged=0,
            skipped=left_out,
            tenant_tokens={},
            deployments_told=0,
        )
    try:
        async with app.sessions.begin() as session:
            result = await apply_fleet(session, fleet, prune=prune)
            tokens = await ensure_tenant_tokens(session)
    except ApplyRefused as error:
        raise ApiError(409, "apply_refused", str(error)) from error
    except DATABASE_ERRORS as error:
        if (refused := refused_value(error)) is None:
            raise  # an outage or a bug: the API's database handler answers it
        raise _invalid(f"PostgreSQL refused a value of the fleet file: {refused}") from error
    told: int | None = 0
    if result.changed():  # a quota, a node, a region: any may admit a waiting request
        app.admission_passes.ask("fleet applied: " + result.summary())
    if result.replans_deployments():
        told = await deployment_control.inventory_changed(app.control, "fleet applied: " + result.summary())
    return FleetApplied(
        summary=result.summary(),
        counts=counts,
        changes=result.changes,
        unchanged=result.unchanged,
        skipped=left_out,
        tenant_tokens=tokens,
        deployments_told=told,
    )
