"""Pinned nodes for allocations (docs/seeds.md, "Pinned nodes and GPUs"): a request that pins nodes is served by one
of them or refused.

GPUStack users pick the GPUs a model runs on, and complain when the scheduler quietly runs it elsewhere. So pinning is a hard filter, not a preference: every other node is dropped with `node_not_pinned`,
and when no pinned node can take the request now the refusal is `pinned_nodes_unavailable`, naming each pinned node
and why it cannot (unknown, in another region, in a pool that does not serve the request, excluded in this run, or
the node filter's own reason: not READY, full, cooling off...). The reasons are built only on refusal, so a pinned
request that is placed costs no more than any other.

A request may also pin GPUs (PCI addresses) on its one pinned node. The node is then judged, by the cluster and the
node scheduler alike, on a view where every other slot is unapproved (`pinned_slots_view`): the same filter chain
counts only the pinned slots, and the planner can pick no others. A pinned GPU that is not free (claimed, leased,
quarantined, invalid) or not on the node refuses the request, naming the GPU and why (`pinned_gpu_problems`), but
never the allocation that holds it: refusals reach tenants, and another tenant's allocation ids are not theirs to see.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from contracts.explanation import Refusal
from contracts.placement import PlacementRequest
from contracts.reasons import Reason
from scheduler.compatibility import NodeProfile, hardware_defect, profile_of, state_defect, vf_usage
from scheduler.placement.node_filters import Judge, verdict
from scheduler.reasons import clause
from scheduler.snapshot import Snapshot
from scheduler.views import NodeView, PoolView

# Node-level reasons that are about the node as a whole: they come before what is wrong with its pinned GPUs.
_WHOLE_NODE = {Reason.NODE_NOT_READY, Reason.AGENT_DOWN, Reason.NODE_COOLING_OFF}


def pinned_slots_view(node: NodeView, gpus: frozenset[str]) -> NodeView:
    """The node as a GPU-pinning request may use it: every slot whose GPU is not pinned counts as unapproved. The
    fabric VFs stay on all slots, so a pinned slot sharing its VF with an unpinned one is still caught."""
    slots = tuple(slot if slot.gpu_pci in gpus else replace(slot, approved=False) for slot in node.slots)
    return replace(node, slots=slots)


def pinned_profile(node: NodeView, gpus: frozenset[str]) -> NodeProfile:
    return profile_of(pinned_slots_view(node, gpus))


def pinned_gpu_problems(node: NodeView, gpus: frozenset[str], holder: str | None = None) -> list[str]:
    """Why each pinned GPU that cannot be had cannot, in address order ("GPU 0000:1b:00.0 is leased to another
    allocation"); empty when every pinned GPU is a compatible bundle free for `holder` (the allocation asking).

    The other allocation is never named: this text becomes the refusal a tenant reads in explain and in its own
    allocation's failure reason, and a tenant may not learn another tenant's allocation ids. Who holds a slot is
    data, not prose (`scheduler.placement.bundles.held_slots`), shown to admins only."""
    by_gpu = {slot.gpu_pci: slot for slot in node.slots}
    vf_counts = vf_usage(node)
    problems: list[str] = []
    for gpu in sorted(gpus):
        slot = by_gpu.get(gpu)
        if slot is None:
            problems.append(f"GPU {gpu} is not a GPU of {node.name}")
            continue
        defect = hardware_defect(slot, vf_counts) or state_defect(slot, holder)
        if defect is not None:
            problems.append(f"GPU {gpu} {clause(defect, 1)}")
    return problems


def pinned_gpus_reason(node: NodeView, gpus: frozenset[str], reason: Reason, holder: str | None = None) -> str:
    """Why a node refused a GPU-pinning request whose verdict on its pinned slots is `reason`: the node's own
    state first, then each pinned GPU at fault, else the filter's clause (e.g. the GPUs span NUMA nodes)."""
    problems = [] if reason in _WHOLE_NODE else pinned_gpu_problems(node, gpus, holder)
    if problems:
        return "cannot give its pinned GPUs: " + ", ".join(problems)
    return clause(reason, len(gpus))


def regions_of_pins(snapshot: Snapshot, pins: Iterable[str]) -> set[str]:
    """The regions holding at least one pinned node."""
    return {pool.region for name in pins for pool in snapshot.pools_of(name)}


def pinned_refusal(
    snapshot: Snapshot,
    request: PlacementRequest,
    region: str | None,
    pools: Iterable[PoolView] = (),
    pool_reasons: dict[str, Reason] | None = None,
) -> Refusal:
    """Why no pinned node takes the request. `pools` are the region's pools that serve the request (None: the
    region level refused before pools were looked at); `pool_reasons` says why each other pool was dropped."""
    serving = {pool.key: pool for pool in pools}
    judge = Judge(request.shape, request.gpu_count, request.numa_policy)
    why = [
        f"{name} {_reason(snapshot, request, region, name, serving, pool_reasons or {}, judge)}"
        for name in sorted(request.nodes)
    ]
    noun = "node" if len(request.nodes) == 1 else "nodes"
    return Refusal(
        code=Reason.PINNED_NODES_UNAVAILABLE,
        message=f"no pinned {noun} can take {request.describe()}: " + "; ".join(why),
    )


def _reason(
    snapshot: Snapshot,
    request: PlacementRequest,
    region: str | None,
    name: str,
    serving: dict[str, PoolView],
    pool_reasons: dict[str, Reason],
    judge: Judge,
) -> str:
    if name not in snapshot.nodes:
        return "is not a known node"
    pools = snapshot.pools_of(name)
    if not pools:
        return "is in no pool"
    if region is not None and all(pool.region != region for pool in pools):
        return f"is in region {', '.join(sorted({p.region for p in pools}))}, not {region}"
    if name in request.exclude_nodes:
        return clause(Reason.NODE_EXCLUDED, request.gpu_count) + " (already tried in this run)"
    if name in request.reserved_nodes:
        return clause(Reason.NODE_RESERVED, request.gpu_count)
    mine = [pool for pool in pools if region is None or pool.region == region]
    usable = [pool for pool in mine if pool.key in serving]
    if not usable:
        return "is in " + ", ".join(_pool_refusal(pool, pool_reasons.get(pool.key), request) for pool in mine)
    if request.gpus:
        reason = verdict(pinned_profile(snapshot.nodes[name], request.gpus), judge.filters)
        return "could take it" if reason is None else pinned_gpus_reason(snapshot.nodes[name], request.gpus, reason)
    key = snapshot.profile_key(name)
    for pool in usable:
        group = next(g for g in snapshot.groups(pool) if g.key == key)
        found = judge.verdict(group)
        if found is None:
            return "could take it"  # only reached if a caller asks about a request that was placed
        return clause(found, request.gpu_count)
    raise AssertionError("unreachable: usable pools are not empty")


def _pool_refusal(pool: PoolView, reason: Reason | None, request: PlacementRequest) -> str:
    if reason is None:
        return f"pool {pool.key}, which does not serve the request"
    return f"pool {pool.key}, which {clause(reason, request.gpu_count)}"
