"""Bring-your-own clusters (docs/seeds.md, "Node groups from GPU Feature Discovery labels"): turn NodeLists read from
a fleet file into a cluster with homogeneous pools.

A NodeList does not say which cluster it describes, so the operator names it (`berth apply --cluster NAME`). Its
GPU nodes are grouped by their GPU Feature Discovery labels into `kubernetes` pools, each with an InferenceClass
derived from the labels; nodes missing a label are reported back, never guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fleet.errors import FleetError, FleetProblem
from fleet.fleet import Fleet
from fleet.inference_cluster import InferenceCluster, InferenceClusterSpec
from fleet.meta import API_VERSIONS, ObjectMeta
from fleet.nodelist import SkippedNode, pools_from_node_list


def capability_list(text: str | None) -> list[str]:
    """`vllm,sglang` (a flag's or a query's comma-separated capabilities) as a list, blanks dropped."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def adopt_node_lists(
    fleet: Fleet, cluster: str | None, region: str | None = None, capabilities: Sequence[str] = ()
) -> tuple[Fleet, list[SkippedNode]]:
    """The fleet with its NodeLists turned into cluster `cluster`; raises FleetError if that cannot be done.
    `capabilities` (vllm, sglang, ...) are offered by every pool derived, beside those its nodes are labelled with."""
    if not fleet.node_lists:
        return fleet, []
    if cluster is None:
        raise FleetError(
            [
                FleetProblem(
                    kind="NodeList",
                    message="a NodeList needs --cluster NAME: it does not say which cluster its nodes belong to",
                )
            ]
        )
    if cluster in fleet.clusters:
        raise FleetError(
            [
                FleetProblem(
                    kind="InferenceCluster",
                    name=cluster,
                    message="is defined in the files and named by --cluster; a NodeList creates its cluster",
                )
            ]
        )
    if region is not None and region not in fleet.regions:
        raise FleetError(
            [FleetProblem(kind="Region", name=region, message="is named by --region but not defined in the files")]
        )
    pools, classes, skipped = [], dict(fleet.classes), []
    for document in fleet.node_lists:
        grouped = pools_from_node_list(document, capabilities)
        skipped.extend(grouped.skipped)
        for inference_class in grouped.classes(API_VERSIONS[0]):
            classes.setdefault(inference_class.metadata.name, inference_class)
        pools.extend(p for p in grouped.pools if p.name not in {q.name for q in pools})
    adopted = InferenceCluster(
        api_version=API_VERSIONS[0],
        kind="InferenceCluster",
        metadata=ObjectMeta(name=cluster, labels={"berth.dev/source": "nodelist"}),
        spec=InferenceClusterSpec(region=region, node_pools=pools),
    )
    return replace(fleet, clusters={**fleet.clusters, cluster: adopted}, classes=classes, node_lists=[]), skipped
