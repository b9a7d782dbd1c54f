"""The node agent's activities: plan under a lease, create the VM, wait for readiness, tear down and wipe.

The agent is the host-local authority, the node scheduler of docs/seeds.md, "Four layers, each deciding only what
it knows". It never trusts the control plane's picture of its host: every
plan starts from what the topology driver discovers now, each approved slot validated against it
(`scheduler.host.validate.validate_slots`: a GPU gone, rebound or sharing its IOMMU group is never planned), overlaid
with the host's own live leases and VMs, and is decided by the same pure planner (`scheduler.placement.bundles.plan_bundles`)
the control plane previews with.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from agent.approved import ApprovedSlots
from agent.drivers import ImageNotFound, TopologyDriver, VmCreateError, VmDriver
from agent.host.wipe import SlotWipe
from agent.leases import Lease, LeaseStore
from contracts.allocation import (
    LeaseRef,
    PlanInput,
    PlanOutcome,
    Readiness,
    ReadinessInput,
    TeardownInput,
    TeardownResult,
    VmInfo,
    VmSpec,
)
from contracts.audit import HostState, LeaseFact, VmFact, WipeRequest, WipeResult
from contracts.failures import IMAGE_NOT_FOUND, LEASE_LOST, SLOT_IN_USE, VM_CREATE_FAILED, WIPE_FAILED
from contracts.placement import PlanRequest
from contracts.vocabulary import NodeStatus, SlotState
from scheduler.host.checks import NodeValidation, ValidationState
from scheduler.host.inventory import HostInventory
from scheduler.host.validate import validate_slots
from scheduler.placement.bundles import plan_bundles
from scheduler.views import NodeView, slot_view


class NodeAgent:
    def __init__(
        self,
        node: str,
        topology: TopologyDriver,
        vms: VmDriver,
        leases: LeaseStore,
        lease_seconds: float = 120.0,
        approved: ApprovedSlots | None = None,
    ) -> None:
        self.node = node
        self.topology = topology
        self.vms = vms
        self.leases = leases
        self.lease_seconds = lease_seconds
        self.approved = approved or ApprovedSlots()
        # Slots whose GPU's function-level reset failed at their last wipe: the reporter's health signal,
        # until a later wipe resets the GPU.
        self.reset_failures: dict[int, str] = {}

    def discover(self) -> HostInventory:
        """The host as discovered now, with the line that says how it runs VMs (the report carries both)."""
        return self.topology.discover().model_copy(update={"vm_runtime": self.vms.runtime()})

    def validated(self, host: HostInventory | None = None) -> tuple[HostInventory, NodeValidation]:
        """The host as discovered now, and every approved slot checked against it."""
        host = host or self.discover()
        return host, validate_slots(self.approved.slots, host)

    def topology_view(self) -> NodeView:
        """The approved slots with their validation against the host now, every slot FREE."""
        host, validation = self.validated()
        slots = []
        for slot in self.approved.slots:
            verdict = validation.verdict(slot.index)
            slots.append(
                slot_view(
                    self.node,
                    slot,
                    validation=verdict.state if verdict is not None else ValidationState.UNVALIDATED,
                    validation_reason=verdict.reason if verdict is not None else None,
                )
            )
        # Cordons and drains are the control plane's business: on its own host the agent plans whatever it is sent.
        return NodeView(name=self.node, status=NodeStatus.READY, slots=tuple(slots), numa_nodes=max(len(host.numa), 1))

    def host_view(self, now: datetime) -> NodeView:
        """Validated topology, with slots held by live leases or by VMs marked as such."""
        holders: dict[int, tuple[SlotState, str]] = {}
        for lease in self.leases.read_all():
            if lease.live(now):
                for bundle in lease.devices:
                    holders[bundle.slot_index] = (SlotState.LEASED, lease.allocation_id)
        for vm in self.vms.list():
            for index in vm.slot_indexes:
                holders[index] = (SlotState.CLAIMED, vm.allocation_id)
        view = self.topology_view()
        slots = tuple(
            dataclasses.replace(slot, state=holders[slot.index][0], holder=holders[slot.index][1])
            if slot.index in holders
            else slot
            for slot in view.slots
        )
        return dataclasses.replace(view, slots=slots)

    def wiped(self, outcomes: list[SlotWipe]) -> list[SlotWipe]:
        """Note each slot whose GPU reset failed (or succeeded again) for the health reports."""
        for outcome in outcomes:
            if outcome.reset_error is not None:
                self.reset_failures[outcome.index] = outcome.reset_error
            elif outcome.gpu_reset:
                self.reset_failures.pop(outcome.index, None)
        return outcomes

    @activity.defn(name="plan_bundles")
    def plan(self, request: PlanInput) -> PlanOutcome:
        """Pick bundles and lease them, or refuse with the node scheduler's reason. Idempotent per allocation."""
        now = datetime.now(UTC)
        with self.leases.locked():
            held = self.leases.get(request.allocation_id)
            if held is not None and held.live(now):
                return self.planned(held)
            result = plan_bundles(
                self.host_view(now),
                PlanRequest(
                    allocation_id=request.allocation_id,
                    gpu_count=request.gpu_count,
                    shape=request.shape,
                    numa_policy=request.numa_policy,
                    gpus=frozenset(request.gpus),
                ),
            )
            if result.plan is None:
                assert result.refusal is not None
                return PlanOutcome(
                    node=self.node, refusal_code=str(result.refusal.code), refusal_message=result.refusal.message
                )
            info = activity.info()
            lease = Lease(
                allocation_id=request.allocation_id,
                task_id=f"{info.workflow_run_id}/{info.activity_id}",
                node=self.node,
                slot_ids=[str(b.slot_id) for b in result.plan.bundles],
                devices=result.plan.bundles,
                expires_at=now + timedelta(seconds=self.lease_seconds),
            )
            self.leases.write(lease)
        return self.planned(lease)

    def planned(self, lease: Lease) -> PlanOutcome:
        return PlanOutcome(
            node=self.node,
            bundles=lease.devices,
            lease_expires_at=lease.expires_at,
            ready_when_created=self.vms.ready_when_created(),
        )

    @activity.defn(name="release_lease")
    def release_lease(self, ref: LeaseRef) -> bool:
        return self.leases.release(ref.allocation_id)

    @activity.defn(name="create_vm")
    def create_vm(self, spec: VmSpec) -> VmInfo:
        """Create the VM from an accepted plan. The plan's lease must still be held: the executor never invents a
        placement, and a lease that expired may already have been handed to someone else. Where this host's VMs
        can be ready the moment they exist, the create takes the first readiness look too (`VmSpec.first_look`):
        one node step instead of two."""
        existing = self.vms.get(spec.allocation_id)
        if existing is None:
            lease = self.leases.get(spec.allocation_id)
            wanted = sorted(b.slot_index for b in spec.bundles)
            if lease is None or not lease.live(datetime.now(UTC)):
                raise ApplicationError(
                    f"the lease for {spec.allocation_id} on {self.node} is no longer held (expired or released)",
                    type=LEASE_LOST,
                    non_retryable=True,
                )
            if sorted(b.slot_index for b in lease.devices) != wanted:
                raise ApplicationError(
                    f"the plan's slots {wanted} do not match the lease on {self.node}",
                    type=LEASE_LOST,
                    non_retryable=True,
                )
            activity.heartbeat("creating")
            try:
                # A cancel that comes with a liveness heartbeat (liveness.py) waits until the create is done, so
                # the compensation that follows destroys a whole VM, never one cut short mid-definition.
                with activity.shield_thread_cancel_exception():
                    existing = self.vms.create(spec)
            except ImageNotFound as exc:
                raise ApplicationError(str(exc), type=IMAGE_NOT_FOUND, non_retryable=True) from exc
            except VmCreateError as exc:
                raise ApplicationError(str(exc), type=VM_CREATE_FAILED, non_retryable=True) from exc
        # The VM now holds the slots on this host; the lease has done its job.
        self.leases.release(spec.allocation_id)
        look = spec.first_look
        readiness = (
            self.vms.readiness(spec.allocation_id, look.gpu_count) if look and self.vms.ready_when_created() else None
        )
        return VmInfo(
            allocation_id=spec.allocation_id,
            node=self.node,
            vm_id=existing.vm_id,
            private_ips=existing.private_ips,
            readiness=readiness,
        )

    @activity.defn(name="wait_ready")
    def wait_ready(self, request: ReadinessInput) -> Readiness:
        """Probe the gates until they pass, one fails for good, or the window closes, heartbeating each probe; the
        workflow bounds the total wait with its own readiness timeout and calls again. A failure is answered at once:
        the next probe would ask the guest afresh, and the answer that failed would be lost in a window's last look."""
        deadline = time.monotonic() + request.window_seconds
        while True:
            report = self.vms.readiness(request.allocation_id, request.gpu_count)
            activity.heartbeat(report.model_dump())
            if report.ready or report.failed_gate is not None or time.monotonic() >= deadline:
                return report
            time.sleep(request.poll_seconds)

    @activity.defn(name="destroy_vm")
    def destroy_vm(self, request: TeardownInput) -> TeardownResult:
        """Destroy the VM and wipe its slots, then drop any lease left. Idempotent: a second call finds nothing.
        A slot that could not be wiped fails the teardown (`WipeFailed`, retried): the workflow then quarantines the
        slots, and they come back only once a wipe succeeds."""
        vm = self.vms.get(request.allocation_id)
        indexes = sorted(set(request.slot_indexes) | set(vm.slot_indexes if vm else []))
        destroyed = self.vms.destroy(request.allocation_id)
        if self.vms.get(request.allocation_id) is not None:  # never wipe or free slots under a VM that holds them
            raise ApplicationError(f"the VM of {request.allocation_id} is still there after destroy", type=WIPE_FAILED)
        self.leases.release(request.allocation_id)
        approved = {slot.index: slot for slot in self.approved.slots}
        unknown = [index for index in indexes if index not in approved]
        outcomes = self.wiped(
            self.vms.wipe([approved[index] for index in indexes if index in approved]) if indexes else []
        )
        failures = [f"slot {o.index}: {o.error}" for o in outcomes if not o.ok] + [
            f"slot {index}: not in this node's approved slots, so its devices are unknown" for index in unknown
        ]
        if failures:
            raise ApplicationError("; ".join(failures), type=WIPE_FAILED)
        return TeardownResult(vm_destroyed=destroyed, wiped_slots=indexes)

    @activity.defn(name="host_state")
    def host_state(self) -> HostState:
        """The agent's own account of its host for the reconciler: every VM its runtime has and every lease file."""
        vms = [
            VmFact(
                allocation_id=vm.allocation_id,
                vm_id=vm.vm_id,
                slot_indexes=sorted(vm.slot_indexes),
                created_at=datetime.fromtimestamp(vm.created_at, UTC),
            )
            for vm in self.vms.list()
        ]
        leases = [
            LeaseFact(
                allocation_id=lease.allocation_id,
                slot_indexes=sorted(b.slot_index for b in lease.devices),
                expires_at=lease.expires_at,
            )
            for lease in self.leases.read_all()
        ]
        return HostState(node=self.node, vms=vms, leases=leases, read_at=datetime.now(UTC))

    @activity.defn(name="wipe_slots")
    def wipe_slots(self, request: WipeRequest) -> WipeResult:
        """Wipe slots no VM or live lease uses (the reconciler, before it frees or un-quarantines them). A slot in use
        is refused, never wiped; a wipe that fails is `WipeFailed` and the slot stays as it is."""
        now = datetime.now(UTC)
        with self.leases.locked():  # no plan may lease these slots while they are being checked and wiped
            in_use = {index: vm.allocation_id for vm in self.vms.list() for index in vm.slot_indexes}
            for lease in self.leases.read_all():
                if lease.live(now):
                    in_use.update({b.slot_index: lease.allocation_id for b in lease.devices})
            busy = [f"slot {i} is used by allocation {in_use[i]}" for i in sorted(request.slot_indexes) if i in in_use]
            if busy:
                raise ApplicationError("; ".join(busy), type=SLOT_IN_USE, non_retryable=True)
            approved = {slot.index: slot for slot in self.approved.slots}
            unknown = [i for i in request.slot_indexes if i not in approved]
            if unknown:
                raise ApplicationError(
                    f"slots {sorted(unknown)} are not in {self.node}'s approved slots, so their devices are unknown",
                    type=WIPE_FAILED,
                    non_retryable=True,
                )
            outcomes = self.wiped(self.vms.wipe([approved[i] for i in sorted(set(request.slot_indexes))]))
        failures = [f"slot {o.index}: {o.error}" for o in outcomes if not o.ok]
        if failures:
            raise ApplicationError("; ".join(failures), type=WIPE_FAILED)
        return WipeResult(wiped_slots=sorted(o.index for o in outcomes))

    def activities(self) -> list[object]:
        return [
            self.plan,
            self.release_lease,
            self.create_vm,
            self.wait_ready,
            self.destroy_vm,
            self.host_state,
            self.wipe_slots,
        ]
