"""A node agent's report, taken in: liveness, the host it found, and each approved slot validated against that host.

The agent reports its whole `HostInventory` only when its topology hash moves (or when the control plane does not
have it); otherwise a report is a heartbeat. Validation is the pure `scheduler.host.validate.validate_slots` over the
approved slots PostgreSQL holds and the host the agent reported: the agent runs the same function over the same two
inputs for its own plans, and the control plane re-runs it when either side changes (a report of a new topology, or
`berth apply` changing a node's slots), so approval and validation never disagree for longer than one write.

Only rows whose verdict changed are written: a change of `validation` logs the node in `inventory_changes`, and
every control worker and API process then re-reads that node (migration 0008), which an unchanged verdict written
again would cost for nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.vocabulary import NodeStatus
from fleet.node import Slot
from scheduler.host.checks import NodeValidation, SlotVerdict, ValidationState
from scheduler.host.health import STICKY, HealthState, SlotHealth
from scheduler.host.inventory import MAX_HOST_BYTES, HostInventory
from scheduler.host.report import NodeReport, ReportReply, approved_hash
from scheduler.host.validate import validate_slots
from store.db import among
from store.liveness import STALE_AFTER_INTERVALS
from store.models import NodeAgentRow, NodeRow, SlotRow
from store.nodes import node_slots


class TopologyMismatch(ValueError):
    """The inventory sent does not hash to the topology the report names."""


class UnstorableReport(ValueError):
    """The inventory holds text PostgreSQL cannot store (a NUL character): refused, never half-written."""


class ReportTooLarge(ValueError):
    """The inventory is larger than any real host's (`MAX_HOST_BYTES`): refused, nothing stored."""


def slot_of(row: SlotRow) -> Slot:
    return Slot.model_validate(
        {
            "index": row.slot_index,
            "gpuPci": row.gpu_pci_address,
            "fabricParentPci": row.fabric_parent_pci_address,
            "fabricVfPci": row.fabric_vf_pci_address,
            "fabricClaimMode": row.fabric_claim_mode,
            "nvmeDevice": row.nvme_device,
            "numaNode": row.numa_node,
            "vcpus": row.vcpus,
            "memoryMiB": row.memory_mib,
            "mac": row.mac_address,
            "privateIp": row.private_ip,
            "approved": row.approved,
        }
    )


async def record_report(
    session: AsyncSession, node: str, report: NodeReport, now: datetime | None = None
) -> ReportReply:
    """Take one report in. Raises LookupError for an unknown node, TopologyMismatch for an inventory that does not
    hash to the topology named, UnstorableReport or ReportTooLarge for one that is never stored. The caller
    commits."""
    now = now or datetime.now(UTC)
    if await session.get(NodeRow, node) is None:
        raise LookupError(node)
    if report.host is not None:
        try:
            text = report.host.model_dump_json()
        except (PydanticSerializationError, UnicodeEncodeError) as error:
            raise UnstorableReport(f"the host inventory holds text that is not valid Unicode: {error}") from None
        if "\\u0000" in text:
            raise UnstorableReport("the host inventory contains a NUL character, which cannot be stored")
        if len(text) > MAX_HOST_BYTES:
            raise ReportTooLarge(
                f"the host inventory is {len(text)} characters of JSON; a host's is at most {MAX_HOST_BYTES}"
            )
    if report.host is not None and report.host.topology_hash() != report.topology:
        raise TopologyMismatch(
            f"the inventory hashes to {report.host.topology_hash()}, not to the topology {report.topology} named"
        )
    expires = now + timedelta(seconds=report.agent.interval_seconds * STALE_AFTER_INTERVALS)
    agent = await _locked_agent(session, node, now, expires)
    agent.state, agent.seen_at, agent.expires_at = "live", now, expires
    agent.interval_seconds, agent.agent_version = report.agent.interval_seconds, report.agent.version

    rows = await node_slots(session, node)
    slots = [slot_of(row) for row in rows]
    current = approved_hash(slots)
    _note_approval(agent, current, now)
    validation = None
    if report.host is not None:
        agent.topology, agent.host, agent.host_reported_at = report.topology, report.host.model_dump(mode="json"), now
        validation = await _store_validation(session, list(rows), slots, report.host, now)
        agent.slices_blocked = validation.slices_blocked
    drained = None
    if report.health is not None:
        _write_health(list(rows), report.health, now)
        drained = await _drain_if_asked(session, node, report.health)
    repaired = any(
        row.repaired_at is not None and row.repaired_at >= (row.health_at or row.repaired_at) for row in rows
    )
    await session.flush()
    return ReportReply(
        node=node,
        live=True,
        send_host=agent.topology != report.topology,
        approved=current,
        slots=[slot.model_dump(mode="json", by_alias=True) for slot in slots] if report.approved != current else None,
        validation=validation,
        send_health=True if report.health is None and repaired else None,
        drained=drained,
    )


async def _drain_if_asked(session: AsyncSession, node: str, verdicts: list[SlotHealth]) -> str | None:
    """Mark the node DRAINING when a GPU's driver asks for what only a drain repairs (its recovery action is a node
    reboot, or a drain and reset): nothing new lands on it, and the caller tells each allocation on it, as an
    operator's `berth nodes drain` does. The reason names the slot and the action; `uncordon` ends the drain once the
    node is repaired. A node draining already, or DOWN in the fleet file, is left as it is."""
    asking = [v for v in verdicts if v.drain_node and v.recovery_action is not None]
    if not asking:
        return None
    row = await session.get(NodeRow, node, with_for_update=True, populate_existing=True)
    if row is None or row.status in (NodeStatus.DRAINING, NodeStatus.DOWN):
        return None
    row.status = NodeStatus.DRAINING.value
    first = asking[0]
    assert first.recovery_action is not None
    return f"slot {first.index}: the GPU driver's recovery action is {first.recovery_action.value}"


async def _locked_agent(session: AsyncSession, node: str, now: datetime, expires: datetime) -> NodeAgentRow:
    """The node's agent row, locked; created on its first report. Two first reports at once (an agent restarted
    while its old process still reports) both end up updating the one row."""
    agent = await session.get(NodeAgentRow, node, with_for_update=True)
    if agent is not None:
        return agent
    try:
        async with session.begin_nested():
            session.add(NodeAgentRow(node=node, state="live", seen_at=now, expires_at=expires, interval_seconds=0.0))
    except IntegrityError:
        pass  # the other report created it first
    agent = await session.get(NodeAgentRow, node, with_for_update=True, populate_existing=True)
    assert agent is not None
    return agent


async def revalidate(session: AsyncSession, nodes: list[str], now: datetime | None = None) -> None:
    """Re-check the approved slots of `nodes` against the hosts their agents last reported (after an apply changed
    them). Slots of a node whose agent never reported a host are `unvalidated`, as they were created."""
    now = now or datetime.now(UTC)
    reported = select(NodeAgentRow).where(among(NodeAgentRow.node, sorted(set(nodes))), NodeAgentRow.host.is_not(None))
    for agent in (await session.scalars(reported.with_for_update())).all():
        rows = await node_slots(session, agent.node)
        slots = [slot_of(row) for row in rows]
        _note_approval(agent, approved_hash(slots), now)
        try:
            host = HostInventory.model_validate(agent.host)
        except ValidationError:
            # Kept before reports were bounded and larger than any host: forgotten, its slots
            # unvalidated until the agent's next report, which is asked for its host again.
            agent.topology = agent.host = None
            _write_verdicts(rows, {}, now)
            continue
        validation = await _store_validation(session, rows, slots, host, now)
        agent.slices_blocked = validation.slices_blocked
    await session.flush()


def _note_approval(agent: NodeAgentRow, digest: str, now: datetime) -> None:
    if agent.approved != digest:
        agent.approved, agent.approved_at = digest, now


async def _store_validation(
    session: AsyncSession, rows: list[SlotRow], slots: list[Slot], host: HostInventory, now: datetime
) -> NodeValidation:
    validation = validate_slots(slots, host)
    _write_verdicts(rows, {verdict.index: verdict for verdict in validation.slots}, now)
    if rows:
        await session.execute(
            update(SlotRow).where(among(SlotRow.id, [row.id for row in rows])).values(validated_at=now),
            execution_options={"synchronize_session": False},
        )
    return validation


def _write_health(rows: list[SlotRow], verdicts: list[SlotHealth], now: datetime) -> None:
    """Take in the agent's health verdicts. `degraded` and `failed` stand until the slot is repaired
    (`berth nodes repair`): a counter that rose once, or a GPU that fell off the bus and came back, is not trusted
    again on its own; a worse verdict replaces them. `healthy` and `unknown` follow the agent, and so does a verdict
    that is not `lasting` (a VM that stopped: it ends with the VM, the device was not at fault)."""
    by_index = {verdict.index: verdict for verdict in verdicts}
    for row in rows:
        verdict = by_index.get(row.slot_index)
        if verdict is None:
            continue
        if row.health_signals != verdict.signals:
            row.health_signals = verdict.signals
        row.signals_at = now
        stored = HealthState(row.health)
        if stored in STICKY and row.health_lasting and verdict.state.rank <= stored.rank:
            continue
        if (row.health, row.health_reasons, row.health_lasting) != (
            verdict.state.value,
            verdict.reasons,
            verdict.lasting,
        ) or row.repaired_at == row.health_at:
            row.health, row.health_reason, row.health_reasons = verdict.state.value, verdict.reason, verdict.reasons
            row.health_lasting, row.health_at = verdict.lasting, now


def _write_verdicts(rows: list[SlotRow], verdicts: dict[int, SlotVerdict], now: datetime) -> None:
    """Set each row's verdict where it differs (a slot without a verdict is unvalidated)."""
    for row in rows:
        verdict = verdicts.get(row.slot_index)
        state = verdict.state if verdict is not None else ValidationState.UNVALIDATED
        reason = verdict.reason.value if verdict is not None and verdict.reason is not None else None
        message = verdict.message if verdict is not None else None
        if (row.validation, row.validation_reason, row.validation_message) != (state.value, reason, message):
            row.validation, row.validation_reason, row.validation_message = state.value, reason, message
