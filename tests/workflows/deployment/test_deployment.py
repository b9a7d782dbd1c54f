"""The ModelDeployment workflow against real Temporal and real PostgreSQL (only the clusters are simulated):
replicas spread, scaled up and down by Modelplane's rules, partial and failed scheduling explained, and nothing
left behind in the ledger or on the clusters."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from fleet.loader import parse_fleet
from store.apply import apply_fleet
from tests.workflows.deployment_lab import CLUSTER_DRIVERS, deployment, deployment_lab, k8s_fleet
from workflows.deployment import client as deployment_client
from workflows.deployment.messages import DeploymentStatus
from workflows.deployment.replica import ReplicaWorkflow
from workflows.deployment.workflow import DeploymentWorkflow
from workflows.search_attributes import KIND, STATE


def placed(status) -> list[tuple[str, int]]:
    return [(r.cluster, r.index) for r in status.replicas]


@pytest.mark.parametrize("driver", CLUSTER_DRIVERS)
async def test_spread_scale_up_partial_and_scale_down(temporal_client, sessions, tmp_path: Path, driver: str) -> None:
    fleet = k8s_fleet({"east": 2, "west": 2})
    async with deployment_lab(temporal_client, sessions, tmp_path, fleet, driver=driver) as lab:
        assert await lab.apply(deployment("llama", 3)) is True
        status = await lab.settled("llama", 3)
        # Spread before pack, ties by cluster name; the lowest free index on the cluster.
        assert placed(status) == [("east", 0), ("east", 1), ("west", 0)]
        assert (status.desired, status.scheduled, status.phase, status.reason) == (3, 3, "FullyScheduled", None)
        assert status.replicas[0].pools == {"serve": "serve"} and status.replicas[0].nodes == 1
        assert await lab.ledger() == [
            ("llama-east-0", "east", "serve", 1),
            ("llama-east-1", "east", "serve", 1),
            ("llama-west-0", "west", "serve", 1),
        ]
        assert [row[3] for row in await lab.replica_rows()] == ["ready"] * 3
        assert lab.workloads() == ["east/llama-east-0", "east/llama-east-1", "west/llama-west-0"]
        assert lab.first_pod("east", "llama-east-0") == ({"modelplane.ai/pool": "serve"}, 8)  # pinned, 8 GPUs
        description = await lab.handle("llama").describe()
        assert description.typed_search_attributes.get(KIND) == "deployment"
        assert description.typed_search_attributes.get(STATE) == "FullyScheduled"
        assert (await lab.deployment_row("llama"))["phase"] == "FullyScheduled"

        # Scale up past capacity: 4 of 5 fit; partially scheduled, with the reason per cluster.
        assert await lab.apply(deployment("llama", 5, min_replicas=2)) is False
        status = await lab.settled("llama", 4)
        assert (status.desired, status.scheduled, status.phase) == (5, 4, "PartiallyScheduled")
        assert status.reason == "InsufficientCapacity" and status.message.startswith("4 of 5 replicas scheduled")
        assert {(c.cluster, c.reason) for c in status.clusters} == {
            ("east", "InsufficientNodes"),
            ("west", "InsufficientNodes"),
        }
        assert await lab.overcommitted_pools() == []

        # Scale down to 1: from the cluster hosting the most, then the later name, then the highest index.
        await lab.apply(deployment("llama", 1))
        status = await lab.settled("llama", 1)
        assert placed(status) == [("east", 0)]
        assert status.phase == "FullyScheduled"
        assert await lab.ledger() == [("llama-east-0", "east", "serve", 1)]
        assert lab.workloads() == ["east/llama-east-0"]

        # Delete (the update): every replica torn down, the row gone, the workflow completed.
        await deployment_client.delete(temporal_client, "llama")
        result = await lab.handle("llama").result()
        assert result.state == "deleted"
        assert await lab.ledger() == [] and await lab.replica_rows() == [] and lab.workloads() == []
        assert await lab.deployment_row("llama") is None

        # Determinism: the deployment's history and a replica's replay on the current code.
        replayer = Replayer(workflows=[DeploymentWorkflow, ReplicaWorkflow], data_converter=pydantic_data_converter)
        await replayer.replay_workflow(await lab.handle("llama").fetch_history())
        replica = temporal_client.get_workflow_handle("replica/llama/west/1")
        await replayer.replay_workflow(await replica.fetch_history())


@pytest.mark.parametrize("driver", CLUSTER_DRIVERS)
async def test_schedule_failed_explains_and_cancel_tears_down(
    temporal_client, sessions, tmp_path: Path, driver: str
) -> None:
    fleet = k8s_fleet({"east": 1, "west": 1})
    async with deployment_lab(temporal_client, sessions, tmp_path, fleet, driver=driver) as lab:
        await lab.apply(deployment("nothing-fits", 2, product="NVIDIA-B200"))
        status = await lab.wait_until("nothing-fits", lambda s: s.phase is not None and s.state == "steady")
        assert (status.phase, status.scheduled, status.available) == ("ScheduleFailed", 0, 0)
        assert status.reason == "InsufficientCapacity"
        assert {(c.cluster, c.reason) for c in status.clusters} == {
            ("east", "NoMatchingPool"),
            ("west", "NoMatchingPool"),
        }
        assert "no device of class h200" in status.clusters[0].message
        assert (await lab.handle("nothing-fits").describe()).typed_search_attributes.get(STATE) == "ScheduleFailed"

        # minReplicas above what fits: two would fit, three are needed, so none is started (docs/seeds.md, "Partial scheduling above minReplicas").
        await lab.apply(deployment("big", 3, min_replicas=3))
        status = await lab.wait_until("big", lambda s: s.phase is not None and s.state == "steady")
        assert (status.phase, status.scheduled, status.available, status.replicas) == ("ScheduleFailed", 0, 0, [])
        assert status.message.startswith("2 of 3 replicas can be scheduled, fewer than minReplicas 3")
        assert lab.workloads() == [] and await lab.ledger() == []

        # Cancellation tears everything down too, and the run ends Cancelled.
        await lab.handle("big").cancel()
        assert await lab.closed("big") == WorkflowExecutionStatus.CANCELED
        assert await lab.ledger() == [] and lab.workloads() == []
        assert await lab.deployment_row("big") is None
        await deployment_client.delete(temporal_client, "nothing-fits")  # the next parametrized run reuses its id
        assert await lab.closed("nothing-fits") == WorkflowExecutionStatus.COMPLETED


@pytest.mark.parametrize("driver", CLUSTER_DRIVERS)
async def test_replica_never_ready_is_compensated(temporal_client, sessions, tmp_path: Path, driver: str) -> None:
    async with deployment_lab(temporal_client, sessions, tmp_path, k8s_fleet({"east": 2}), driver=driver) as lab:
        lab.never_ready("east")
        timing = lab.timing.model_copy(update={"readiness_timeout_seconds": 1.5})
        await lab.apply(deployment("stuck", 1), timing=timing)
        await lab.wait_until("stuck", lambda s: lab.workloads() == ["east/stuck-east-0"])
        assert len(await lab.ledger()) == 1 and (await lab.status("stuck")).replicas[0].phase == "starting"
        status = await lab.wait_until("stuck", lambda s: s.recent_failures and not s.replicas)
        assert "stuck-east-0: replica stuck-east-0 on east not ready after 1.5s" in status.recent_failures[0]
        why = {"simulated": "neverReady", "kubernetes": "Deployment stuck-east-0-serve-m0: 0/1 available"}[driver]
        assert why in status.recent_failures[0]
        assert status.available == 0
        assert await lab.ledger() == [] and await lab.replica_rows() == [] and lab.workloads() == []
        replica = deployment_client.handle(temporal_client, "stuck")  # the deployment itself keeps running
        assert (await replica.describe()).status == WorkflowExecutionStatus.RUNNING
        failed = temporal_client.get_workflow_handle("replica/stuck/east/0")
        assert (await failed.describe()).status == WorkflowExecutionStatus.FAILED

        # The cluster recovers; the next resync (here: an inventory-change signal) places the replica again.
        lab.never_ready("east", False)
        await lab.handle("stuck").signal("inventory_changed", {"reason": "east fixed"})
        status = await lab.settled("stuck", 1)
        assert placed(status) == [("east", 0)]
        await deployment_client.delete(temporal_client, "stuck")
        assert await lab.closed("stuck") == WorkflowExecutionStatus.COMPLETED
        assert lab.workloads() == [] and await lab.ledger() == []


async def test_two_deployments_never_overcommit_a_pool(temporal_client, sessions, tmp_path: Path) -> None:
    async with deployment_lab(temporal_client, sessions, tmp_path, k8s_fleet({"east": 2, "west": 2})) as lab:
        await asyncio.gather(lab.apply(deployment("alpha", 4)), lab.apply(deployment("beta", 4)))
        statuses = []
        for name in ("alpha", "beta"):
            statuses.append(
                await lab.wait_until(
                    name, lambda s: s.state == "steady" and all(r.phase == "ready" for r in s.replicas)
                )
            )
        for _ in range(20):  # whatever the interleaving, the ledger never exceeds a pool
            assert await lab.overcommitted_pools() == []
            await asyncio.sleep(0.05)
        ledger = await lab.ledger()
        assert sum(nodes for *_, nodes in ledger) == 4 == len(lab.workloads())
        alpha, beta = (await lab.status("alpha")), (await lab.status("beta"))
        assert alpha.available + beta.available == 4
        assert {alpha.phase, beta.phase} <= {"FullyScheduled", "PartiallyScheduled", "ScheduleFailed"}


async def test_ledger_refuses_an_overcommit_in_the_transaction(sessions, tmp_path: Path) -> None:
    """Two plans that both saw the last node: the second recording is a non-retryable LedgerConflict."""
    from activities.cluster.simulated import SimulatedClusterDriver
    from activities.control.deployments import DeploymentActivities
    from contracts.deployment import EngineUsage, PlanDeploymentInput, RecordReplicaInput
    from fleet.loader import load_fleet
    from store.apply import apply_fleet

    (tmp_path / "fleet.yaml").write_text(k8s_fleet({"east": 1}))
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([tmp_path / "fleet.yaml"]))
    acts = DeploymentActivities(sessions, SimulatedClusterDriver(tmp_path / "clusters"))
    plans = [await acts.plan_deployment(PlanDeploymentInput(deployment=deployment(n, 1))) for n in ("p", "q")]
    assert [len(p.new_replicas) for p in plans] == [1, 1]  # both saw the one node free

    def record(name: str, manifest: dict) -> RecordReplicaInput:
        usage = [EngineUsage(engine="serve", pool="serve", nodes=1)]
        return RecordReplicaInput(
            deployment=name, name=f"{name}-east-0", cluster="east", index=0, manifest=manifest, usage=usage
        )

    assert await acts.record_replica(record("p", plans[0].new_replicas[0])) is True
    assert await acts.record_replica(record("p", plans[0].new_replicas[0])) is False  # idempotent
    with pytest.raises(ApplicationError, match="pool east/serve has 0 free node") as refused:
        await acts.record_replica(record("q", plans[1].new_replicas[0]))
    assert refused.value.type == "LedgerConflict" and refused.value.non_retryable
    replanned = await acts.plan_deployment(PlanDeploymentInput(deployment=deployment("q", 1)))
    assert replanned.plan.status.phase == "ScheduleFailed" and replanned.new_replicas == []


async def test_ledger_refuses_gpus_two_plans_both_gave_out_in_the_transaction(sessions, tmp_path: Path) -> None:
    """fitGranularity Gpu (docs/seeds.md, "GPU-level fit"): two plans that both put 5 of the one node's 8 GPUs on it, and a whole-node
    plan that saw the node free: only the first is recorded; the others are LedgerConflicts naming the node."""
    from activities.cluster.simulated import SimulatedClusterDriver
    from activities.control.deployments import DeploymentActivities
    from contracts.deployment import EngineUsage, PlanDeploymentInput, RecordReplicaInput
    from fleet.loader import load_fleet
    from store.apply import apply_fleet

    (tmp_path / "fleet.yaml").write_text(k8s_fleet({"east": 1}))
    async with sessions.begin() as session:
        await apply_fleet(session, load_fleet([tmp_path / "fleet.yaml"]))
    acts = DeploymentActivities(sessions, SimulatedClusterDriver(tmp_path / "clusters"))

    def by_memory(name: str) -> dict:
        manifest = deployment(name, 1)
        spec = manifest["spec"]["template"]["spec"]
        spec["fitGranularity"] = "Gpu"
        spec["engines"][0]["members"][0] = {"role": "Standalone", "resources": {"gpuMemory": "600Gi"}}  # 5 x 141Gi
        return manifest

    plans = [await acts.plan_deployment(PlanDeploymentInput(deployment=by_memory(n))) for n in ("p", "q")]
    whole = await acts.plan_deployment(PlanDeploymentInput(deployment=deployment("r", 1)))
    assert [len(p.new_replicas) for p in (*plans, whole)] == [1, 1, 1]  # each saw the node free

    def record(name: str, manifest: dict, nodes: int) -> RecordReplicaInput:
        usage = [EngineUsage(engine="serve", pool="serve", nodes=nodes)]
        return RecordReplicaInput(
            deployment=name, name=f"{name}-east-0", cluster="east", index=0, manifest=manifest, usage=usage
        )

    assert await acts.record_replica(record("p", plans[0].new_replicas[0], 0)) is True
    with pytest.raises(ApplicationError, match="node 0 of pool east/serve would give out 10 x gpu; a node has 8"):
        await acts.record_replica(record("q", plans[1].new_replicas[0], 0))
    with pytest.raises(ApplicationError, match="1 would be charged whole and 1 would hold GPU-level pods") as refused:
        await acts.record_replica(record("r", whole.new_replicas[0], 1))
    assert refused.value.type == "LedgerConflict" and refused.value.non_retryable
    replanned = await acts.plan_deployment(PlanDeploymentInput(deployment=by_memory("q")))
    assert replanned.new_replicas == []
    assert "node 0: 3 of 8 free (5 held by other instances)" in replanned.plan.status.clusters[0].message
    small = by_memory("s")
    small["spec"]["template"]["spec"]["engines"][0]["members"][0]["resources"]["gpuMemory"] = "400Gi"  # 3 GPUs
    fits = await acts.plan_deployment(PlanDeploymentInput(deployment=small))
    assert await acts.record_replica(record("s", fits.new_replicas[0], 0)) is True


async def test_continue_as_new_keeps_replicas(temporal_client, sessions, tmp_path: Path) -> None:
    async with deployment_lab(temporal_client, sessions, tmp_path, k8s_fleet({"east": 2, "west": 2})) as lab:
        timing = lab.timing.model_copy(update={"reconciles_per_run": 1})
        await lab.apply(deployment("long", 2), timing=timing)
        await lab.settled("long", 2)
        first_run = (await lab.handle("long").describe()).run_id
        await lab.handle("long").signal("inventory_changed", {})
        status = await lab.wait_until("long", lambda s: s.reconciles == 2 and s.state == "steady")
        for _ in range(50):
            if (await lab.handle("long").describe()).run_id != first_run:
                break
            await asyncio.sleep(0.1)
        assert (await lab.handle("long").describe()).run_id != first_run
        assert (await lab.status("long")).reconciles == 2  # a continued run does not plan again by itself
        assert placed(status) == [("east", 0), ("west", 0)] and status.available == 2
        # Replicas started by an earlier run are still removed by this one.
        await lab.apply(deployment("long", 1), timing=timing)
        status = await lab.settled("long", 1)
        assert placed(status) == [("east", 0)] and lab.workloads() == ["east/long-east-0"]


async def test_replicas_move_off_a_cluster_marked_draining_one_at_a_time(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """Draining (docs/seeds.md, "Draining moves replicas one at a time"): an operator marks `east` draining with an apply; its replicas move to `west`, each
    removed only once its replacement is ready, so two replicas serve throughout."""
    fleet = k8s_fleet({"east": 2, "west": 2})
    async with deployment_lab(temporal_client, sessions, tmp_path, fleet) as lab:
        await lab.apply(deployment("llama", 2))
        status = await lab.settled("llama", 2)
        assert placed(status) == [("east", 0), ("west", 0)]

        documents = list(yaml.safe_load_all(fleet))
        east = next(d for d in documents if d["kind"] == "InferenceCluster" and d["metadata"]["name"] == "east")
        east["metadata"]["annotations"] = {"berth.dev/draining": "true"}
        async with sessions.begin() as session:
            await apply_fleet(session, parse_fleet([("fleet.yaml", yaml.safe_dump_all(documents))]))
        await lab.handle("llama").signal("inventory_changed", {"reason": "east drains"})

        serving: list[int] = []  # ready replicas, at each look while they move

        def moved(s: DeploymentStatus) -> bool:
            serving.append(sum(1 for r in s.replicas if r.phase == "ready"))
            return placed(s) == [("west", 0), ("west", 1)]

        status = await lab.wait_until("llama", moved)
        assert min(serving) == 2
        assert [(r.cluster, r.index, r.phase) for r in status.replicas] == [("west", 0, "ready"), ("west", 1, "ready")]
        assert status.message.endswith("moved every replica off draining capacity")
        assert lab.workloads() == ["west/llama-west-0", "west/llama-west-1"]
        assert await lab.overcommitted_pools() == []
        await deployment_client.delete(temporal_client, "llama")
        await lab.handle("llama").result()
