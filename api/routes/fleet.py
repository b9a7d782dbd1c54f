"""`PUT /v1/fleet` (admin): apply a fleet file sent as the body, YAML or JSON, exactly as `berth apply -f` does.

The whole file is validated first and every problem is reported at once (400); an apply that would prune capacity
still held by allocations is refused as a whole (409). Tenants that appear for the first time get a token, returned
once in the answer.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from api import deployment_control
from api.auth import Admin
from api.errors import ApiError, error_responses
from api.services import Services, services
from contracts.http import FleetApplied
from fleet.errors import FleetError
from fleet.kinds import KINDS
from fleet.loader import parse_fleet
from fleet.meta import API_VERSIONS
from store.apply import ApplyRefused, apply_fleet
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
) -> FleetApplied:
    """Make the inventory match the fleet file in the body, changing only what differs."""
    try:
        text = (await request.body()).decode("utf-8")
        fleet = parse_fleet([("request body", text)])
    except UnicodeDecodeError as error:
        raise _invalid(f"the body is not UTF-8 text: {error.reason}") from error
    except RecursionError as error:
        raise _invalid("the body is nested too deeply to be a fleet file") from error
    except FleetError as error:
        problems = [problem.model_dump(exclude_none=True) for problem in error.problems]
        count = len(problems)
        raise _invalid(
            f"the fleet file has {count} problem{'s' if count != 1 else ''}: {error.problems[0]}", problems
        ) from error
    if not any(getattr(fleet, declared.name) for declared in fields(fleet)):
        raise _invalid(
            "the body declares nothing: send a fleet document (apiVersion, kind, metadata) or a List of them"
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
    if result.changed():  # a quota, a node, a region: any may admit a waiting request
        app.admission_passes.ask("fleet applied: " + result.summary())
    if result.replans_deployments():
        await deployment_control.inventory_changed(app.control, "fleet applied: " + result.summary())
    return FleetApplied(
        summary=result.summary(), changes=result.changes, unchanged=result.unchanged, tenant_tokens=tokens
    )
