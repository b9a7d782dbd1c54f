"""docs/seeds.md, "Node groups from GPU Feature Discovery labels", through `berth apply`: a bring-your-own cluster's
nodes, as `kubectl get nodes -o yaml` prints them, become homogeneous pools with a derived InferenceClass; a node
without its GPU labels is reported, not guessed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from cli.main import app
from store.models import InferenceClassRow, PoolRow
from tests.api.served import Served

runner = CliRunner()

REGION = "apiVersion: berth.dev/v1alpha1\nkind: Region\nmetadata: {name: onprem}\n"


def _node(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **labels}},
    }


GFD = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559"}
KUBECTL_OUTPUT = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        _node("gpu-a", **GFD),
        _node("gpu-b", **GFD),
        _node("gpu-c", **{k: v for k, v in GFD.items() if k != "nvidia.com/gpu.memory"}),
    ],
    "metadata": {"resourceVersion": ""},
}


async def test_a_node_list_becomes_a_cluster_of_homogeneous_pools(tmp_path: Path, fleet_api: Served, sessions) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump(KUBECTL_OUTPUT))
    (tmp_path / "region.yaml").write_text(REGION)
    env = fleet_api.admin_env()
    args = ["apply", "-f", str(tmp_path / "region.yaml"), "-f", str(nodes)]

    refused = await asyncio.to_thread(runner.invoke, app, args, env=env)
    assert refused.exit_code == 1
    assert "a NodeList needs --cluster NAME" in refused.output

    applied = await asyncio.to_thread(runner.invoke, app, [*args, "--cluster", "byo-1", "--region", "onprem"], env=env)
    assert applied.exit_code == 0, applied.output
    assert "skipped node gpu-c" in applied.output and "nvidia.com/gpu.memory" in applied.output
    async with sessions() as session:
        pools = (await session.scalars(select(PoolRow).where(PoolRow.cluster == "byo-1"))).all()
        assert [(p.shape, p.node_count) for p in pools] == [("kubernetes", 2)]
        derived = await session.get(InferenceClassRow, pools[0].class_name)
    device = derived.spec["devices"][0]
    assert device["count"] == 8 and device["driver"] == "gpu.nvidia.com"
    assert device["capacity"]["memory"]["value"] == "81559Mi"
