"""`/v1/nodes`: the GPU hosts, their agents and slot validation, cordoning and draining (operators); and the agents'
reports.

Reading is a viewer's too: a tenant's token lists and reads the nodes of the regions it may use (the fleet explain
and capacity show it, `api.request_checks.fleet_for`), each GPU with its state, and the allocation holding it only
when it is that tenant's own (`api.routes.placement.holder_shown_to`): another tenant's work is only `in_use`. The
agent's host details and the health signals are the operators'.

A node's `status` says what it is doing (`contracts.http.NodeState`): READY takes new allocations; NOT_READY is READY
in the fleet but has no live agent (it never reported, or stopped), so nothing lands there either; CORDONED takes
nothing new and keeps what it has; DRAINING was drained: nothing new, and each allocation's owner was told to move;
DOWN is the fleet file's. The scheduler places only on READY nodes with a live agent, so READY is exactly "takes
work". Cordon and drain survive re-applying an unchanged fleet file; uncordon makes the node READY again.

`POST /v1/nodes/{node}/report` is the node agents' route: a node token may report only for its own node (anything
else is refused and logged); see `api/heartbeats.py` for why most reports cost no database write.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from api import cursor
from api.auth import Operator, Reporter, Viewer
from api.cursor import CursorParam
from api.errors import ApiError, conflict, error_responses, not_found
from api.request_checks import fleet_for
from api.routes.placement import holder_shown_to, reserved_now
from api.services import Services, services
from contracts.allocation import DrainNotice
from contracts.audit import FindingKind, Repair, RepairAction
from contracts.http import (
    AgentState,
    DrainResult,
    GpuSlot,
    NodeInfo,
    NodeList,
    NodeState,
    QuarantinedSlot,
    RepairBody,
    RepairedSlot,
    RepairResult,
    SlotSignalsView,
    SlotValidation,
    UnhealthySlot,
)
from contracts.manifest import Name
from contracts.vocabulary import NodeStatus
from scheduler.host.report import NodeReport, ReportReply
from scheduler.placement.capacity import gpu_states
from scheduler.snapshot import Snapshot
from store import audit as audit_records
from store import claims
from store import nodes as store
from store.db import AsyncSession
from store.models import NodeAgentRow, NodeRow, PoolRow
from store.node_reports import ReportTooLarge, TopologyMismatch, UnstorableReport, record_report
from store.tokens import Principal

log = logging.getLogger("berth.api")

router = APIRouter(prefix="/v1/nodes", tags=["admin"])
App = Annotated[Services, Depends(services)]
NodePath = Annotated[Name, Path(description="The node's name.")]
PoolKey = Annotated[
    str,
    Query(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=127,
        description="Only the nodes of this pool, as `cluster/pool`.",
    ),
]


def _agent(agent: NodeAgentRow | None) -> AgentState:
    if agent is None:
        return AgentState(state="never_reported")
    return AgentState(
        state="live" if agent.state == "live" else "down",
        seen_at=agent.seen_at,
        down_reason=agent.down_reason if agent.state != "live" else None,
        version=agent.agent_version,
        topology=agent.topology,
        slices_blocked=agent.slices_blocked,
        vm_runtime=(agent.host or {}).get("vm_runtime"),
    )


def _info(
    node: NodeRow,
    pool: PoolRow,
    region: str | None,
    agent: NodeAgentRow | None,
    *counts: int | None,
    invalid: list[SlotValidation] | None = None,
    quarantined: list[QuarantinedSlot] | None = None,
    unhealthy: list[UnhealthySlot] | None = None,
) -> NodeInfo:
    gpus, available, reserved, quarantined_count, validated, compatible = (count or 0 for count in counts)
    live = agent is not None and agent.state == "live"
    return NodeInfo(
        name=node.name,
        cluster=pool.cluster,
        pool=f"{pool.cluster}/{pool.name}",
        region=region,
        shape=pool.shape,
        gpu_product=pool.gpu_product,
        status=NodeState.NOT_READY if node.status == NodeStatus.READY and not live else node.status,
        declared_status=node.declared_status,
        gpus=gpus,
        available_slots=available,
        reserved_slots=reserved,
        quarantined_slots=quarantined_count,
        labels=dict(node.labels),
        agent=_agent(agent),
        validated_gpus=validated,
        compatible_gpus=compatible,
        invalid_slots=invalid or [],
        quarantined=quarantined or [],
        unhealthy=unhealthy or [],
    )


async def _invalid_slots(session: AsyncSession, nodes: list[str] | None = None) -> dict[str, list[SlotValidation]]:
    """Every slot that is not `valid`, by node: what an operator has to fix."""
    result: dict[str, list[SlotValidation]] = {}
    for slot in await store.unvalidated_slots(session, nodes):
        result.setdefault(slot.node_id, []).append(
            SlotValidation(
                index=slot.slot_index,
                gpu_pci=slot.gpu_pci_address,
                approved=slot.approved,
                validation=slot.validation,
                reason=slot.validation_reason,
                message=slot.validation_message,
                validated_at=slot.validated_at,
            )
        )
    return result


async def _quarantined(session: AsyncSession, nodes: list[str] | None = None) -> dict[str, list[QuarantinedSlot]]:
    result: dict[str, list[QuarantinedSlot]] = {}
    for node, index, reason in await store.quarantined_slots(session, nodes):
        result.setdefault(node, []).append(QuarantinedSlot(index=index, reason=reason))
    return result


async def _unhealthy(session: AsyncSession, nodes: list[str] | None = None) -> dict[str, list[UnhealthySlot]]:
    result: dict[str, list[UnhealthySlot]] = {}
    for slot in await store.unhealthy_slots(session, nodes):
        result.setdefault(slot.node_id, []).append(
            UnhealthySlot(
                index=slot.slot_index,
                gpu_pci=slot.gpu_pci_address,
                health=slot.health,
                reasons=list(slot.health_reasons),
                since=slot.health_at,
            )
        )
    return result


async def _seen(app: Services, session: AsyncSession, caller: Principal) -> Snapshot:
    """The fleet as the caller may see it now (claims, leases and health laid over it)."""
    return fleet_for(await app.inventory.snapshot(session), caller)


async def _with_gpus(
    session: AsyncSession, caller: Principal, snapshot: Snapshot, infos: list[NodeInfo]
) -> list[NodeInfo]:
    """Each node with every GPU's state (`scheduler.placement.capacity.gpu_states`, as capacity counts them) and
    the allocations holding them, named only to whom `holder_shown_to` allows; for a tenant, without the operators'
    details (the agent's host, the health signals)."""
    views = {info.name: snapshot.nodes[info.name] for info in infos if info.name in snapshot.nodes}
    holders = {slot.holder for view in views.values() for slot in view.slots if slot.holder is not None}
    tenants = {} if caller.sees_all else await store.allocation_tenants(session, holders)
    reserved = await reserved_now(session)
    shown = []
    for info in infos:
        view = views.get(info.name)
        if view is None:  # a node added since the snapshot was taken: its next read has its GPUs
            shown.append(info)
            continue
        slot_of = {slot.index: slot for slot in view.slots}
        gpus = []
        for index, state in gpu_states(view, reserved.get(info.name, 0)):
            holder = slot_of[index].holder
            gpus.append(
                GpuSlot(
                    index=index,
                    gpu_pci=slot_of[index].gpu_pci,
                    state=state,
                    in_use=holder is not None,
                    allocation=holder_shown_to(caller, holder, tenants.get(holder)) if holder else None,
                )
            )
        update: dict[str, object] = {"slots": gpus, "allocations": len({s.holder for s in view.slots if s.holder})}
        if not caller.sees_all:
            update |= {
                "signals": [],
                "agent": AgentState(state=info.agent.state, seen_at=info.agent.seen_at),
                "quarantined": await _quarantine_shown_to(session, caller, info.quarantined),
            }
        shown.append(info.model_copy(update=update))
    return shown


async def _quarantine_shown_to(
    session: AsyncSession, caller: Principal, quarantined: list[QuarantinedSlot]
) -> list[QuarantinedSlot]:
    """A quarantine's reason begins with the allocation whose failure left the slot unwiped (`<id>: <why>`, as the
    claims write it and the reconciler reads it); that id is shown to whom `holder_shown_to` allows, else only
    why."""
    named = {slot.reason.split(": ", 1)[0] for slot in quarantined if slot.reason and ": " in slot.reason}
    tenants = await store.allocation_tenants(session, named) if named else {}
    shown = []
    for slot in quarantined:
        reason = slot.reason
        if reason and ": " in reason:
            allocation, why = reason.split(": ", 1)
            if allocation in tenants and holder_shown_to(caller, allocation, tenants[allocation]) is None:
                reason = why
        shown.append(slot.model_copy(update={"reason": reason}))
    return shown


async def _one(app: Services, session: AsyncSession, caller: Principal, name: str) -> NodeInfo:
    row = await store.node_summary(session, name)
    snapshot = await _seen(app, session, caller)
    if row is None or (not caller.sees_all and row[2] not in snapshot.regions):
        raise not_found("node", name)
    invalid, quarantined = await _invalid_slots(session, [name]), await _quarantined(session, [name])
    unhealthy = await _unhealthy(session, [name])
    info = _info(*row, invalid=invalid.get(name), quarantined=quarantined.get(name), unhealthy=unhealthy.get(name))
    signals = [
        SlotSignalsView(
            index=slot.slot_index, health=slot.health, signals=dict(slot.health_signals), reported_at=slot.signals_at
        )
        for slot in await store.node_slots(session, name)
        if slot.signals_at is not None
    ]
    return (await _with_gpus(session, caller, snapshot, [info.model_copy(update={"signals": signals})]))[0]


@router.get("", response_model=NodeList, responses=error_responses(401, 403, 422))
async def list_nodes(
    caller: Viewer,
    app: App,
    region: Name | None = None,
    status: NodeState | None = None,
    pool: PoolKey | None = None,
    out_of_placement: Annotated[
        bool, Query(description="Only nodes with a GPU that is not healthy (failed, degraded, unknown) or quarantined.")
    ] = False,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many on the page.")] = 1000,
    cursor_: Annotated[CursorParam, Query(alias="cursor")] = None,
) -> NodeList:
    """Every node with its pool, status, slot usage, each GPU's state, agent liveness and the slots that do not
    validate, by name, a page at a time (keyset on the name): follow `next_cursor` until it is null. A tenant's
    token sees the nodes of the regions it may use, and names only its own allocations."""
    after = cursor.decode(cursor_, "nodes", 1)[0] if cursor_ is not None else None
    async with app.sessions() as session:
        snapshot = await _seen(app, session, caller)
        found = await store.node_page(
            session,
            region=region,
            status=status.value if status is not None else None,
            pool=tuple(pool.split("/", 1)) if pool is not None else None,  # type: ignore[arg-type]
            regions=None if caller.sees_all else frozenset(snapshot.regions),
            out_of_placement=out_of_placement,
            after=after,
            limit=limit + 1,
        )
        rows, more = found[:limit], len(found) > limit
        names = [row[0].name for row in rows]
        invalid, quarantined = await _invalid_slots(session, names), await _quarantined(session, names)
        unhealthy = await _unhealthy(session, names)
        infos = [
            _info(
                *row,
                invalid=invalid.get(row[0].name),
                quarantined=quarantined.get(row[0].name),
                unhealthy=unhealthy.get(row[0].name),
            )
            for row in rows
        ]
        return NodeList(
            nodes=await _with_gpus(session, caller, snapshot, infos),
            next_cursor=cursor.encode("nodes", names[-1]) if more else None,
        )


@router.get("/{node}", response_model=NodeInfo, responses=error_responses(401, 403, 404, 422))
async def get_node(node: NodePath, caller: Viewer, app: App) -> NodeInfo:
    """One node: its pool, status, each GPU's state, agent liveness, every slot that does not validate with the
    reason, and (for operators) each slot's health signals. A tenant's token reads only a node of a region it may
    use, and sees only its own allocations named."""
    async with app.sessions() as session:
        return await _one(app, session, caller, node)


async def _set_status(app: Services, caller: Principal, name: str, wanted: NodeStatus) -> NodeInfo:
    """Cordon (a draining node stays DRAINING: it already takes nothing new), drain or uncordon; a node the fleet
    file declares DOWN is the file's to change."""
    async with app.sessions.begin() as session:
        node = await store.locked_node(session, name)
        if node is None:
            raise not_found("node", name)
        if node.status == NodeStatus.DOWN:
            raise conflict(
                f"node {name} is DOWN in the fleet file; only a READY, CORDONED or DRAINING node can be "
                "cordoned, drained or uncordoned"
            )
        if not (wanted is NodeStatus.CORDONED and node.status == NodeStatus.DRAINING):
            await store.set_status(session, node, wanted.value)
    # Read back once committed: the inventory cache must never take in a change that could still roll back.
    async with app.sessions() as session:
        return await _one(app, session, caller, name)


@router.post("/{node}/cordon", response_model=NodeInfo, responses=error_responses(401, 403, 404, 409, 422))
async def cordon(node: NodePath, caller: Operator, app: App) -> NodeInfo:
    """Stop placing new allocations on the node. Cordoning a cordoned node changes nothing."""
    return await _set_status(app, caller, node, NodeStatus.CORDONED)


@router.post("/{node}/uncordon", response_model=NodeInfo, responses=error_responses(401, 403, 404, 409, 422))
async def uncordon(node: NodePath, caller: Operator, app: App) -> NodeInfo:
    """Let the node take allocations again, cordoned or drained. Uncordoning a READY node changes nothing."""
    info = await _set_status(app, caller, node, NodeStatus.READY)
    app.admission_passes.ask(f"node {node} uncordoned")
    return info


@router.post("/{node}/drain", response_model=DrainResult, responses=error_responses(401, 403, 404, 409, 422))
async def drain(node: NodePath, caller: Operator, app: App) -> DrainResult:
    """Mark the node DRAINING (nothing new lands) and tell each allocation on it: its owner sees `drain_notice`
    with the reason and releases it when ready; nothing is torn down. Draining again tells nobody twice; uncordon
    ends the drain."""
    info = await _set_status(app, caller, node, NodeStatus.DRAINING)
    told, not_told = await _tell_drain(app, DrainNotice(node=node))
    return DrainResult(node=info, told=told, not_told=not_told)


async def _tell_drain(app: Services, notice: DrainNotice) -> tuple[list[str], list[str]]:
    """Tell each allocation on the draining node (`drain_notice`): (told, not told, as the workflow is gone or
    Temporal unreachable)."""
    async with app.sessions() as session:
        holding = await store.holders(session, notice.node)
    told, not_told = [], []
    for allocation_id in holding:
        try:
            await app.control.tell_drain(allocation_id, notice)
            told.append(allocation_id)
        except Exception as error:  # noqa: BLE001 - the workflow gone or Temporal unreachable: said in the answer
            log.warning("allocation %s was not told that node %s drains: %s", allocation_id, notice.node, error)
            not_told.append(allocation_id)
    return told, not_told


@router.post("/{node}/repair", response_model=RepairResult, responses=error_responses(401, 403, 404, 422))
async def repair(node: NodePath, body: RepairBody, caller: Operator, app: App) -> RepairResult:
    """An operator repaired these slots' GPUs: each is healthy and takes work again until its agent
    judges otherwise (the agent is asked for its verdicts again at its next report). Recorded in the audit trail."""
    now = datetime.now(UTC)
    async with app.sessions.begin() as session:
        if await store.locked_node(session, node) is None:
            raise not_found("node", node)
        try:
            repaired = await store.repair_slots(session, node, body.slots, now)
        except LookupError as missing:
            raise ApiError(404, "not_found", f"node {node} has no slot {missing}") from None
        for index, was, reason in repaired:
            message = f"slot {index} of {node} marked repaired by {caller.actor} (was {was}"
            await audit_records.record_repair(
                session,
                None,
                Repair(
                    kind=FindingKind.GPU_REPAIRED,
                    action=RepairAction.MARK_REPAIRED,
                    node=node,
                    slot_indexes=[index],
                    outcome="done",
                    message=message + (f": {reason})" if reason else ")"),
                    at=now,
                ),
            )
    app.heartbeats.forget(node)  # its next report goes the full way and is asked for the verdicts again
    app.admission_passes.ask(f"node {node} repaired")
    return RepairResult(node=node, repaired=[RepairedSlot(index=i, was=w, reason=r) for i, w, r in repaired])


async def _tell_failures(app: Services, node: str) -> None:
    """Tell each active allocation holding a slot of `node` whose GPU failed: its workflow goes
    `degraded`. Best effort: a report is never refused for it, and one not told now is told on the node's next
    report that carries health, or by the reconciler (`gpu_failure_untold`)."""
    async with app.sessions() as session:
        untold = await claims.untold_failures(session, node)
    for allocation_id, notice in untold:
        try:
            await app.control.tell_gpu_failure(allocation_id, notice)
        except Exception as error:  # noqa: BLE001 - Temporal unreachable or the workflow gone: the reconciler retells
            log.warning("allocation %s was not told that %s failed: %s", allocation_id, notice.slot, error)


@router.post(
    "/{node}/report",
    response_model=ReportReply,
    response_model_exclude_none=True,
    responses=error_responses(401, 403, 404, 422),
    tags=["agents"],
)
async def report(node: NodePath, body: NodeReport, caller: Reporter, app: App) -> ReportReply | Response:
    """A node agent's report: on start, when its host changes, and every interval. Answers with the node's approved
    slots when the agent's copy is out of date, and asks for the whole host when the control plane lacks it."""
    if caller.role == "node" and caller.node != node:
        log.warning("refused a report for node %s made with the token of node %s", node, caller.node)
        raise ApiError(403, "forbidden", f"a token of node {caller.node!r} cannot report for node {node!r}")
    now = datetime.now(UTC)
    if app.heartbeats.steady(node, body):
        app.heartbeats.add(node, now, body.agent.interval_seconds)
        await app.heartbeats.maybe_flush(app.sessions)
        # Serialised here rather than through the response model: this is the route every agent calls every interval.
        steady = ReportReply(node=node, live=True, approved=body.approved or "")
        return Response(steady.model_dump_json(exclude_none=True), media_type="application/json")
    async with app.sessions.begin() as session:
        try:
            reply = await record_report(session, node, body, now)
        except LookupError:
            raise not_found("node", node) from None
        except TopologyMismatch as mismatch:
            raise ApiError(422, "topology_mismatch", str(mismatch)) from None
        except UnstorableReport as unstorable:
            raise ApiError(422, "invalid_request", str(unstorable)) from None
        except ReportTooLarge as large:
            raise ApiError(422, "report_too_large", str(large)) from None
    if not reply.send_host:
        app.heartbeats.confirm(node, body.topology, reply.approved)
    await app.heartbeats.maybe_flush(app.sessions)
    if body.health is not None:
        await _tell_failures(app, node)
    if reply.drained is not None:  # a GPU's driver asked for what only a drain repairs: as an operator's drain
        log.warning("node %s drains: %s", node, reply.drained)
        await _tell_drain(app, DrainNotice(node=node, reason=reply.drained))
    # Not a heartbeat: the agent (re)started, or its host or approval changed, so its node may take work again.
    app.admission_passes.ask(f"node {node} reported")
    return reply
