"""The API's resources, each method written once as async code over `berth._http.Http` and declaring the route it
calls (`berth.routes`). `berth.AsyncClient` exposes them as they are; `berth.Client` through sync classes generated
from these (berth/_sync.py), driving the same coroutines over a transport that never suspends."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, TypeVar, get_args, get_origin

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.json_schema import WithJsonSchema

from berth import errors
from berth._http import Http
from berth.routes import Route, calls
from contracts.allocation import ALLOCATION_STATES, FINAL_STATES
from contracts.http import (
    AllocationAccepted,
    AllocationCreate,
    AllocationDetail,
    AllocationEnd,
    AllocationList,
    AllocationSummary,
    AuditRequest,
    AuditView,
    AuthConfig,
    CapacityAt,
    CapacityReport,
    DeploymentAccepted,
    DeploymentList,
    DeploymentSummary,
    DeploymentView,
    DrainResult,
    ExtendBody,
    FleetApplied,
    Health,
    NodeInfo,
    NodeList,
    QueueList,
    QueuePlace,
    RepairBody,
    RepairResult,
    RequestRecord,
    RequestRecords,
    ReservationCreate,
    ReservationList,
    ReservationView,
    RetryBody,
    TokenCreate,
    TokenCreated,
    TokenList,
    TokensRevoked,
    TokenView,
    UsageReport,
    WhoAmI,
)
from contracts.manifest import DEFAULT_NAMESPACE
from contracts.placement import PlacementResult

M = TypeVar("M", bound=BaseModel)

LONG_POLL_SECONDS = 30.0  # one long-poll's own wait: under proxies' idle timeouts, well above a step's length
SLOWEST_POLL_SECONDS = 5.0  # an API without long polls answers at once: then the gap between reads grows to this


class Allocation(AllocationDetail):
    """An allocation as `GET /v1/allocations/{id}` shows it, with `address`: where to reach it."""

    @property
    def address(self) -> str | None:
        """The VM's private IP: its first slot bundle's (a slice VM has one address, the same on every bundle of
        it). None while it is not placed, for a bare-metal node without one, or once its slots are given back."""
        return next((bundle.private_ip for bundle in self.bundles if bundle.private_ip), None)


Allocation.model_rebuild(_types_namespace={"QueuePlace": QueuePlace})


def wire(model: BaseModel) -> Any:
    """A request model as the API takes it: JSON, unset fields left out, and durations as strings with their unit
    (the models hold them as seconds; the API refuses a bare number)."""
    return _durations_as_text(model, model.model_dump(mode="json", exclude_none=True))


def _durations_as_text(model: BaseModel, data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    for name, field in type(model).model_fields.items():
        key = field.serialization_alias or field.alias or name
        if key not in data:
            continue
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            data[key] = _durations_as_text(value, data[key])
        elif isinstance(data[key], int | float) and _published_as_string(field.annotation, field.metadata):
            data[key] = seconds_text(float(data[key]))
    return data


def _published_as_string(annotation: Any, metadata: Iterable[Any] = ()) -> bool:
    """A number the API publishes as a string (`WithJsonSchema` type string): a duration, or a token's lifetime."""
    if any(isinstance(meta, WithJsonSchema) and (meta.json_schema or {}).get("type") == "string" for meta in metadata):
        return True
    if get_origin(annotation) is Annotated:
        inner, *extra = get_args(annotation)
        return _published_as_string(inner, extra)
    return any(_published_as_string(arg) for arg in get_args(annotation))


def seconds_text(seconds: float) -> str:
    """Seconds as a duration the API parses: 14400.0 -> "14400s", 0 -> "0"."""
    return "0" if seconds == 0 else f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def duration_text(value: str | float | None) -> str | None:
    """A duration argument: a string as given (`"4h"`), a number as seconds."""
    if value is None or isinstance(value, str):
        return value
    return seconds_text(float(value))


def allocation_body(request: AllocationCreate | Mapping[str, Any] | None, fields: Mapping[str, Any]) -> Any:
    """The body of a create or an explain (see `body`), where the keyword fields `gpus=8` (an int) and
    `product="H200"` are short for `gpu_count` and `gpu_product` (a list of PCI addresses as `gpus` pins them, as in
    the body), and `queue="30m"` for `queue={"timeout": "30m"}`."""
    shorthand = dict(fields)
    if isinstance(shorthand.get("gpus"), int):
        shorthand["gpu_count"] = shorthand.pop("gpus")
    if "product" in shorthand:
        shorthand["gpu_product"] = shorthand.pop("product")
    if isinstance(shorthand.get("queue"), str):
        shorthand["queue"] = {"timeout": shorthand["queue"]}
    return body(AllocationCreate, request, shorthand, durations=("duration",))


def body(
    model: type[BaseModel],
    request: BaseModel | Mapping[str, Any] | None,
    fields: Mapping[str, Any],
    *,
    durations: Sequence[str] = (),
) -> Any:
    """A request body as JSON, from one of three things: `request`, a model instance (sent as it is); `request`, a
    mapping (JSON already, sent as it is: the API is its judge, as for a body read from a file or typed at a
    prompt); or keyword `fields`, checked against `model` before anything is sent, so a mistake is an
    `InvalidRequest` in the API's own words without a round trip. Numbers given for the `durations` fields are
    seconds."""
    if request is not None:
        if fields:
            raise TypeError(f"give a {model.__name__} (or a mapping) or keyword fields, not both")
        return wire(request) if isinstance(request, BaseModel) else dict(request)
    given = {name: value for name, value in fields.items() if value is not None}
    for name in durations:
        if isinstance(given.get(name), int | float) and not isinstance(given.get(name), bool):
            given[name] = seconds_text(float(given[name]))
    try:
        return wire(model.model_validate(given))
    except ValidationError as error:
        raise errors.invalid_request(error.errors(include_url=False)) from None


def _at(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _states(wanted: Iterable[str]) -> tuple[str, ...]:
    states = tuple(wanted)
    if not states:
        raise TypeError("name at least one state to wait for")
    return states


class Resource:
    def __init__(self, http: Http) -> None:
        self._http = http

    async def _answer(
        self, route: Route, model: type[M] | None = None, /, *, path: Mapping[str, str] | None = None, **call: Any
    ) -> Any:
        response = await self._http.call(
            route.method, route.format(**(path or {})), idempotent=call.pop("idempotent", route.safe_to_repeat), **call
        )
        if model is None:
            return response
        try:
            return model.model_validate(response.json())
        except ValueError as error:
            raise errors.BerthError(
                f"the API answered {route.method} {route.path} in an unexpected shape (another version of Berth?): "
                f"{str(error).splitlines()[0]}",
                code="unexpected_answer",
                status=response.status_code,
            ) from error

    async def _pages(
        self, route: Route, key: str, model: type[M], params: Mapping[str, Any], page_size: int | None
    ) -> AsyncIterator[M]:
        """Every item of a keyset-paged list, a page (`limit`) at a time, following `next_cursor` to the end."""
        cursor: str | None = None
        followed: set[str] = set()
        while True:
            response = await self._answer(route, params={**params, "limit": page_size, "cursor": cursor})
            page = response.json()
            for item in page[key]:
                yield model.model_validate(item)
            cursor = page.get("next_cursor")
            if not cursor:
                return
            if cursor in followed:  # a cursor already followed would page forever
                raise errors.BerthError(
                    f"the API answered {route.path} with a page cursor it had already given", code="unexpected_answer"
                )
            followed.add(cursor)

    async def _long_poll(
        self,
        route: Route,
        model: type[M],
        path: Mapping[str, str],
        wanted: tuple[str, ...],
        final: Iterable[str],
        timeout: float,  # noqa: ASYNC109 - a deadline over many long polls, under both drivers
    ) -> M:
        """Read until the thing is in one of `wanted`, asking the API to hold each read until then (`wait_for`,
        `timeout`): no busy polling. Ending in another final state raises `Ended`; `timeout` passing, `TimedOut`.
        An API that does not hold reads answers at once; then the reads are spaced, up to SLOWEST_POLL_SECONDS."""
        deadline = time.monotonic() + timeout
        gap = 0.25
        while True:
            left = deadline - time.monotonic()
            hold = max(min(left, LONG_POLL_SECONDS), 0.0)
            asked = time.monotonic()
            found = await self._answer(
                route,
                model,
                path=path,
                params={"wait_for": ",".join(wanted), "timeout": seconds_text(round(hold, 3))},
                read_timeout=hold + self._http.timeouts.read,
            )
            state = found.state  # type: ignore[attr-defined]
            if state in wanted:
                return found
            if state in final:
                reason = getattr(found, "failure_reason", None) or getattr(found, "reason", None)
                raise errors.Ended(
                    f"{route.format(**path)} ended {state}" + (f": {reason}" if reason else ""), code=state
                )
            if time.monotonic() >= deadline:
                raise errors.TimedOut(
                    f"{route.format(**path)} is still {state} after {timeout:g}s (waited for {', '.join(wanted)})",
                    code="timed_out",
                )
            if time.monotonic() - asked < hold / 2:  # not held: an API without long polls
                await self._http.transport.sleep(min(gap, max(deadline - time.monotonic(), 0.0)))
                gap = min(gap * 2, SLOWEST_POLL_SECONDS)

    async def _watch(
        self,
        route: Route,
        model: type[M],
        path: Mapping[str, str],
        states: Iterable[str],
        final: Iterable[str],
        timeout: float,  # noqa: ASYNC109 - a deadline over many long polls, under both drivers
    ) -> AsyncIterator[M]:
        """The thing as it is now, then again each time its state changes, by long polls that wait for any other
        state: it ends after a final state, or quietly when `timeout` passes (the last one yielded is where it
        stands)."""
        deadline = time.monotonic() + timeout
        found = await self._answer(route, model, path=path)
        yield found
        gap = 0.25
        while found.state not in final:  # type: ignore[attr-defined]
            left = deadline - time.monotonic()
            if left <= 0:
                return
            hold = min(left, LONG_POLL_SECONDS)
            others = [state for state in states if state != found.state]  # type: ignore[attr-defined]
            asked = time.monotonic()
            now = await self._answer(
                route,
                model,
                path=path,
                params={"wait_for": ",".join(others), "timeout": seconds_text(round(hold, 3))},
                read_timeout=hold + self._http.timeouts.read,
            )
            if now.state != found.state:  # type: ignore[attr-defined]
                yield now
            elif time.monotonic() - asked < hold / 2:  # not held: an API without long polls
                await self._http.transport.sleep(min(gap, max(deadline - time.monotonic(), 0.0)))
                gap = min(gap * 2, SLOWEST_POLL_SECONDS)
            found = now


CREATE_ALLOCATION = Route("POST", "/v1/allocations", idempotent=True)  # always sent with an Idempotency-Key
LIST_ALLOCATIONS = Route("GET", "/v1/allocations")
GET_ALLOCATION = Route("GET", "/v1/allocations/{allocation_id}")
RELEASE_ALLOCATION = Route("DELETE", "/v1/allocations/{allocation_id}")
CANCEL_ALLOCATION = Route("POST", "/v1/allocations/{allocation_id}/cancel", idempotent=True)
RETRY_ALLOCATION = Route("POST", "/v1/allocations/{allocation_id}/retry", idempotent=False)
EXTEND_ALLOCATION = Route("POST", "/v1/allocations/{allocation_id}/extend", idempotent=False)


class Allocations(Resource):
    """GPUs for a tenant, from request to release (`/v1/allocations`)."""

    @calls(CREATE_ALLOCATION)
    async def create(
        self,
        request: AllocationCreate | Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> AllocationAccepted:
        """Ask for an allocation: an `AllocationCreate`, or its fields as keywords (`gpus=2, product="H200",
        duration="4h", tenant="acme"`). Every create carries an Idempotency-Key (a fresh one unless given), so a
        retry after a lost answer is the same allocation, never a second."""
        key = idempotency_key or f"berth-py-{uuid.uuid4().hex}"
        json = allocation_body(request, fields)
        return await self._answer(CREATE_ALLOCATION, AllocationAccepted, json=json, headers={"Idempotency-Key": key})

    @calls(LIST_ALLOCATIONS)
    async def list(
        self,
        *,
        state: str | None = None,
        region: str | None = None,
        node: str | None = None,
        tenant: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[AllocationSummary]:
        """Every allocation the token may see, newest first, fetched a page (`page_size`, the API's `limit`) at a
        time."""
        params = {"state": state, "region": region, "node": node, "tenant": tenant}
        async for item in self._pages(LIST_ALLOCATIONS, "allocations", AllocationSummary, params, page_size):
            yield item

    @calls(LIST_ALLOCATIONS)
    async def page(
        self,
        *,
        state: str | None = None,
        region: str | None = None,
        node: str | None = None,
        tenant: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> AllocationList:
        """One page, from `cursor` (a `next_cursor` an earlier page gave): for a program that keeps its place."""
        params = {"state": state, "region": region, "node": node, "tenant": tenant, "limit": limit, "cursor": cursor}
        return await self._answer(LIST_ALLOCATIONS, AllocationList, params=params)

    @calls(GET_ALLOCATION)
    async def get(self, allocation_id: str) -> Allocation:
        return await self._answer(GET_ALLOCATION, Allocation, path={"allocation_id": allocation_id})

    @calls(GET_ALLOCATION)
    async def wait(self, allocation_id: str, *states: str, timeout: float = 600.0) -> Allocation:  # noqa: ASYNC109
        """Until the allocation is in one of `states` (default `active`), by long polls: `Ended` if it ends in
        another state first, `TimedOut` after `timeout` seconds."""
        wanted = _states(states or ("active",))
        return await self._long_poll(
            GET_ALLOCATION, Allocation, {"allocation_id": allocation_id}, wanted, FINAL_STATES, timeout
        )

    @calls(GET_ALLOCATION)
    async def watch(self, allocation_id: str, *, timeout: float = 600.0) -> AsyncIterator[Allocation]:  # noqa: ASYNC109
        """The allocation now, then each time its state changes, until it ends (or `timeout` passes): what `berth
        alloc create --wait` prints as it goes. Long polls, never a busy loop."""
        path = {"allocation_id": allocation_id}
        async for allocation in self._watch(GET_ALLOCATION, Allocation, path, ALLOCATION_STATES, FINAL_STATES, timeout):
            yield allocation

    @calls(RELEASE_ALLOCATION)
    async def release(self, allocation_id: str) -> AllocationAccepted:
        """Give it back (202; also when already releasing or released, so it is retried safely)."""
        return await self._answer(RELEASE_ALLOCATION, AllocationAccepted, path={"allocation_id": allocation_id})

    @calls(CANCEL_ALLOCATION)
    async def cancel(self, allocation_id: str) -> AllocationAccepted:
        """Stop one queued, being placed or active (202; also when already cancelled)."""
        return await self._answer(CANCEL_ALLOCATION, AllocationAccepted, path={"allocation_id": allocation_id})

    @calls(EXTEND_ALLOCATION)
    async def extend(
        self, allocation_id: str, *, by: str | float | None = None, until: datetime | None = None
    ) -> AllocationEnd:
        """Move an active allocation's end: `by` a duration (`"2h"`, or seconds) from its current end, or `until`."""
        json = body(ExtendBody, None, {"by": duration_text(by), "until": until})
        return await self._answer(EXTEND_ALLOCATION, AllocationEnd, path={"allocation_id": allocation_id}, json=json)

    @calls(RETRY_ALLOCATION)
    async def retry(self, allocation_id: str, *, exclude_nodes: Sequence[str] = ()) -> AllocationAccepted:
        """An operator's retry: being placed, go on with the next node; failed, place it again as a new run."""
        json = wire(RetryBody(exclude_nodes=list(exclude_nodes)))
        return await self._answer(
            RETRY_ALLOCATION, AllocationAccepted, path={"allocation_id": allocation_id}, json=json
        )


CREATE_RESERVATION = Route("POST", "/v1/reservations", idempotent=False)
LIST_RESERVATIONS = Route("GET", "/v1/reservations")
GET_RESERVATION = Route("GET", "/v1/reservations/{reservation_id}")
CANCEL_RESERVATION = Route("DELETE", "/v1/reservations/{reservation_id}")
RESERVATION_FINAL = ("ended", "cancelled", "failed")


class Reservations(Resource):
    """GPUs of one node held for a window in the future (`/v1/reservations`)."""

    @calls(CREATE_RESERVATION)
    async def create(
        self, request: ReservationCreate | Mapping[str, Any] | None = None, **fields: Any
    ) -> ReservationView:
        """Reserve: a `ReservationCreate` or its fields (`gpu_count`, `region`, `starts_at`, `duration` or
        `ends_at`, ...). The API takes no Idempotency-Key here, so a lost answer is not retried."""
        json = body(ReservationCreate, request, fields, durations=("duration",))
        return await self._answer(CREATE_RESERVATION, ReservationView, json=json)

    @calls(LIST_RESERVATIONS)
    async def list(self) -> AsyncIterator[ReservationView]:
        for reservation in (await self._answer(LIST_RESERVATIONS, ReservationList)).reservations:
            yield reservation

    @calls(GET_RESERVATION)
    async def get(self, reservation_id: str) -> ReservationView:
        return await self._answer(GET_RESERVATION, ReservationView, path={"reservation_id": reservation_id})

    @calls(GET_RESERVATION)
    async def wait(self, reservation_id: str, *states: str, timeout: float = 600.0) -> ReservationView:  # noqa: ASYNC109
        """Until the reservation is in one of `states` (default `started`), by long polls."""
        wanted = _states(states or ("started",))
        path = {"reservation_id": reservation_id}
        return await self._long_poll(GET_RESERVATION, ReservationView, path, wanted, RESERVATION_FINAL, timeout)

    @calls(CANCEL_RESERVATION)
    async def cancel(self, reservation_id: str) -> ReservationView:
        """Cancel it (202): its workflow cancels it, and after its start its allocation."""
        return await self._answer(CANCEL_RESERVATION, ReservationView, path={"reservation_id": reservation_id})


LIST_QUEUES = Route("GET", "/v1/queues")


class Queues(Resource):
    @calls(LIST_QUEUES)
    async def get(self, *, region: str | None = None, pool: str | None = None) -> QueueList:
        """Each region's waiting requests in admission order (a tenant's token: its own, at their places)."""
        return await self._answer(LIST_QUEUES, QueueList, params={"region": region, "pool": pool})


CAPACITY_NOW = Route("GET", "/v1/capacity")
CAPACITY_AT = Route("GET", "/v1/capacity/at")


class Capacity(Resource):
    @calls(CAPACITY_NOW)
    async def now(self, *, region: str | None = None, gpu_product: str | None = None) -> CapacityReport:
        return await self._answer(CAPACITY_NOW, CapacityReport, params={"region": region, "gpu_product": gpu_product})

    @calls(CAPACITY_AT)
    async def at(self, at: datetime | str, *, region: str | None = None) -> CapacityAt:
        """What each pool holds, has reserved and has free at an instant (with an offset)."""
        return await self._answer(CAPACITY_AT, CapacityAt, params={"at": _at(at), "region": region})


LIST_NODES = Route("GET", "/v1/nodes")
GET_NODE = Route("GET", "/v1/nodes/{node}")
CORDON = Route("POST", "/v1/nodes/{node}/cordon", idempotent=True)
UNCORDON = Route("POST", "/v1/nodes/{node}/uncordon", idempotent=True)
DRAIN = Route("POST", "/v1/nodes/{node}/drain", idempotent=True)
REPAIR = Route("POST", "/v1/nodes/{node}/repair", idempotent=False)
REPORT = Route("POST", "/v1/nodes/{node}/report", idempotent=True)  # a report says what is, not what changes


class Nodes(Resource):
    """GPU hosts (`/v1/nodes`): operators act on them; a tenant reads those of the regions it may use."""

    @calls(LIST_NODES)
    async def list(
        self,
        *,
        region: str | None = None,
        status: str | None = None,
        pool: str | None = None,
        out_of_placement: bool | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[NodeInfo]:
        """Every node, of the region, status and pool (`cluster/pool`) when given; `out_of_placement`: only those
        with a GPU that is not healthy or is quarantined."""
        params = {"region": region, "status": status, "pool": pool, "out_of_placement": out_of_placement}
        async for node in self._pages(LIST_NODES, "nodes", NodeInfo, params, page_size):
            yield node

    @calls(LIST_NODES)
    async def page(
        self,
        *,
        region: str | None = None,
        status: str | None = None,
        pool: str | None = None,
        out_of_placement: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> NodeList:
        """One page, from `cursor` (a `next_cursor` an earlier page gave)."""
        params = {
            "region": region,
            "status": status,
            "pool": pool,
            "out_of_placement": out_of_placement,
            "limit": limit,
            "cursor": cursor,
        }
        return await self._answer(LIST_NODES, NodeList, params=params)

    @calls(GET_NODE)
    async def get(self, node: str) -> NodeInfo:
        return await self._answer(GET_NODE, NodeInfo, path={"node": node})

    @calls(CORDON)
    async def cordon(self, node: str) -> NodeInfo:
        return await self._answer(CORDON, NodeInfo, path={"node": node})

    @calls(UNCORDON)
    async def uncordon(self, node: str) -> NodeInfo:
        return await self._answer(UNCORDON, NodeInfo, path={"node": node})

    @calls(DRAIN)
    async def drain(self, node: str) -> DrainResult:
        return await self._answer(DRAIN, DrainResult, path={"node": node})

    @calls(REPAIR)
    async def repair(self, node: str, slots: Sequence[int]) -> RepairResult:
        """Mark these slots' GPUs repaired: they take work again."""
        return await self._answer(REPAIR, RepairResult, path={"node": node}, json=wire(RepairBody(slots=list(slots))))

    @calls(REPORT)
    async def report(self, node: str, report: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
        """Send a node agent's report (the agent's `NodeReport`, as a model or a mapping). The answer is the API's
        `ReportReply` as JSON (its model lives with the agent's scheduler code, which a client install lacks)."""
        sent = report.model_dump(mode="json", exclude_none=True) if isinstance(report, BaseModel) else dict(report)
        answer: dict[str, Any] = (await self._answer(REPORT, path={"node": node}, json=sent)).json()
        return answer


APPLY_FLEET = Route("PUT", "/v1/fleet")


class Fleet(Resource):
    @calls(APPLY_FLEET)
    async def apply(
        self,
        document: str | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        dry_run: bool = False,
        prune: bool = False,
        cluster: str | None = None,
        region: str | None = None,
        capabilities: Sequence[str] | None = None,
    ) -> FleetApplied:
        """Apply a fleet file (admin): YAML or JSON text, a document or a list of documents.
        `dry_run` says what would change and changes nothing; `prune` deletes what the file no longer declares;
        `cluster`, `region`, `capabilities`: for a Kubernetes NodeList, the cluster it becomes."""
        if isinstance(document, str):
            content: dict[str, Any] = {"content": document, "headers": {"Content-Type": "application/yaml"}}
        elif isinstance(document, Mapping):
            content = {"json": dict(document)}
        else:
            content = {"json": {"apiVersion": "v1", "kind": "List", "items": [dict(item) for item in document]}}
        params = {
            "dry_run": "true" if dry_run else None,
            "prune": "true" if prune else None,
            "cluster": cluster,
            "region": region,
            "capabilities": ",".join(capabilities) if capabilities else None,
        }
        return await self._answer(APPLY_FLEET, FleetApplied, params=params, **content)


PUT_DEPLOYMENT = Route("PUT", "/v1/deployments/{name}")
GET_DEPLOYMENT = Route("GET", "/v1/deployments/{name}")
DELETE_DEPLOYMENT = Route("DELETE", "/v1/deployments/{name}")
PUT_NAMESPACED = Route("PUT", "/v1/namespaces/{namespace}/deployments/{name}")
GET_NAMESPACED = Route("GET", "/v1/namespaces/{namespace}/deployments/{name}")
DELETE_NAMESPACED = Route("DELETE", "/v1/namespaces/{namespace}/deployments/{name}")
LIST_DEPLOYMENTS = Route("GET", "/v1/deployments")


def _one_of(default: Route, namespaced: Route, name: str, namespace: str | None) -> tuple[Route, dict[str, str]]:
    """The default namespace's route when none is named, else the namespaced one."""
    if namespace is None or namespace == DEFAULT_NAMESPACE:  # the default namespace's own routes, older than namespaces
        return default, {"name": name}
    return namespaced, {"namespace": namespace, "name": name}


class Deployments(Resource):
    """ModelDeployments (admin): `/v1/deployments/{name}` in `default`, `/v1/namespaces/{ns}/deployments/{name}`."""

    @calls(PUT_DEPLOYMENT, PUT_NAMESPACED)
    async def apply(
        self, manifest: str | Mapping[str, Any] | BaseModel, *, namespace: str | None = None
    ) -> DeploymentAccepted:
        """Create or update a ModelDeployment from its manifest (YAML or JSON text, a mapping or a model),
        in `namespace`, else its `metadata.namespace`, else `default`."""
        if isinstance(manifest, BaseModel):
            manifest = manifest.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(manifest, str):
            import yaml  # a client install has PyYAML through pydantic-settings' users; only text needs it

            parsed = yaml.safe_load(manifest)
        else:
            parsed = dict(manifest)
        metadata = parsed.get("metadata") or {}
        name = metadata.get("name")
        if not isinstance(name, str):
            raise errors.InvalidRequest("the manifest has no metadata.name", code="invalid_request")
        namespace = namespace or metadata.get("namespace")
        route, path = _one_of(PUT_DEPLOYMENT, PUT_NAMESPACED, name, namespace)
        return await self._answer(
            route,
            DeploymentAccepted,
            path=path,
            content=json.dumps(parsed),
            headers={"Content-Type": "application/json"},
        )

    @calls(GET_DEPLOYMENT, GET_NAMESPACED)
    async def get(self, name: str, *, namespace: str | None = None) -> DeploymentView:
        route, path = _one_of(GET_DEPLOYMENT, GET_NAMESPACED, name, namespace)
        return await self._answer(route, DeploymentView, path=path)

    @calls(GET_DEPLOYMENT, GET_NAMESPACED)
    async def wait(
        self,
        name: str,
        *states: str,
        namespace: str | None = None,
        timeout: float = 600.0,  # noqa: ASYNC109
    ) -> DeploymentView:
        """Until the deployment is in one of `states` (default `steady`), by long polls."""
        route, path = _one_of(GET_DEPLOYMENT, GET_NAMESPACED, name, namespace)
        return await self._long_poll(route, DeploymentView, path, _states(states or ("steady",)), ("deleted",), timeout)

    @calls(DELETE_DEPLOYMENT, DELETE_NAMESPACED)
    async def delete(self, name: str, *, namespace: str | None = None) -> DeploymentAccepted:
        route, path = _one_of(DELETE_DEPLOYMENT, DELETE_NAMESPACED, name, namespace)
        return await self._answer(route, DeploymentAccepted, path=path)

    @calls(LIST_DEPLOYMENTS)
    async def list(
        self, *, namespace: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[DeploymentSummary]:
        params = {"namespace": namespace}
        async for item in self._pages(LIST_DEPLOYMENTS, "deployments", DeploymentSummary, params, page_size):
            yield item

    @calls(LIST_DEPLOYMENTS)
    async def page(
        self, *, namespace: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> DeploymentList:
        """One page, from `cursor` (a `next_cursor` an earlier page gave)."""
        params = {"namespace": namespace, "limit": limit, "cursor": cursor}
        return await self._answer(LIST_DEPLOYMENTS, DeploymentList, params=params)


CREATE_TOKEN = Route("POST", "/v1/tokens", idempotent=False)
LIST_TOKENS = Route("GET", "/v1/tokens")
REVOKE_TOKEN = Route("DELETE", "/v1/tokens/{token_id}")
REVOKE_NODE_TOKENS = Route("DELETE", "/v1/nodes/{node}/tokens")


class Tokens(Resource):
    """Service accounts' and node agents' tokens (admin). People do not need tokens: they log in."""

    @calls(CREATE_TOKEN)
    async def create(self, request: TokenCreate | Mapping[str, Any] | None = None, **fields: Any) -> TokenCreated:
        """A token for a tenant (`tenant=`, `role=` viewer or member), an operator or admin (`role=`), or a node
        agent (`node=`); `expires_in="90d"`. Its `token` is shown this once. Not retried after a lost answer (the
        API takes no Idempotency-Key here: a second token would be made)."""
        json = body(TokenCreate, request, fields, durations=("expires_in",))
        return await self._answer(CREATE_TOKEN, TokenCreated, json=json)

    @calls(LIST_TOKENS)
    async def list(self, *, all: bool = False) -> AsyncIterator[TokenView]:
        """Every live token (`all`: revoked and expired ones too); never the bearers themselves."""
        params = {"all": "true" if all else None}
        for token in (await self._answer(LIST_TOKENS, TokenList, params=params)).tokens:
            yield token

    @calls(REVOKE_TOKEN)
    async def revoke(self, token_id: int) -> TokensRevoked:
        return await self._answer(REVOKE_TOKEN, TokensRevoked, path={"token_id": str(token_id)})

    @calls(REVOKE_NODE_TOKENS)
    async def revoke_node(self, node: str, *, keep: int | None = None) -> TokensRevoked:
        """Revoke every live token of a node but `keep` (a rotation's new one)."""
        return await self._answer(REVOKE_NODE_TOKENS, TokensRevoked, path={"node": node}, params={"keep": keep})


LATEST_AUDIT = Route("GET", "/v1/audit")
RUN_AUDIT = Route("POST", "/v1/audit", idempotent=True)  # an audit run twice finds the same
AUDIT_REQUESTS = Route("GET", "/v1/audit/requests")
AUDIT_WAIT_SECONDS = 90.0  # the API waits up to 60 s for the audit it runs


class Audit(Resource):
    """The reconciler's audit and the request log (operators)."""

    @calls(LATEST_AUDIT)
    async def latest(self) -> AuditView:
        return await self._answer(LATEST_AUDIT, AuditView)

    @calls(RUN_AUDIT)
    async def run(self, *, repair: bool = False) -> AuditView:
        """Run an audit now and wait for it (`repair`: also fix what is safe to fix)."""
        json = wire(AuditRequest(repair=repair))
        return await self._answer(RUN_AUDIT, AuditView, json=json, read_timeout=AUDIT_WAIT_SECONDS)

    @calls(AUDIT_REQUESTS)
    async def requests(
        self, *, actor: str | None = None, since: datetime | str | None = None, limit: int | None = None
    ) -> list[RequestRecord]:
        """The mutating requests the API recorded, newest first."""
        params = {"actor": actor, "since": _at(since), "limit": limit}
        return (await self._answer(AUDIT_REQUESTS, RequestRecords, params=params)).requests


EXPLAIN = Route("POST", "/v1/explain", idempotent=True)  # reads only
USAGE = Route("GET", "/v1/usage")
WHOAMI = Route("GET", "/v1/whoami")
AUTH = Route("GET", "/v1/auth")
HEALTH = Route("GET", "/healthz")
METRICS = Route("GET", "/metrics")
NO_BODY = TypeAdapter(Any)


class Root(Resource):
    """The calls on the client itself."""

    @calls(EXPLAIN)
    async def explain(
        self, request: AllocationCreate | Mapping[str, Any] | None = None, *, detail: bool = False, **fields: Any
    ) -> PlacementResult:
        """Where a request would be placed now, or why not, level by level (the same body as a create)."""
        params = {"detail": "true" if detail else None}
        return await self._answer(EXPLAIN, PlacementResult, json=allocation_body(request, fields), params=params)

    @calls(USAGE)
    async def usage(
        self,
        *,
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        by: Sequence[str] | str = ("tenant",),
        bucket: str | None = None,
        tenant: str | None = None,
    ) -> UsageReport:
        """GPU-hours, allocations and peaks per group (`by`: tenant, product, region, pool, class, shape) in
        [start, end), per `bucket` (hour or day) when given."""
        params = {
            "from": _at(start),
            "to": _at(end),
            "by": by if isinstance(by, str) else ",".join(by),
            "bucket": bucket,
            "tenant": tenant,
        }
        return await self._answer(USAGE, UsageReport, params=params)

    @calls(WHOAMI)
    async def whoami(self) -> WhoAmI:
        return await self._answer(WHOAMI, WhoAmI)

    @calls(AUTH)
    async def auth_config(self) -> AuthConfig:
        """Where people log in (`oidc`), or null: this API takes Berth tokens only."""
        return await self._answer(AUTH, AuthConfig)

    @calls(HEALTH)
    async def health(self) -> Health:
        return await self._answer(HEALTH, Health)

    @calls(METRICS)
    async def metrics(self) -> str:
        """The Prometheus text the API exposes."""
        response: httpx.Response = await self._answer(METRICS)
        return response.text

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: str | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        idempotent: bool | None = None,
    ) -> httpx.Response:
        """Any call, for a route this version of the client has no method for: the same token, retries and errors
        (`idempotent` defaults to the HTTP method's: GET, PUT and DELETE are retried after a lost answer)."""
        route = Route(method.upper(), path, idempotent)
        return await self._http.call(
            route.method,
            path,
            idempotent=route.safe_to_repeat,
            params=params,
            json=json,
            content=content,
            headers=headers,
        )


RESOURCES: tuple[type[Resource], ...] = (
    Root,
    Allocations,
    Reservations,
    Queues,
    Capacity,
    Nodes,
    Fleet,
    Deployments,
    Audit,
    Tokens,
)
