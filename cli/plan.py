"""`berth plan -f FLEET -f DEPLOYMENT [-f REPLICAS]`: where the fleet scheduler would put a ModelDeployment's
replicas, worked out from files alone, with no services running (as `nomad job plan` does for a job).

Text output is a YAML stream: the new replicas as ModelReplica documents, so `berth plan ... > replicas.yaml`
gives a file the next plan takes with `-f replicas.yaml`, headed by the placement and status as `#` comments.
`--output json` prints the stable document described in scheduler/deployment/README.md. Several deployments in the
files are planned in name order, each seeing the replicas planned before it. Exit status: 0 when every deployment
is at least partially scheduled, 1 when one is ScheduleFailed, 2 when the files are invalid.

A NodeList in the files (`kubectl get nodes -o yaml`) becomes a bring-your-own cluster, as with `berth apply`:
`--cluster NAME` names it (without it the NodeList is refused, never ignored), `--capabilities` says what its pools
serve, `--gateway` gives its gateway address.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from cli.output import OutputFormat, errors, fail, is_data, output_option, print_data, styled
from contracts.fleet_plan import EnginePlacement, FleetPlan, Phase
from fleet.byo import adopt_node_lists, capability_list
from fleet.errors import FleetError
from fleet.fleet import Fleet
from fleet.gguf import GgufError, read_facts
from fleet.inference_cluster import ClusterStatus, Condition, Gateway
from fleet.loader import load_fleet
from scheduler.deployment import manifest_dict, replica_manifest
from scheduler.deployment.estimate import MemoryEstimate, estimate, gguf_members, with_estimates
from scheduler.deployment.planning import plan_deployment


def plan(
    files: Annotated[
        list[Path], typer.Option("--file", "-f", help="Fleet, deployment or replica file (YAML or JSON); repeatable.")
    ],
    output: Annotated[OutputFormat, output_option("text (a YAML stream), json or yaml.")] = OutputFormat.TEXT,
    cluster: Annotated[
        str | None, typer.Option(help="Cluster that NodeList documents (kubectl get nodes -o yaml) describe.")
    ] = None,
    capabilities: Annotated[
        str | None,
        typer.Option(help="Comma-separated capabilities (e.g. vllm,sglang) every pool a NodeList creates offers."),
    ] = None,
    gateway: Annotated[
        str | None, typer.Option(help="Gateway address of the --cluster a NodeList creates (replicas need one).")
    ] = None,
) -> None:
    """Plan a ModelDeployment offline from files (Modelplane's placement semantics).

    Prints the replicas kept, the new ones with cluster, index, pool and node cost, the ones removed, and the
    status with a reason for every cluster that took no more."""
    try:
        fleet, skipped = adopt_node_lists(load_fleet(files), cluster, None, capability_list(capabilities))
    except FleetError as exc:
        fail(str(exc), code=2)
    if cluster is not None and cluster in fleet.clusters:
        fleet = _observed(fleet, cluster, gateway)
    for node in skipped:
        errors.print(styled("[yellow]skipped node {}[/]: {}", node.name, node.reason))
    deployments = list(fleet.deployments.values())
    replicas = list(fleet.replicas.values())
    if not deployments:
        fail("the files hold no ModelDeployment to plan", code=2)

    results: list[tuple[FleetPlan, list[dict[str, Any]]]] = []
    estimates: dict[str, dict[str, MemoryEstimate]] = {}  # deployment -> member -> its GGUF estimate
    for deployment in sorted(deployments, key=lambda d: (d.metadata.name, d.namespace)):
        try:  # the files are read here; the estimate itself is the scheduler's arithmetic
            found = {key: estimate(read_facts(Path(model.file)), model) for key, model in gguf_members(deployment)}
        except GgufError as exc:
            fail(f"ModelDeployment {deployment.metadata.name}: {exc}", code=2)
        deployment, estimates[deployment.metadata.name] = with_estimates(deployment, found), found
        result = plan_deployment(deployment, fleet.clusters.values(), fleet.classes, replicas, fleet.caches)
        manifests = [replica_manifest(deployment, placement) for placement in result.new]
        replicas = [*replicas, *manifests]
        results.append((result, [manifest_dict(m) for m in manifests]))

    if is_data(output):
        print_data({"plans": [_plan_json(r, m, estimates[r.deployment]) for r, m in results]}, output)
    else:
        for name, made in estimates.items():
            for member, need in made.items():
                errors.print(f"# {name} {member}: GGUF estimate {need.describe()}", markup=False, highlight=False)
        typer.echo(_render_text(results), nl=False)
    if any(r.status.phase is Phase.SCHEDULE_FAILED for r, _ in results):
        raise typer.Exit(1)


def _plan_json(result: FleetPlan, manifests: list[dict[str, Any]], estimates: dict[str, MemoryEstimate]) -> Any:
    document = {**result.model_dump(mode="json", by_alias=True), "newReplicas": manifests}
    if estimates:  # only for a deployment with GGUF members: the stable document is unchanged otherwise
        document["memoryEstimates"] = {
            member: {
                "file": e.file,
                "contextLength": e.context_length,
                "cacheType": e.cache_type,
                "weights": e.weights,
                "kvCache": e.kv_cache,
                "compute": e.compute,
                "total": e.total,
                "gpuMemory": e.quantity,
            }
            for member, e in estimates.items()
        }
    return document


def _observed(fleet: Fleet, name: str, gateway: str | None) -> Fleet:
    """A NodeList is what `kubectl get nodes` observed on a live cluster, so the cluster it becomes is Ready, with
    the node counts it listed; its gateway address is the operator's to give (`--gateway`), else it takes no
    replica and the plan says so (NoGatewayAddress)."""
    adopted = fleet.clusters[name]
    status = ClusterStatus(
        conditions=[Condition(type="Ready", status="True")], gateway=Gateway(address=gateway) if gateway else None
    )
    return replace(fleet, clusters={**fleet.clusters, name: adopted.model_copy(update={"status": status})})


def _render_text(results: list[tuple[FleetPlan, list[dict[str, Any]]]]) -> str:
    lines: list[str] = []
    documents: list[dict[str, Any]] = []
    for result, manifests in results:
        lines.extend(_summary(result))
        documents.extend(manifests)
    header = "\n".join(f"# {line}".rstrip() for line in lines) + "\n"
    if not documents:
        return header
    return header + yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True)


def _gpus(engine: EnginePlacement) -> str:
    """fitGranularity Gpu: what each GPU-level member holds, e.g. `2 x gpu on node 0` (per pod, on the ledger's node
    numbers of the pool)."""
    held = []
    for member in engine.members:
        if member.gpus is not None:
            nodes = member.gpus.nodes
            where = f"node {nodes[0]}" if len(nodes) == 1 else "nodes " + ",".join(str(n) for n in nodes)
            held.append(f"{member.gpus.per_pod} x {member.gpus.device} on {where}")
    return "; ".join(held) or "-"


def _summary(result: FleetPlan) -> list[str]:
    status = result.status
    lines = [
        f"ModelDeployment {result.deployment}: {status.phase}: {status.message}",
        f"desired {status.desired}, available {status.available} (retained {status.retained}, new {status.new})"
        + (f", minReplicas {status.min_replicas}" if status.min_replicas is not None else ""),
    ]
    if status.reason is not None:
        lines.append(f"reason: {status.reason}")
    gpu_level = any(m.gpus for r in result.replicas for e in r.engines for m in e.members)
    rows = [("REPLICA", "CLUSTER", "INDEX", "ORIGIN", "ENGINE", "POOL", "NODES", *(("GPUS",) if gpu_level else ()))]
    for replica in result.replicas:
        for position, engine in enumerate(replica.engines):
            head = (replica.name, replica.cluster, str(replica.index), replica.origin) if position == 0 else ("",) * 4
            gpus = (_gpus(engine),) if gpu_level else ()
            rows.append((*head, engine.name, engine.pool or "-", str(engine.nodes), *gpus))
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines.extend("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
    for dropped in result.dropped:
        lines.append(f"remove {dropped.name} ({dropped.reason}): {dropped.message}")
    if status.clusters:
        lines.append("clusters that took no further replica:")
        lines.extend(f"  {c.cluster}: {c.reason}: {c.message}" for c in status.clusters)
    lines.append("")
    return lines
