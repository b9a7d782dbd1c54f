"""The node agent's side of the reconciler: its own account of its VMs and leases (`host_state`), and a wipe that
refuses any slot a VM or a live lease still uses (`wipe_slots`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from contracts.allocation import VmSpec
from contracts.audit import WipeRequest
from contracts.failures import SLOT_IN_USE, WIPE_FAILED
from fleet.node import Simulation
from tests.agent.test_node_agent import _agent, _host, _plan


def test_host_state_lists_vms_and_leases_as_the_agent_sees_them(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, _host()), ActivityEnvironment()
    planned = env.run(agent.plan, _plan("vm-owner"))
    env.run(agent.create_vm, VmSpec(allocation_id="vm-owner", node="h1", bundles=planned.bundles))
    leased = env.run(agent.plan, _plan("leaser"))
    state = env.run(agent.host_state)
    assert [(vm.allocation_id, vm.slot_indexes) for vm in state.vms] == [("vm-owner", planned.slot_indexes)]
    assert [(lease.allocation_id, lease.slot_indexes) for lease in state.leases] == [("leaser", leased.slot_indexes)]
    assert state.node == "h1" and state.reachable


def test_wipe_slots_refuses_slots_in_use_and_wipes_free_ones(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, _host()), ActivityEnvironment()
    planned = env.run(agent.plan, _plan("leaser"))  # slots 0 and 1 under a live lease
    with pytest.raises(ApplicationError) as refused:
        env.run(agent.wipe_slots, WipeRequest(node="h1", slot_indexes=[1, 2]))
    assert refused.value.type == SLOT_IN_USE and refused.value.non_retryable
    assert refused.value.message == "slot 1 is used by allocation leaser" and planned.slot_indexes == [0, 1]
    assert not (tmp_path / "wipes.log").exists()  # nothing wiped when any slot is in use

    assert env.run(agent.wipe_slots, WipeRequest(node="h1", slot_indexes=[3, 2])).wiped_slots == [2, 3]
    assert json.loads((tmp_path / "wipes.log").read_text())["slots"] == [2, 3]


def test_a_failed_wipe_is_wipe_failed(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, _host(simulation=Simulation(wipeFails=True))), ActivityEnvironment()
    with pytest.raises(ApplicationError) as failed:
        env.run(agent.wipe_slots, WipeRequest(node="h1", slot_indexes=[0]))
    assert failed.value.type == WIPE_FAILED and "simulated fault: format failed" in str(failed.value)
