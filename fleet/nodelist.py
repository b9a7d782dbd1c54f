"""Pools for a bring-your-own cluster, from its nodes as `kubectl get nodes -o yaml` prints them (docs/seeds.md,
"Node groups from GPU Feature Discovery labels").

NVIDIA GPU Feature Discovery labels every GPU node with `nvidia.com/gpu.product`, `nvidia.com/gpu.count` and
`nvidia.com/gpu.memory` (MiB per GPU). Nodes are grouped by those three values, as KAITO groups them, so each group
is a homogeneous pool by construction, and each group gets an InferenceClass derived from the labels: one DRA
device of driver gpu.nvidia.com with the GPU count, a `productName` attribute and a `memory` capacity. A node
missing any of the three labels, or carrying one that is not a number where a number belongs, is reported, not
guessed: it joins no pool.

A node is MIG-partitioned when GPU Feature Discovery publishes MIG devices on it: under its `single` strategy a
product ending in `-MIG-<profile>` (with `gpu.count` and `gpu.memory` describing the GPU instances), under `mixed`
the `nvidia.com/mig-<profile>.count` and `.memory` labels. Such nodes form groups of their own whose classes publish
MIG devices, never whole GPUs. `nvidia.com/mig.strategy` alone says nothing about the node: GFD labels every GPU
node with the strategy it runs under, MIG-capable or not (NVIDIA/k8s-device-plugin, internal/lm/mig-strategy.go and
its test "single non-mig device returns non-mig (none) labels"), and the GPU operator's MIG guide ("GPU Operator
with MIG", enabling MIG during installation) installs with `--set mig.strategy=single`, so a cluster run that way
carries `nvidia.com/mig.strategy=single` on its plain GPU nodes too. Where the GPU operator's MIG manager labels the
node (`nvidia.com/mig.config`, `nvidia.com/mig.config.state`), it must agree, as KAITO reads it: MIG only once a
layout other than a disabled one is applied (`success`) and GFD publishes its devices; `pending`, `rebooting` and
`failed` are not MIG yet, and the node offers whole GPUs.

Capabilities (vllm, sglang, ...) come from `capabilities.berth.dev/<name>: "true"` node labels and from the operator
(`--capabilities`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
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
# Berth's label for what a node's GPUs can serve (docs/seeds.md, "Capabilities a pool must offer": vllm, sglang,
# ...): one label per capability, `capabilities.berth.dev/vllm: "true"`, since a label value cannot hold a list.
CAPABILITY_PREFIX = "capabilities.berth.dev/"
# The GPU operator's MIG manager: the layout asked for (`all-1g.5gb`, `all-balanced`, `all-disabled`, ...) and how
# applying it went. KAITO reads a node as MIG-partitioned only once a non-disabled layout is applied (`success`);
# while it is `pending`, `rebooting` or `failed` the node is not (yet) MIG.
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_CONFIG_STATES = ("success", "pending", "rebooting", "failed")
# GPU Feature Discovery's MIG labels under its mixed strategy: per MIG profile, its device count and memory (MiB).
# (Its `nvidia.com/mig.strategy` label is not read: it names the strategy on every node, MIG-enabled or not.)
MIG_PROFILE_LABEL = re.compile(r"^nvidia\.com/mig-(?P<profile>[^/]+)\.(?P<field>count|memory)$")


@dataclass(frozen=True, order=True)
class MigDevices:
    """One MIG profile of a partitioned node: `count` GPU instances of `memory_mib` each, never whole GPUs."""

    profile: str
    count: int
    memory_mib: int


@dataclass(frozen=True, order=True)
class NodeGroupKey:
    product: str
    count: int
    memory_mib: int
    mig: tuple[MigDevices, ...] = ()  # set for MIG-partitioned nodes: then count and memory_mib are not whole GPUs

    @property
    def slug(self) -> str:
        """A name for the group's pool and class: `nvidia-h100-80gb-hbm3-8x81559mi`; for a MIG-partitioned node
        under GFD's mixed strategy `nvidia-a100-sxm4-40gb-mig-14x1g-5gb-4x3g-20gb` (its MIG devices, never its
        GPUs). Pool names hold at most 40 characters, so a longer one keeps 31 and a hash of the rest."""
        product = _slugify(self.product) or "gpu"
        if self.mig and "-mig-" not in f"{product}-":
            slug = "-".join([f"{product}-mig", *(f"{m.count}x{_slugify(m.profile)}" for m in self.mig)])
        else:
            slug = f"{product}-{self.count}x{self.memory_mib}mi"
        if len(slug) <= 40:
            return slug
        return f"{slug[:31].rstrip('-')}-{hashlib.sha256(slug.encode()).hexdigest()[:8]}"


def _slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@dataclass(frozen=True)
class SkippedNode:
    name: str
    reason: str


@dataclass(frozen=True)
class NodeGroup:
    key: NodeGroupKey
    nodes: tuple[str, ...]
    capabilities: tuple[str, ...] = ()  # what every node of the group offers (labels), plus the operator's option


@dataclass(frozen=True)
class NodeListPools:
    """What a NodeList contributes: pools (one per group, by key order), their classes, and the nodes left out."""

    groups: tuple[NodeGroup, ...]
    skipped: tuple[SkippedNode, ...]

    @property
    def pools(self) -> list[NodePool]:
        return [NodePool(name=g.key.slug, class_name=g.key.slug, node_count=len(g.nodes)) for g in self.groups]

    def classes(self, api_version: str) -> list[InferenceClass]:
        return [derived_class(g.key, api_version, g.capabilities) for g in self.groups]


def pools_from_node_list(document: Mapping[str, Any], capabilities: Iterable[str] = ()) -> NodeListPools:
    """Group a `NodeList` (or a `List` of `Node`s, which is what kubectl prints) by its GFD labels.

    A group's class offers the capabilities every one of its nodes is labelled with (`capabilities.berth.dev/<name>:
    "true"`), plus `capabilities`, which the operator gives for the whole NodeList (`--capabilities`)."""
    kind = document.get("kind")
    if kind not in ("NodeList", "List"):
        raise ValueError(f"expected a NodeList or a List of Nodes (got kind {kind!r})")
    items = document.get("items") or []
    groups: dict[NodeGroupKey, list[str]] = {}
    offered: dict[NodeGroupKey, set[str]] = {}
    skipped: list[SkippedNode] = []
    for position, item in enumerate(items):
        if not isinstance(item, Mapping) or item.get("kind", "Node") != "Node":
            raise ValueError(f"items[{position}] is not a Node")
        metadata = item.get("metadata") or {}
        name = str(metadata.get("name") or f"items[{position}]")
        labels = metadata.get("labels") or {}
        key = _group_key(labels)
        if isinstance(key, str):
            skipped.append(SkippedNode(name=name, reason=key))
        else:
            groups.setdefault(key, []).append(name)
            mine = _labelled_capabilities(labels)
            offered[key] = offered[key] & mine if key in offered else mine
    extra = {c.strip().lower() for c in capabilities if c.strip()}
    return NodeListPools(
        groups=tuple(
            NodeGroup(key=k, nodes=tuple(sorted(groups[k])), capabilities=tuple(sorted(offered[k] | extra)))
            for k in sorted(groups)
        ),
        skipped=tuple(skipped),
    )


def _labelled_capabilities(labels: Mapping[str, Any]) -> set[str]:
    return {
        key.removeprefix(CAPABILITY_PREFIX).lower()
        for key, value in labels.items()
        if key.startswith(CAPABILITY_PREFIX) and str(value).lower() == "true"
    }


def derived_class(key: NodeGroupKey, api_version: str, capabilities: Iterable[str] = ()) -> InferenceClass:
    """One `gpu` device of whole GPUs; for a MIG-partitioned group one `mig-<profile>` device per MIG profile,
    with a `migProfile` attribute, so selectors and the resource fit never take a GPU instance for a whole GPU."""
    if key.mig:
        devices = [
            Device(
                name=f"mig-{mig.profile}",
                claim=ClaimKind.DRA,
                driver=GPU_DRIVER,
                count=mig.count,
                attributes={
                    "productName": DeviceAttribute(string=_mig_product(key.product, mig.profile)),
                    "migProfile": DeviceAttribute(string=mig.profile),
                },
                capacity={"memory": DeviceCapacity(value=f"{mig.memory_mib}Mi")},
            )
            for mig in key.mig
        ]
    else:
        devices = [
            Device(
                name="gpu",
                claim=ClaimKind.DRA,
                driver=GPU_DRIVER,
                count=key.count,
                attributes={"productName": DeviceAttribute(string=key.product)},
                capacity={"memory": DeviceCapacity(value=f"{key.memory_mib}Mi")},
            )
        ]
    return InferenceClass(
        api_version=api_version,
        kind="InferenceClass",
        metadata=ObjectMeta(name=key.slug),
        spec=InferenceClassSpec(devices=devices, capabilities=list(capabilities)),
    )


def _group_key(labels: Mapping[str, Any]) -> NodeGroupKey | str:
    """The node's group, or why it has none."""
    missing = [label for label in GFD_LABELS if not labels.get(label)]
    if missing:
        return f"missing GPU Feature Discovery label{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    if re.search(r"-MIG-INVALID$", str(labels[PRODUCT_LABEL]), re.IGNORECASE):
        # GFD's single strategy publishes this product, with a count and memory of 0, for a layout it cannot label
        # as one MIG profile (k8s-device-plugin, internal/lm/mig-strategy.go: newInvalidMigStrategyLabeler).
        return (
            f"{PRODUCT_LABEL}={labels[PRODUCT_LABEL]!r}: GPU Feature Discovery found a MIG layout the single strategy "
            "cannot publish (a MIG-enabled GPU without MIG devices, GPUs with and without MIG, or more than one MIG "
            "profile)"
        )
    count, memory = str(labels[COUNT_LABEL]), str(labels[MEMORY_LABEL])
    if not count.isdigit() or int(count) == 0:
        return f"{COUNT_LABEL}={count!r} is not a positive whole number"
    if not memory.isdigit() or int(memory) == 0:
        return f"{MEMORY_LABEL}={memory!r} is not a positive whole number of MiB"
    product = str(labels[PRODUCT_LABEL])
    layout = _mig_layout(labels)
    if isinstance(layout, str):
        return layout
    mig = _mig_devices(labels, product, int(count), int(memory)) if layout is not False else ()
    if isinstance(mig, str):
        return mig
    if layout is True and not mig:
        return (
            f"{MIG_CONFIG_LABEL}={labels[MIG_CONFIG_LABEL]!r} is applied, but GPU Feature Discovery publishes no MIG "
            f"device ({PRODUCT_LABEL} ending in -MIG-<profile>, or nvidia.com/mig-<profile>.count)"
        )
    return NodeGroupKey(product=product, count=int(count), memory_mib=int(memory), mig=mig)


def _mig_layout(labels: Mapping[str, Any]) -> bool | None | str:
    """What the MIG manager says: True (a MIG layout is applied), False (none: disabled, or not applied yet), None
    (no MIG manager label: GFD's labels alone decide), or why its labels cannot be read."""
    layout = labels.get(MIG_CONFIG_LABEL)
    if layout is None:
        return None
    state = str(labels.get(MIG_CONFIG_STATE_LABEL, ""))
    if state not in MIG_CONFIG_STATES:
        return f"{MIG_CONFIG_STATE_LABEL}={state!r} is not one of {', '.join(MIG_CONFIG_STATES)}"
    return "disabled" not in str(layout).lower() and state == "success"


def _mig_product(product: str, profile: str) -> str:
    """GFD's product name for a MIG device (`NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`): a selector on the whole GPU's
    product never matches a GPU instance."""
    return product if re.search(r"-MIG-", product, re.IGNORECASE) else f"{product}-MIG-{profile}"


def _mig_devices(labels: Mapping[str, Any], product: str, count: int, memory: int) -> tuple[MigDevices, ...] | str:
    """A node's MIG devices (empty when it is not MIG-partitioned), or why its MIG labels cannot be read.

    GFD's `single` strategy relabels a node whose GPUs are MIG-enabled: `gpu.product` ends in `-MIG-<profile>` and
    `gpu.count` and `gpu.memory` describe the MIG devices; a node without MIG keeps its plain labels under either
    strategy, `nvidia.com/mig.strategy` included, so the strategy label is never read as MIG. The `mixed` strategy
    adds `nvidia.com/mig-<profile>.count` and `.memory` per profile; only those devices are offered, since which
    whole GPUs stay unpartitioned is not said."""
    profiles: dict[str, dict[str, str]] = {}
    for key, value in labels.items():
        match = MIG_PROFILE_LABEL.match(str(key))
        if match:
            profiles.setdefault(match["profile"], {})[match["field"]] = str(value)
    marker = re.search(r"-MIG-(?P<profile>.+)$", product, re.IGNORECASE)
    if marker and not profiles:
        return (MigDevices(profile=marker["profile"], count=count, memory_mib=memory),)
    devices = []
    for profile, fields in sorted(profiles.items()):
        mig_count, mig_memory = fields.get("count", ""), fields.get("memory", "")
        if not mig_count.isdigit():
            return f"nvidia.com/mig-{profile}.count={mig_count!r} is not a whole number"
        if int(mig_count) == 0:
            continue
        if not mig_memory.isdigit() or int(mig_memory) == 0:
            return f"nvidia.com/mig-{profile}.memory={mig_memory!r} is not a positive whole number of MiB"
        devices.append(MigDevices(profile=profile, count=int(mig_count), memory_mib=int(mig_memory)))
    return tuple(devices)  # empty: a mixed-strategy node none of whose GPUs is partitioned offers whole GPUs
