"""The node agent on its own host: plans under a lease, refuses what the host cannot give, never creates a VM
without the lease, and cleans up idempotently. Activities run in Temporal's ActivityEnvironment (no server needed:
these are the host-local parts)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from agent.activities import NodeAgent
from agent.approved import ApprovedSlots
from agent.leases import LeaseStore
from agent.simulated import SimulatedTopology, SimulatedVmDriver
from contracts.allocation import LeaseRef, PlanInput, Readiness, ReadinessInput, TeardownInput, VmSpec
from contracts.placement import CapacityShape
from fleet.node import Node, Simulation


def _host(gpus: int = 4, simulation: Simulation | None = None) -> Node:
    return Node.model_validate(
        {
            "name": "h1",
            "numaNodes": 2,
            "simulation": (simulation or Simulation()).model_dump(by_alias=True),
            "slots": [
                {
                    "index": i,
                    "gpuPci": f"0000:{0x10 + i:02x}:00.0",
                    "fabricVfPci": f"0000:{0x40 + i:02x}:00.2",
                    "numaNode": i // 2,
                }
                for i in range(gpus)
            ],
        }
    )


def _agent(tmp_path: Path, host: Node, lease_seconds: float = 60) -> NodeAgent:
    return NodeAgent(
        "h1",
        SimulatedTopology(host),
        SimulatedVmDriver(tmp_path, host.simulation),
        LeaseStore(tmp_path / "leases"),
        lease_seconds=lease_seconds,
        approved=ApprovedSlots(host.slots),
    )


def _plan(allocation: str, gpus: int = 2) -> PlanInput:
    return PlanInput(allocation_id=allocation, attempt=1, gpu_count=gpus, shape=CapacityShape.GPU_SLICE)


def test_two_plans_on_one_host_never_share_a_slot_and_leases_are_files(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, _host()), ActivityEnvironment()
    first = env.run(agent.plan, _plan("a"))
    second = env.run(agent.plan, _plan("b"))
    assert set(first.slot_indexes).isdisjoint(second.slot_indexes)
    assert {b.numa_node for b in first.bundles} == {0} and {b.numa_node for b in second.bundles} == {1}
    lease = json.loads((tmp_path / "leases" / "a.json").read_text())
    assert set(lease) >= {"allocation_id", "task_id", "slot_ids", "devices", "expires_at"}
    assert lease["slot_ids"] == ["h1/0", "h1/1"]
    third = env.run(agent.plan, _plan("c"))
    assert third.refusal_code == "slots_leased" and third.bundles == []
    assert env.run(agent.plan, _plan("a")).slot_indexes == first.slot_indexes  # idempotent per allocation


def test_a_vm_is_never_created_without_its_lease(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, _host(), lease_seconds=60), ActivityEnvironment()
    plan = env.run(agent.plan, _plan("a"))
    env.run(agent.release_lease, LeaseRef(allocation_id="a", node="h1"))
    with pytest.raises(ApplicationError, match="no longer held") as lost:
        env.run(agent.create_vm, VmSpec(allocation_id="a", node="h1", bundles=plan.bundles))
    assert lost.value.type == "LeaseLost" and lost.value.non_retryable
    assert agent.vms.list() == []


def test_create_is_idempotent_and_hands_the_slots_from_lease_to_vm(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, _host()), ActivityEnvironment()
    plan = env.run(agent.plan, _plan("a"))
    spec = VmSpec(allocation_id="a", node="h1", bundles=plan.bundles)
    first, again = env.run(agent.create_vm, spec), env.run(agent.create_vm, spec)
    assert first.vm_id == again.vm_id and len(agent.vms.list()) == 1
    assert list((tmp_path / "leases").glob("*.json")) == []
    assert env.run(agent.plan, _plan("b", gpus=4)).refusal_code is not None  # the VM holds two of the four slots
    report = env.run(agent.wait_ready, ReadinessInput(allocation_id="a", node="h1", gpu_count=2, window_seconds=1))
    assert report.ready
    torn = env.run(agent.destroy_vm, TeardownInput(allocation_id="a", node="h1", slot_indexes=plan.slot_indexes))
    assert torn.vm_destroyed and torn.wiped_slots == [0, 1]
    assert env.run(agent.destroy_vm, TeardownInput(allocation_id="a", node="h1")).vm_destroyed is False


@pytest.mark.parametrize(
    ("simulation", "looked"),
    [
        (Simulation(), "ready"),  # VMs ready the moment they exist: the create's look spares a `wait_ready`
        (Simulation.model_validate({"neverReady": True}), "not ready"),  # looked, and the wait goes on as ever
        (Simulation.model_validate({"bootSeconds": 30}), None),  # a guest that boots: no look, `wait_ready` waits
    ],
)
def test_the_create_takes_the_first_readiness_look_only_where_a_vm_can_be_ready_at_once(
    tmp_path: Path, simulation: Simulation, looked: str | None
) -> None:
    agent, env = _agent(tmp_path, _host(simulation=simulation)), ActivityEnvironment()
    plan = env.run(agent.plan, _plan("a"))
    assert plan.ready_when_created is (looked is not None)  # what the workflow asks the create for follows it
    look = ReadinessInput(allocation_id="a", node="h1", gpu_count=2)
    created = env.run(agent.create_vm, VmSpec(allocation_id="a", node="h1", bundles=plan.bundles, first_look=look))
    seen = None if created.readiness is None else ("ready" if created.readiness.ready else "not ready")
    assert seen == looked
    # Asked for no look (a workflow from before it), the create answers as it always did.
    again = env.run(agent.create_vm, VmSpec(allocation_id="a", node="h1", bundles=plan.bundles))
    assert again.readiness is None and again.vm_id == created.vm_id


def test_expired_leases_stop_holding_slots_and_are_reaped(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, _host(gpus=2), lease_seconds=60), ActivityEnvironment()
    env.run(agent.plan, _plan("a"))
    assert env.run(agent.plan, _plan("b")).refusal_code == "slots_leased"
    assert agent.leases.reap(now=datetime.now(UTC) + timedelta(seconds=61)) == ["a"]
    assert env.run(agent.plan, _plan("b")).refusal_code is None


def test_simulated_faults(tmp_path: Path) -> None:
    env = ActivityEnvironment()
    changed = _agent(tmp_path / "changed", _host(simulation=Simulation(refuse_plans=True)))
    changed.topology.discover()  # the start report saw the host whole; the VFs vanish after it
    refused = env.run(changed.plan, _plan("a"))
    assert refused.refusal_code == "slots_invalid" and "0/4 slots approved with a per-slot VF" in (
        refused.refusal_message or ""
    )
    broken = _agent(tmp_path / "broken", _host(simulation=Simulation(fail_create=True)))
    plan = env.run(broken.plan, _plan("a"))
    with pytest.raises(ApplicationError) as failed:
        env.run(broken.create_vm, VmSpec(allocation_id="a", node="h1", bundles=plan.bundles))
    assert failed.value.type == "VmCreateFailed"
    hung = _agent(tmp_path / "hung", _host(simulation=Simulation(never_ready=True)))
    plan = env.run(hung.plan, _plan("a"))
    env.run(hung.create_vm, VmSpec(allocation_id="a", node="h1", bundles=plan.bundles))
    report = env.run(hung.wait_ready, ReadinessInput(allocation_id="a", node="h1", gpu_count=2, window_seconds=0.3))
    assert not report.ready and report.pending() == ["cloud_init", "gpus"]


def test_a_gate_that_failed_for_good_is_answered_at_once_not_lost_in_the_window(tmp_path: Path) -> None:
    """A real guest's `cloud-init status` answers once: the probe after a failure asks afresh and sees it running.
    The failure must be what the window answers, not the look that came after it."""
    agent, env = _agent(tmp_path, _host()), ActivityEnvironment()
    plan = env.run(agent.plan, _plan("a"))
    env.run(agent.create_vm, VmSpec(allocation_id="a", node="h1", bundles=plan.bundles))
    looks = iter(
        [
            Readiness(ssh=True, cloud_init=False, nvidia_smi=False, detail="cloud_init: still running"),
            Readiness(
                ssh=True,
                cloud_init=False,
                nvidia_smi=False,
                failed_gate="cloud_init",
                failure="status: error; ('scripts-user', RuntimeError('Runparts: 1 failures'))",
            ),
        ]
    )
    after = Readiness(ssh=True, cloud_init=False, nvidia_smi=False, detail="cloud_init: asked again, still running")
    agent.vms.readiness = lambda allocation_id, gpu_count: next(looks, after)  # type: ignore[method-assign]
    request = ReadinessInput(allocation_id="a", node="h1", gpu_count=2, window_seconds=5, poll_seconds=0.01)
    report = env.run(agent.wait_ready, request)
    assert report.failed_gate == "cloud_init" and report.failure is not None and "scripts-user" in report.failure
