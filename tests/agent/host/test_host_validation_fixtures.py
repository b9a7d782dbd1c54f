"""Each fixture host of tests/hosts/sysfs_tree.py, discovered from its /sys-shaped tree and checked against the slots the fleet
approves for it: what `berth nodes discover` and the agent's reports say about it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host.gpu_details import RecordedNvidiaSmi
from agent.host.sysfs import discover_host
from fleet.node import Node
from scheduler.host.checks import SlotCheck, ValidationState
from scheduler.host.validate import validate_slots
from tests.hosts import sysfs_tree

EXPECTED: dict[str, dict[int, SlotCheck]] = {
    "hgx_h200": {},
    "missing_gpu": {5: SlotCheck.GPU_ABSENT},
    "vf_declared_twice": {2: SlotCheck.VF_DECLARED_TWICE, 3: SlotCheck.VF_DECLARED_TWICE},
    "nvme_mounted": {1: SlotCheck.NVME_IN_USE},
    "gpu_on_nvidia": {0: SlotCheck.GPU_NOT_VFIO},
    "malformed": {6: SlotCheck.SYSFS_UNREADABLE, 7: SlotCheck.SYSFS_UNREADABLE},
    "j22u15": dict.fromkeys(range(8), SlotCheck.NO_PER_SLOT_VF),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fixture_host_validates_as_an_operator_would_expect(name: str, tmp_path: Path) -> None:
    fixture = getattr(sysfs_tree, name)()
    root = fixture.write(tmp_path)
    recorded = fixture.recorded_nvidia_smi(root)
    host = discover_host(root, gpu_details=RecordedNvidiaSmi(recorded) if recorded else None)
    node = Node.model_validate(fixture.node)
    validation = validate_slots(node.slots, host)
    failing = {verdict.index: verdict.reason for verdict in validation.slots if verdict.reason is not None}
    assert failing == EXPECTED[name]
    for verdict in validation.slots:
        if verdict.reason is None:
            assert verdict.state is ValidationState.VALID
        elif verdict.reason is SlotCheck.NO_PER_SLOT_VF or verdict.reason is SlotCheck.VF_DECLARED_TWICE:
            assert verdict.state is ValidationState.RAW_ONLY  # raw GPUs still count, slices do not
        else:
            assert verdict.state is ValidationState.INVALID and verdict.message
    assert (validation.slices_blocked is not None) == (name == "j22u15")
