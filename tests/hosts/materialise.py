"""Write every fixture host to disk, so a command (or a document) can be pointed at one as if it were a host.

    python -m tests.hosts.materialise DIR

writes DIR/<name>/ (the host's root: sys/, proc/, dev/, and recorded/ where nvidia-smi was recorded) and
DIR/<name>.node.json (the fleet-file node approved for it). An existing DIR/<name>/ is replaced.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml

from tests.hosts.sysfs_tree import all_fixture_hosts


def materialise(directory: Path) -> list[Path]:
    roots = []
    for host in all_fixture_hosts():
        root = directory / host.name
        if root.exists():
            shutil.rmtree(root)
        host.write(root)
        (directory / f"{host.name}.node.json").write_text(json.dumps(host.node, indent=2) + "\n")
        roots.append(root)
    # The fleet loader itself refuses one VF declared by two slots, so that host's approval exists only as its JSON.
    loadable = [host.node for host in all_fixture_hosts() if host.name != "vf-declared-twice"]
    (directory / "fleet.yaml").write_text(fixture_fleet(loadable))
    return roots


def fixture_fleet(nodes: list[dict[str, object]]) -> str:
    """A fleet file approving every fixture host, so `berth nodes discover --root DIR/<host> -f DIR/fleet.yaml
    --node-id <host>` validates each one."""
    documents = [
        {"apiVersion": "berth.dev/v1alpha1", "kind": "Region", "metadata": {"name": "lab"}, "spec": {}},
        {
            "apiVersion": "modelplane.ai/v1alpha1",
            "kind": "InferenceClass",
            "metadata": {"name": "h200"},
            "spec": {
                "devices": [
                    {
                        "name": "gpu",
                        "driver": "gpu.nvidia.com",
                        "count": 8,
                        "attributes": {"productName": {"string": "NVIDIA H200"}},
                    }
                ]
            },
        },
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "InferenceCluster",
            "metadata": {"name": "fixtures"},
            "spec": {
                "region": "lab",
                "nodePools": [
                    {"name": "hgx", "className": "h200", "shape": "gpu_slice", "gpuProduct": "H200", "nodes": nodes}
                ],
            },
        },
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    args.directory.mkdir(parents=True, exist_ok=True)
    for root in materialise(args.directory):
        print(root)


if __name__ == "__main__":
    main()
