"""Seed 003: pools for a bring-your-own cluster, from its nodes as `kubectl get nodes -o yaml` prints them.

NVIDIA GPU Feature Discovery labels every GPU node with `nvidia.com/gpu.product`, `nvidia.com/gpu.count` and
`nvidia.com/gpu.memory` (MiB per GPU). Nodes are grouped by those three values, as KAITO groups them, so each group
is a homogeneous pool by construction, and each group gets an InferenceClass derived from the labels: one DRA
device of driver gpu.nvidia.com with the GPU count, a `productName` attribute and a `memory` capacity. A node
missing any of the three labels, or carrying one that is not a number where a number belongs, is reported, not
guessed: it joins no pool.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.inference_class import ClaimKind, Device, DeviceAttribute, DeviceCapacity, InferenceClass, InferenceClassSpec
from fleet.inference_cluster import NodePool
from fleet.meta import ObjectMeta

PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"
GFD_LABELS = (PRODUCT_LABEL, COUNT_LABEL, MEMORY_LABEL)
GPU_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True, order=True)
class NodeGroupKey:
    product: str
    count: int
    memory_mib: int

    @property
    def slug(self) -> str:
        """A name for the group's pool and class: `nvidia-h100-80gb-hbm3-8x81559mi`."""
        product = re.sub(r"[^a-z0-9]+", "-", self.product.lower()).strip("-") or "gpu"
        return f"{product}-{self.count}x{self.memory_mib}mi"


@dataclass(frozen=True)
class SkippedNode:
    name: str
    reason: str


@dataclass(frozen=True)
class NodeGroup:
    key: NodeGroupKey
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class NodeListPools:
    """What a NodeList contributes: pools (one per group, by key order), their classes, and the nodes left out."""

    groups: tuple[NodeGroup, ...]
    skipped: tuple[SkippedNode, ...]

    @property
    def pools(self) -> list[NodePool]:
        return [NodePool(name=g.key.slug, class_name=g.key.slug, node_count=len(g.nodes)) for g in self.groups]

    def classes(self, api_version: str) -> list[InferenceClass]:
        return [derived_class(g.key, api_version) for g in self.groups]


def pools_from_node_list(document: Mapping[str, Any]) -> NodeListPools:
    """Group a `NodeList` (or a `List` of `Node`s, which is what kubectl prints) by its GFD labels."""
    kind = document.get("kind")
    if kind not in ("NodeList", "List"):
        raise ValueError(f"expected a NodeList or a List of Nodes (got kind {kind!r})")
    items = document.get("items") or []
    groups: dict[NodeGroupKey, list[str]] = {}
    skipped: list[SkippedNode] = []
    for position, item in enumerate(items):
        if not isinstance(item, Mapping) or item.get("kind", "Node") != "Node":
            raise ValueError(f"items[{position}] is not a Node")
        metadata = item.get("metadata") or {}
        name = str(metadata.get("name") or f"items[{position}]")
        key = _group_key(metadata.get("labels") or {})
        if isinstance(key, str):
            skipped.append(SkippedNode(name=name, reason=key))
        else:
            groups.setdefault(key, []).append(name)
    return NodeListPools(
        groups=tuple(NodeGroup(key=k, nodes=tuple(sorted(groups[k]))) for k in sorted(groups)),
        skipped=tuple(skipped),
    )


def derived_class(key: NodeGroupKey, api_version: str) -> InferenceClass:
    return InferenceClass(
        api_version=api_version,
        kind="InferenceClass",
        metadata=ObjectMeta(name=key.slug),
        spec=InferenceClassSpec(
            devices=[
                Device(
                    name="gpu",
                    claim=ClaimKind.DRA,
                    driver=GPU_DRIVER,
                    count=key.count,
                    attributes={"productName": DeviceAttribute(string=key.product)},
                    capacity={"memory": DeviceCapacity(value=f"{key.memory_mib}Mi")},
                )
            ]
        ),
    )


def _group_key(labels: Mapping[str, Any]) -> NodeGroupKey | str:
    """The node's group, or why it has none."""
    missing = [label for label in GFD_LABELS if not labels.get(label)]
    if missing:
        return f"missing GPU Feature Discovery label{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    count, memory = str(labels[COUNT_LABEL]), str(labels[MEMORY_LABEL])
    if not count.isdigit() or int(count) == 0:
        return f"{COUNT_LABEL}={count!r} is not a positive whole number"
    if not memory.isdigit() or int(memory) == 0:
        return f"{MEMORY_LABEL}={memory!r} is not a positive whole number of MiB"
    return NodeGroupKey(product=str(labels[PRODUCT_LABEL]), count=int(count), memory_mib=int(memory))
