"""The allocation request's checks against what exists, made before anything is created or explained.

Schema validation (contracts/http.py) cannot know the fleet: a region, product or node name is well formed whether or not
it exists. Without these checks an unknown region was accepted (202) and the workflow failed later, leaving a failed
allocation behind for a typo. Here, on the create hot path:

    selectors compile, user-data is a cloud-config mapping, GPU pins are consistent (pure)
    ->  names exist in the fleet (the API's inventory cache)
    ->  pinned GPUs are GPUs of the pinned node's approved slots

The names are the fleet as the caller may use it (`fleet_for`): all of it for an admin; for a tenant, the regions its
policy admits, their pools and those pools' nodes (`scheduler.placement.tenant_scope`). So a tenant's 422 lists only choices
it may use, and a region, product or node it may not use is answered exactly as one that does not exist: a token
cannot probe the rest of the fleet. The message says so truthfully ("no H200 in the regions your tenant may use;
available to you: L4"), never that the name does not exist in the fleet. Explain and capacity show a tenant the
same view (api/routes/placement.py).

The inventory cache answers with one small query while the fleet is unchanged, and the name sets built from a
snapshot are kept, per tenant, until the cache hands out another one, so a create costs no extra inventory read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

from api.cel_budget import too_costly, too_long
from api.errors import ApiError
from contracts.allocation import cloud_config_problem
from contracts.http import AllocationCreate
from contracts.placement import CapacityShape
from scheduler.cel import REQUEST_BUDGET, SelectorCompileError, SelectorCostExceeded, admit_selector
from scheduler.placement.tenant_scope import usable_regions
from scheduler.snapshot import Snapshot
from store.db import AsyncSession
from store.inventory import InventoryCache
from store.tokens import Principal

NODE_CHOICES_SHOWN = 100  # a fleet may hold thousands of nodes; `details` lists this many and counts the rest
MESSAGE_CHOICES = 12  # the message is one line a CLI prints: it names this many choices


@dataclass(frozen=True)
class FleetNames:
    """What a request may name: regions, GPU products (as pools offer them) and nodes, sorted."""

    regions: tuple[str, ...]
    products: tuple[str, ...]
    nodes: frozenset[str]

    @classmethod
    def of(cls, snapshot: Snapshot) -> FleetNames:
        products = {pool.gpu_product for pool in snapshot.pools if pool.gpu_product}
        return cls(
            regions=tuple(sorted(snapshot.regions)),
            products=tuple(sorted(products, key=str.casefold)),
            nodes=frozenset(snapshot.nodes),
        )

    def offers(self, product: str) -> bool:
        """Products compare without regard to case, as the scheduler compares them (`h200` is `H200`)."""
        wanted = product.casefold()
        return any(offered.casefold() == wanted for offered in self.products)


def fleet_for(snapshot: Snapshot, viewer: Principal) -> Snapshot:
    """The fleet as `viewer` may see it: the whole snapshot for an admin, the tenant's usable part otherwise."""
    if viewer.sees_all:
        return snapshot
    return snapshot.within(frozenset().union(*(usable_regions(snapshot, tenant) for tenant in sorted(viewer.tenants))))


class _Remembered:
    """The names of the last snapshot seen, per viewer (None: an admin; else the tenant): the inventory cache hands
    out the same snapshot until the fleet or an agent's liveness changes, so identity tells whether they are still
    current."""

    snapshot: Snapshot | None = None
    names: dict[str | None, FleetNames]

    def __init__(self) -> None:
        self.names = {}

    def names_of(self, snapshot: Snapshot, viewer: Principal) -> FleetNames:
        if self.snapshot is not snapshot:
            self.snapshot, self.names = snapshot, {}
        key = None if viewer.sees_all else ",".join(sorted(viewer.tenants))
        names = self.names.get(key)
        if names is None:
            names = self.names[key] = FleetNames.of(fleet_for(snapshot, viewer))
        return names


_remembered = _Remembered()


def check_selectors(body: AllocationCreate) -> None:
    """422 `invalid_selector` for the first selector that does not compile, naming it and the position;
    `selector_cost_exceeded` for selectors too long together, or one whose estimated cost is over a request's CEL
    budget (api/cel_budget.py)."""
    refusal = too_long(body)
    if refusal is not None:
        raise refusal
    for index, expression in enumerate(body.selectors):
        try:
            admit_selector(expression, REQUEST_BUDGET)
        except SelectorCostExceeded as error:
            raise too_costly(body, error) from None
        except SelectorCompileError as error:
            detail = {
                "field": f"body.selectors[{index}]",
                "expression": error.expression,
                "line": error.line,
                "column": error.column,
                "reason": error.reason,
            }
            message = f"selectors[{index}] does not compile at {error.line}:{error.column}: {error.reason}"
            raise ApiError(422, "invalid_selector", message, [detail]) from None


def invalid_request(field: str, message: str, problem: str = "gpu_pins") -> ApiError:
    """The shape of a schema error (`invalid_request`), for rules no schema can state: between fields, or against
    the clock."""
    return ApiError(
        422,
        "invalid_request",
        f"the request is not valid: {field}: {message}",
        [{"field": field, "message": message, "type": problem}],
    )


def check_user_data(body: AllocationCreate) -> None:
    """A tenant's cloud-config that is not a YAML mapping, or that sets a key the VM's seed sets itself, is a 422
    naming `body.user_data` (its header and size were checked with the body)."""
    if body.user_data is None:
        return
    problem = cloud_config_problem(body.user_data)
    if problem is not None:
        kind, message = problem
        raise invalid_request("body.user_data", message, kind)


def check_lease(body: AllocationCreate) -> None:
    """An end in the past (or now) would release the allocation as soon as it is placed: refused instead."""
    if body.ends_at is not None and body.ends_at <= datetime.now(UTC):
        raise invalid_request(
            "body.ends_at", f"ends_at {body.ends_at.isoformat()} is not in the future", "ends_at_past"
        )


def check_gpu_pins(body: AllocationCreate) -> None:
    """A PCI address names a GPU only on its own host, so pinned GPUs need exactly one pinned node; they are the
    allocation's GPUs, so as many as `gpu_count`; and slices, since bare metal takes the whole host."""
    if not body.gpus:
        return
    if len(body.nodes) != 1:
        raise invalid_request("body.gpus", f"gpus need exactly one pinned node in `nodes`, not {len(body.nodes)}")
    if body.shape is not CapacityShape.GPU_SLICE:
        raise invalid_request(
            "body.shape", "gpus can be pinned only for gpu_slice: a bare-metal allocation takes the whole host"
        )
    distinct = len(set(body.gpus))
    if distinct != len(body.gpus):
        raise invalid_request("body.gpus", "a GPU is pinned twice")
    if distinct != body.gpu_count:
        raise invalid_request(
            "body.gpu_count", f"gpu_count is {body.gpu_count} but {distinct} GPUs are pinned: they must be equal"
        )


def check_gpus(snapshot: Snapshot, body: AllocationCreate) -> None:
    """422 `unknown_gpu` for a pinned GPU that is not one of the pinned node's approved slots, with those slots'
    GPU addresses as the choices. Runs after `check_names`, so the node exists."""
    if not body.gpus:
        return
    node = body.nodes[0]
    choices = sorted(slot.gpu_pci for slot in snapshot.nodes[node].slots if slot.approved and slot.gpu_pci)
    for index, gpu in enumerate(body.gpus):
        if gpu not in choices:
            shown = ", ".join(choices) or "none"
            detail = {"field": f"body.gpus[{index}]", "value": gpu, "choices": choices}
            message = f"gpu {gpu!r} is not an approved GPU of node {node}; choose one of: {shown}"
            raise ApiError(422, "unknown_gpu", message, [detail])


def unknown_name(
    field: str, what: str, value: str, choices: list[str], viewer: Principal, total: int | None = None
) -> ApiError:
    """422 `unknown_<what>` for a name that is not among `choices`, what the viewer may use. To an admin the name
    does not exist in the fleet. To anyone else the choices are their tenants' part of it only, and the message
    says exactly that, whether or not the name exists elsewhere: true, and it tells nothing of the rest."""
    total = len(choices) if total is None else total
    shown = ", ".join(choices[:MESSAGE_CHOICES]) if choices else "none"
    more = f" (and {total - min(len(choices), MESSAGE_CHOICES)} more)" if total > MESSAGE_CHOICES else ""
    detail: dict[str, object] = {"field": field, "value": value, "choices": choices}
    if total > len(choices):
        detail["choices_total"] = total
    if viewer.sees_all:
        message = f"{what} {value!r} does not exist in the fleet; choose one of: {shown}{more}"
    else:
        yours = "your tenant" if len(viewer.tenants) == 1 else "your tenants"
        named = value if what == "product" else f"{what} {value!r}"
        where = f"among the regions {yours} may use" if what == "region" else f"in the regions {yours} may use"
        message = f"no {named} {where}; available to you: {shown}{more}"
    return ApiError(422, f"unknown_{what}", message, [detail])


def check_names(names: FleetNames, body: AllocationCreate, viewer: Principal) -> None:
    """422 `unknown_region`, `unknown_product` or `unknown_node` with the valid choices in `details`."""
    if body.region is not None and body.region not in names.regions:
        raise unknown_name("body.region", "region", body.region, list(names.regions), viewer)
    if body.gpu_product is not None and not names.offers(body.gpu_product):
        raise unknown_name("body.gpu_product", "product", body.gpu_product, list(names.products), viewer)
    for index, node in enumerate(body.nodes):
        if node not in names.nodes:
            choices = sorted(names.nodes)
            raise unknown_name(f"body.nodes[{index}]", "node", node, choices[:NODE_CHOICES_SHOWN], viewer, len(choices))


async def check_request(
    session: AsyncSession, inventory: InventoryCache, body: AllocationCreate, viewer: Principal
) -> None:
    """Every check of this module, cheapest first, against the fleet as `viewer` may use it; raises the first
    ApiError (422)."""
    await asyncio.to_thread(check_selectors, body)  # parsing a long selector takes ~0.25 s: off the event loop
    if body.user_data is not None:
        await asyncio.to_thread(check_user_data, body)  # so may 64 KiB of YAML (up to ~0.5 s)
    check_gpu_pins(body)
    check_lease(body)
    snapshot = (await inventory.inventory(session)).snapshot
    check_names(_remembered.names_of(snapshot, viewer), body, viewer)
    check_gpus(snapshot, body)
