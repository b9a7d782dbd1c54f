"""The deployment workflow on real clusters (the Kubernetes driver against an API server fake per cluster): only
nodes that can take work are capacity, and a cluster that cannot be reached is not Ready while the replicas it
already runs stay (docs/seeds.md, "Existing replicas keep their place": a degraded cluster is retained)."""

from __future__ import annotations

from pathlib import Path

from tests.kube_fake import FakeKubernetes, node, node_list
from tests.workflows.deployment_lab import deployment, deployment_lab, k8s_fleet
from workflows.deployment import client as deployment_client


async def test_observed_nodes_are_the_capacity_and_an_unreachable_cluster_keeps_its_replicas(
    temporal_client, sessions, tmp_path: Path
) -> None:
    async with deployment_lab(temporal_client, sessions, tmp_path, k8s_fleet({"east": 3}), driver="kubernetes") as lab:
        api = lab.kube["east"]
        # The fleet file says 3 nodes; on the cluster one is cordoned and one NotReady.
        api.set_nodes(
            node_list(
                node("east-0", "serve"), node("east-1", "serve", cordoned=True), node("east-2", "serve", ready=False)
            )
        )
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


def _scheduled_pod(api: FakeKubernetes, replica: str, node_name: str) -> None:
    """A pod of the replica's Deployment bound to `node_name`, as the scheduler would bind it (the fake schedules
    nothing): its template's labels and tolerations, `spec.nodeName`, and its owner (so it goes with the workload)."""
    served = next(d for d in api.of_kind("Deployment") if d["metadata"]["labels"]["modelplane.ai/replica"] == replica)
    template = served["spec"]["template"]
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{served['metadata']['name']}-7d9f8-x2k4q",
                "namespace": served["metadata"]["namespace"],
                "labels": template["metadata"]["labels"],
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": served["metadata"]["name"],
                        "uid": served["metadata"]["uid"],
                    }
                ],
            },
            "spec": {**template["spec"], "nodeName": node_name},
        }
    )


async def test_unhealthy_nodes_are_named_in_the_status_and_a_replica_on_a_no_execute_node_moves(
    temporal_client, sessions, tmp_path: Path
) -> None:
    """GPU health on Kubernetes: a node whose GPU health check set a problem condition is not capacity, and the
    deployment's status says which node and why; a replica whose pod sits on a node the GPU operator tainted
    NoExecute is deleted and created again, on a node that can take it."""
    unhealthy = {
        "type": "GpuUnhealthy",
        "status": "True",
        "reason": "XidCritical",
        "message": "Xid 79 on GPU 0000:1b:00.0",
    }
    async with deployment_lab(temporal_client, sessions, tmp_path, k8s_fleet({"east": 3}), driver="kubernetes") as lab:
        api = lab.kube["east"]
        api.set_nodes(
            node_list(node("east-0", "serve"), node("east-1", "serve"), node("east-2", "serve", conditions=[unhealthy]))
        )
        await lab.apply(deployment("llama", 3))
        status = await lab.settled("llama", 2)
        [note] = status.clusters
        assert (note.cluster, note.reason) == ("east", "InsufficientNodes")
        assert "(not counted: east-2: condition GpuUnhealthy (XidCritical: Xid 79 on GPU 0000:1b:00.0))" in note.message
        assert lab.workloads() == ["east/llama-east-0", "east/llama-east-1"]

        # The replica on east-0: its node is tainted NoExecute for a failed GPU, which its pod does not tolerate.
        _scheduled_pod(api, "llama-east-0", "east-0")
        _scheduled_pod(api, "llama-east-1", "east-1")
        taint = {"key": "nvidia.com/gpu.health", "value": "failed", "effect": "NoExecute"}
        api.set_nodes(
            node_list(node("east-0", "serve", taints=[taint]), node("east-1", "serve"), node("east-2", "serve"))
        )
        await lab.handle("llama").signal("inventory_changed", {"reason": "east-0 tainted"})
        # Moved: the replica at index 0 is deleted (its pod with it) and created again on east-2, the one node that
        # can take it; the node tainted NoExecute is named as not counted.
        await lab.wait_until("llama", lambda s: s.state == "steady" and len(api.of_kind("Pod")) == 1, timeout=60)
        status = await lab.settled("llama", 2)
        assert [p["metadata"]["labels"]["modelplane.ai/replica"] for p in api.of_kind("Pod")] == ["llama-east-1"]
        assert lab.workloads() == ["east/llama-east-0", "east/llama-east-1"]
        [note] = status.clusters
        assert "(not counted: east-0: tainted nvidia.com/gpu.health=failed:NoExecute)" in note.message
        assert status.recent_removals == [
            "llama-east-0: UntoleratedNoExecuteTaint: its pod "
            "llama-east-0-serve-m0-7d9f8-x2k4q runs on node east-0, tainted "
            "nvidia.com/gpu.health=failed:NoExecute"
        ]

        await deployment_client.delete(temporal_client, "llama")
        assert (await lab.handle("llama").result()).state == "deleted"
