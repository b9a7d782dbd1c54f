"""Capacity surfaces: raw free GPUs next to what the node scheduler would accept (docs/seeds.md, "Raw free GPUs
versus placeable slices")."""

from __future__ import annotations

import dataclasses

from contracts.placement import NumaPolicy
from fleet.loader import parse_fleet
from fleet.slot_state import SlotStateDocument
from scheduler.from_fleet import snapshot_from_fleet
from scheduler.host.checks import ValidationState
from scheduler.placement.capacity import capacity

FLEET = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: us-east}
---
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: eu-west}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceClass
metadata: {name: gpu}
spec: {devices: [{name: gpu}]}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: use1}
spec:
  region: us-east
  nodePools:
  - name: vf
    className: gpu
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 2, namePrefix: vf-, gpusPerNode: 8, numaNodes: 2}
  - name: shared
    className: gpu
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 1, namePrefix: shared-, gpusPerNode: 8, numaNodes: 2, fabricClaimMode: shared_parent}
  - name: down
    className: gpu
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 1, namePrefix: down-, gpusPerNode: 8, status: DOWN}
  - name: metal
    className: gpu
    shape: baremetal
    gpuProduct: H100
    nodeTemplate: {count: 3, namePrefix: metal-, gpusPerNode: 8}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: euw1}
spec:
  region: eu-west
  nodePools:
  - name: vf
    className: gpu
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 1, namePrefix: euw-, gpusPerNode: 8}
status:
  conditions: [{type: Ready, status: "False"}]
"""

STATE = {
    "apiVersion": "berth.dev/v1alpha1",
    "kind": "SlotState",
    "metadata": {"name": "now"},
    "spec": {
        "allocations": [
            {"id": "a1", "slots": ["vf-01/0", "vf-01/1", "vf-01/2"]},  # NUMA 0 of vf-01 keeps 1 bundle, NUMA 1 has 4
            {"id": "a2", "state": "leased", "slots": ["metal-01/0"]},
        ],
        "quarantined": ["metal-02/5"],
    },
}


def surfaces(numa_policy: NumaPolicy = NumaPolicy.PREFERRED) -> dict[str, dict[str, object]]:
    world = snapshot_from_fleet(parse_fleet([("fleet.yaml", FLEET)]), [SlotStateDocument.model_validate(STATE)])
    return {entry.pool: entry.model_dump() for entry in capacity(world, numa_policy=numa_policy)}


def test_shared_parent_fabric_node_shows_raw_free_gpus_but_no_slices() -> None:
    shared = surfaces()["use1/shared"]
    assert shared["raw_free_gpus"] == 8
    assert shared["slices"] == {1: 0, 2: 0, 4: 0, 8: 0}


def test_slice_counts_are_per_size_and_follow_the_node_scheduler() -> None:
    pool = surfaces()["use1/vf"]
    assert pool["raw_free_gpus"] == 13
    assert pool["slices"] == {1: 13, 2: 6, 4: 3, 8: 1}  # vf-01 has 5 free bundles, vf-02 8
    required = surfaces(NumaPolicy.REQUIRED)["use1/vf"]["slices"]
    assert required == {1: 13, 2: 2 + 4, 4: 1 + 2, 8: 0}  # per NUMA node: vf-01 1+4, vf-02 4+4


def test_down_nodes_and_unready_clusters_offer_nothing_schedulable() -> None:
    everything = surfaces()
    assert everything["use1/down"]["raw_free_gpus"] == 0 and everything["use1/down"]["ready_nodes"] == 0
    assert everything["use1/down"]["slices"][1] == 0
    not_ready = everything["euw1/vf"]
    assert not_ready["raw_free_gpus"] == 8 and not_ready["slices"] == {1: 0, 2: 0, 4: 0, 8: 0}


def test_bare_metal_counts_wholly_free_hosts() -> None:
    metal = surfaces()["use1/metal"]
    assert metal["baremetal_nodes"] == 1  # metal-01 has a lease, metal-02 a quarantined slot
    assert metal["raw_free_gpus"] == 22 and metal["slices"] == {1: 0, 2: 0, 4: 0, 8: 0}


def test_capacity_can_be_narrowed_to_a_region_and_product() -> None:
    world = snapshot_from_fleet(parse_fleet([("fleet.yaml", FLEET)]))
    assert [c.pool for c in capacity(world, region="eu-west")] == ["euw1/vf"]
    assert [c.pool for c in capacity(world, gpu_product="h100")] == ["use1/metal"]


def test_capacity_counts_only_what_live_agents_validated() -> None:
    """An agent's verdicts change what capacity shows: a raw-only slot is a raw GPU but no slice bundle, an invalid
    slot is neither, and a node whose agent is down is not ready."""
    snapshot = snapshot_from_fleet(parse_fleet([("fleet.yaml", FLEET)]))
    first, second = snapshot.nodes["vf-01"], snapshot.nodes["vf-02"]
    verdicts = {0: ValidationState.INVALID, 1: ValidationState.RAW_ONLY}
    first = dataclasses.replace(
        first,
        slots=tuple(dataclasses.replace(s, validation=verdicts.get(s.index, s.validation)) for s in first.slots),
    )
    snapshot = snapshot.with_nodes([first, dataclasses.replace(second, agent_live=False)])
    [pool] = [p for p in capacity(snapshot) if p.pool == "use1/vf"]
    assert (pool.nodes, pool.ready_nodes, pool.agents_down) == (2, 1, 1)
    assert (pool.gpus, pool.validated_gpus, pool.compatible_gpus) == (16, 15, 14)
    assert pool.raw_free_gpus == 7  # only the live node's, and not its invalid slot
    assert pool.slices[8] == 0 and pool.slices[4] == 1  # 6 bundles left on one live node: one 4-GPU slice fits
