"""Migration 0007 and `berth apply`: an InferenceCluster's connection reference reaches PostgreSQL (and from there
the control worker's cluster driver), the Secret's content never does, and a cluster without one stays simulated."""

from __future__ import annotations

import yaml

from fleet.loader import parse_fleet
from store.apply import apply_fleet
from store.cluster_targets import load_target
from store.models import ClusterRow

CLASS = {
    "apiVersion": "modelplane.ai/v1alpha1",
    "kind": "InferenceClass",
    "metadata": {"name": "h200"},
    "spec": {"devices": [{"name": "gpu", "claim": "DRA", "driver": "gpu.nvidia.com", "count": 8}]},
}


def cluster(name: str, annotations: dict[str, str] | None = None, spec_cluster: dict | None = None) -> dict:
    spec: dict = {
        "taints": [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}],
        "nodePools": [
            {"name": "serve", "className": "h200", "nodeCount": 2},
            {"name": "burst", "className": "h200", "nodeCount": 1, "maxNodeCount": 6},
        ],
    }
    if spec_cluster is not None:
        spec["cluster"] = spec_cluster
    return {
        "apiVersion": "modelplane.ai/v1alpha1",
        "kind": "InferenceCluster",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


async def test_connection_reference_is_stored_and_read_back(sessions) -> None:
    existing = {"source": "Existing", "existing": {"secretRef": {"name": "prod-east"}}}
    fleet = parse_fleet(
        [
            (
                "fleet.yaml",
                yaml.safe_dump_all(
                    [
                        CLASS,
                        cluster(
                            "east",
                            {"berth.dev/kube-context": "admin@east", "berth.dev/gateway": "gw/inference"},
                            existing,
                        ),
                        cluster("west"),
                    ]
                ),
            )
        ]
    )
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    async with sessions() as session:
        row = await session.get(ClusterRow, "east")
        assert row is not None and row.connection == {
            "method": "kubeconfig",
            "secret_name": "prod-east",
            "secret_key": "kubeconfig",
            "context": "admin@east",
            "gateway": "gw/inference",
        }
        target = await load_target(session, "east")
        assert target is not None and target.connection.secret_name == "prod-east"
        assert [(t.key, t.value, t.effect) for t in target.tolerations] == [("dedicated", "inference", "NoSchedule")]
        assert target.autoscaled == {"burst": 6}
        assert await load_target(session, "west") is None  # no connection: simulated
        assert await load_target(session, "nowhere") is None

    # The connection removed from the file: the cluster goes back to the simulated driver.
    fleet = parse_fleet([("fleet.yaml", yaml.safe_dump_all([CLASS, cluster("east"), cluster("west")]))])
    async with sessions.begin() as session:
        await apply_fleet(session, fleet)
    async with sessions() as session:
        assert await load_target(session, "east") is None
