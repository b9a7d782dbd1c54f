"""The ModelDeployment workflow against real Temporal and real PostgreSQL (only the clusters are simulated):
replicas spread, scaled up and down by Modelplane's rules, partial and failed scheduling explained, and nothing
left behind in the ledger or on the clusters."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowExecutionStatus

from tests.workflows.deployment_lab import deployment, deployment_lab, k8s_fleet
from workflows import deployment_client
from workflows.search_attributes import KIND, STATE


def placed(status) -> list[tuple[str, int]]:
    return [(r.cluster, r.index) for r in status.replicas]


async def test_spread_scale_up_partial_and_scale_down(temporal_client, sessions, tmp_path: Path) -> None:
    fleet = k8s_fleet({"east": 2, "west": 2})
    async with deployment_lab(temporal_client, sessions, tmp_path, fleet) as lab:
        assert await lab.apply(deployment("llama", 3)) is True
        status = await lab.settled("llama", 3)
        # Spread before pack, ties by cluster name; the lowest free index on the cluster.
        assert placed(status) == [("east", 0), ("east", 1), ("west", 0)]
        assert (status.desired, status.scheduled, status.phase, status.reason) == (3, 3, "FullyScheduled", None)
        assert status.replicas[0].pools == {"serve": "serve"} and status.replicas[0].nodes == 1
        assert await lab.ledger() == [
            ("llama-east-0", "east", "serve", 1), ("llama-east-1", "east", "serve", 1),
            ("llama-west-0", "west", "serve", 1),
        ]  # fmt: skip
        assert [row[3] for row in await lab.replica_rows()] == ["ready"] * 3
        assert lab.workloads() == ["east/llama-east-0", "east/llama-east-1", "west/llama-west-0"]
        pod = lab.clusters.stored("east", "llama-east-0").workload.pods[0]
        assert pod.node_selector == {"modelplane.ai/pool": "serve"}
        assert pod.resource_claim.requests[0].count == 8
        description = await lab.handle("llama").describe()
        assert description.typed_search_attributes.get(KIND) == "deployment"
        assert description.typed_search_attributes.get(STATE) == "FullyScheduled"
        assert (await lab.deployment_row("llama"))["phase"] == "FullyScheduled"

        # Scale up past capacity: 4 of 5 fit; partially scheduled, with the reason per cluster.
        assert await lab.apply(deployment("llama", 5, min_replicas=2)) is False
        status = await lab.settled("llama", 4)
        assert (status.desired, status.scheduled, status.phase) == (5, 4, "PartiallyScheduled")
        assert status.reason == "InsufficientCapacity" and status.message.startswith("4 of 5 replicas scheduled")
        assert {(c.cluster, c.reason) for c in status.clusters} == {("east", "InsufficientNodes"),
                                                                     ("west", "InsufficientNodes")}  # fmt: skip
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


async def test_schedule_failed_explains_and_cancel_tears_down(temporal_client, sessions, tmp_path: Path) -> None:
    fleet = k8s_fleet({"east": 1, "west": 1})
    async with deployment_lab(temporal_client, sessions, tmp_path, fleet) as lab:
        await lab.apply(deployment("nothing-fits", 2, product="NVIDIA-B200"))
        status = await lab.wait_until("nothing-fits", lambda s: s.phase is not None and s.state == "steady")
        assert (status.phase, status.scheduled, status.available) == ("ScheduleFailed", 0, 0)
        assert status.reason == "InsufficientCapacity"
        assert {(c.cluster, c.reason) for c in status.clusters} == {("east", "NoMatchingPool"),
                                                                     ("west", "NoMatchingPool")}  # fmt: skip
        assert "no device of class h200" in status.clusters[0].message
        assert (await lab.handle("nothing-fits").describe()).typed_search_attributes.get(STATE) == "ScheduleFailed"

        # minReplicas above what fits: ScheduleFailed although one replica runs.
        await lab.apply(deployment("big", 3, min_replicas=3))
        status = await lab.settled("big", 2)
        assert (status.phase, status.scheduled) == ("ScheduleFailed", 2)
        assert status.message.startswith("2 of 3 replicas scheduled")

        # Cancellation tears everything down too, and the run ends Cancelled.
        await lab.handle("big").cancel()
        assert await lab.closed("big") == WorkflowExecutionStatus.CANCELED
        assert await lab.ledger() == [] and lab.workloads() == []
        assert await lab.deployment_row("big") is None
