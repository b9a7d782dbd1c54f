"""The deployment workflow on real clusters (the Kubernetes driver against an API server fake per cluster): only
nodes that can take work are capacity, and a cluster that cannot be reached is not Ready while the replicas it
already runs stay (seed 000: a degraded cluster is retained)."""

from __future__ import annotations

from pathlib import Path

from tests.kube_fake import node, node_list
from tests.workflows.deployment_lab import deployment, deployment_lab, k8s_fleet
from workflows import deployment_client


async def test_observed_nodes_are_the_capacity_and_an_unreachable_cluster_keeps_its_replicas(
    temporal_client, sessions, tmp_path: Path
) -> None:
    async with deployment_lab(temporal_client, sessions, tmp_path, k8s_fleet({"east": 3}), driver="kubernetes") as lab:
        api = lab.kube["east"]
        # The fleet file says 3 nodes; on the cluster one is cordoned and one NotReady.
        api.set_nodes(node_list(node("east-0", "serve"), node("east-1", "serve", cordoned=True),
                                node("east-2", "serve", ready=False)))  # fmt: skip
        spec = deployment("llama", 2)
        spec["spec"]["template"]["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
        await lab.apply(spec)
        status = await lab.settled("llama", 1)
        assert (status.scheduled, status.phase, status.reason) == (1, "PartiallyScheduled", "InsufficientCapacity")
        assert [(c.cluster, c.reason) for c in status.clusters] == [("east", "InsufficientNodes")]
        assert lab.workloads() == ["east/llama-east-0"]
        assert await lab.ledger() == [("llama-east-0", "east", "serve", 1)]
        # The deployment's tolerations are on the pods the cluster runs.
        [served] = api.of_kind("Deployment")
        assert served["spec"]["template"]["spec"]["tolerations"] == [
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]

        # The API server stops answering: the cluster is observed not Ready, and its replica stays.
        api.reachable = False
        await lab.handle("llama").signal("inventory_changed", {"reason": "east unreachable"})
        status = await lab.wait_until("llama", lambda s: s.reconciles >= 2 and s.state == "steady")
        assert [(r.cluster, r.index, r.phase) for r in status.replicas] == [("east", 0, "ready")]
        assert [(c.cluster, c.reason) for c in status.clusters] == [("east", "NotReady")]
        # The driver's reason reaches the status (the API server fake answers 503 while unreachable).
        assert status.clusters[0].message.startswith("the cluster is not Ready: unreachable: 503")
        assert await lab.ledger() == [("llama-east-0", "east", "serve", 1)]
        api.reachable = True
        assert lab.workloads() == ["east/llama-east-0"]

        # The nodes come back: the second replica is placed on the node that can now take it.
        api.set_nodes(node_list(*(node(f"east-{i}", "serve") for i in range(3))))
        await lab.handle("llama").signal("inventory_changed", {"reason": "east healed"})
        status = await lab.settled("llama", 2)
        assert status.phase == "FullyScheduled"
        assert lab.workloads() == ["east/llama-east-0", "east/llama-east-1"]

        await deployment_client.delete(temporal_client, "llama")
        assert (await lab.handle("llama").result()).state == "deleted"
        assert lab.workloads() == [] and await lab.ledger() == []
