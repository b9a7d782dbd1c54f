"""The admission pass and preemption's planning over a three-level cohort tree against flat cohorts of the same size,
in one run (pure scheduler: no database, no Temporal; what the control worker does under the region's lock).

    python -m bench.cohort_tree [--requests 1000] [--tenants 50] [--nodes 64] [--repeat 7] [--baseline REV]

    fleet      `--nodes` 8-GPU nodes, half of every node held by two running 2-GPU allocations spread over the tenants
    queue      `--requests` queued requests of 1, 2, 4 and 8 GPUs from `--tenants` tenants (quota 8 each, lending and
               borrowing), arrivals shuffled with a fixed seed
    shapes     flat       the tenants in 5 flat cohorts (cohorts tenants name, no Cohort objects): today's shape
               tree       root -> 5 departments -> 2 teams each -> the tenants (Cohort objects with parentName; the
                          departments with a quota of their own and a borrowing limit)
               tree-fair  the same tree with fairSharing enabled on the root (Kueue's tournament orders the queue)
    policies   the pass timed twice: the tenants with no preemption policy, and with `reclaimWithinCohort: Any`
               (every request refused for capacity then plans a preemption; a tree lends across more tenants, so
               more of those plans find victims, and the two shapes do different work)
    preempt    one plan for a lender's request that must reclaim from borrowers (`plan_preemption`, quota case)
               among the fleet's running allocations, flat against tree

`--baseline REV` also times the flat pass with the code at git revision REV (a temporary worktree, run in a child
process), so "no slower than today's flat pass" is measured in the same run. The child runs this file against that
revision's code: so it imports nothing of bench/, imports Berth only inside the functions it runs, and finds a name
that has moved since in its older home (`_found`). Reported: the median of `--repeat` timings of each, in
milliseconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEPARTMENTS, TEAMS = 5, 2

# Where the scheduler's names live now, then where they lived at older revisions: a `--baseline` child imports the
# code of its revision, which may predate a move.
REQUEST = ("contracts.placement", "scheduler.request")
PASS = ("scheduler.admission.admit", "scheduler.queueing")
PREEMPTION = ("scheduler.admission.preemption", "scheduler.preemption")


def _found(name: str, *modules: str) -> Any:
    """`name` from the first of `modules` that can be imported and has it."""
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {', '.join(modules)} has {name}")


def fleet_yaml(shape: str, tenants: int, nodes: int, reclaim: bool = True) -> str:
    """The fleet file for one shape (`flat` uses no Cohort kind, so an older Berth reads it too)."""
    docs = ["kind: Region\nmetadata: {name: r1}\nspec: {status: available}"]
    docs.append(
        "kind: InferenceClass\nmetadata: {name: h100}\nspec:\n  devices:\n  - name: gpu\n    driver: gpu.nvidia.com\n"
        "    attributes: {productName: {string: NVIDIA H100}}"
    )
    for t in range(tenants):
        department, team = t % DEPARTMENTS, (t // DEPARTMENTS) % TEAMS
        cohort = f"flat-{department}" if shape == "flat" else f"team-{department}-{team}"
        preemption = ", preemption: {reclaimWithinCohort: Any}" if reclaim else ""
        docs.append(f"kind: Tenant\nmetadata: {{name: t{t:02d}}}\nspec: {{gpuQuota: 8, cohort: {cohort}{preemption}}}")
    if shape != "flat":
        fair = ", fairSharing: {enabled: true}" if shape == "tree-fair" else ""
        docs.append(f"kind: Cohort\nmetadata: {{name: root}}\nspec: {{gpuQuota: 16{fair}}}")
        for d in range(DEPARTMENTS):
            docs.append(
                f"kind: Cohort\nmetadata: {{name: dept-{d}}}\nspec: {{parentName: root, gpuQuota: 8, "
                "borrowingLimit: 64}"
            )
            for team in range(TEAMS):
                docs.append(f"kind: Cohort\nmetadata: {{name: team-{d}-{team}}}\nspec: {{parentName: dept-{d}}}")
    docs.append(
        "kind: InferenceCluster\nmetadata: {name: c1}\nspec:\n  region: r1\n  nodePools:\n  - name: h100\n"
        "    className: h100\n    shape: gpu_slice\n    gpuProduct: H100\n"
        f"    nodeTemplate: {{count: {nodes}, namePrefix: n, gpusPerNode: 8, numaNodes: 2}}\n"
    )
    return "\n---\n".join(f"apiVersion: berth.dev/v1alpha1\n{doc}" for doc in docs)


def measure(shape: str, requests: int, tenants: int, nodes: int, repeat: int) -> dict[str, float]:
    """Median milliseconds of one admission pass with no preemption policy, of one where every tenant reclaims
    (`reclaimWithinCohort: Any`: each request refused for capacity plans a preemption), and of one plan."""
    figures = {"quiet_ms": _measure(shape, requests, tenants, nodes, repeat, reclaim=False)["pass_ms"]}
    return {**figures, **_measure(shape, requests, tenants, nodes, repeat, reclaim=True)}


def _measure(shape: str, requests: int, tenants: int, nodes: int, repeat: int, reclaim: bool) -> dict[str, float]:
    from contracts.vocabulary import QueueingStrategy
    from fleet.loader import parse_fleet
    from fleet.slot_state import SlotStateDocument
    from scheduler.from_fleet import snapshot_from_fleet

    PlacementRequest = _found("PlacementRequest", *REQUEST)
    admission_pass = _found("admission_pass", *PASS)
    Preemptor, Running, plan_preemption = (
        _found(name, *PREEMPTION) for name in ("Preemptor", "Running", "plan_preemption")
    )

    fleet = parse_fleet([("fleet.yaml", fleet_yaml(shape, tenants, nodes, reclaim))])
    names = sorted(fleet_nodes(fleet))
    allocations, running = [], []
    for n, node in enumerate(names):  # two 2-GPU allocations per node: half the fleet held
        for k in range(2):
            tenant = f"t{(2 * n + k) % tenants:02d}"
            allocation = f"run-{n}-{k}"
            allocations.append(
                {"id": allocation, "tenant": tenant, "slots": [f"{node}/{2 * k}", f"{node}/{2 * k + 1}"]}
            )
            running.append(Running(allocation, tenant, node, 2, 0, float(n * 2 + k)))
    state = SlotStateDocument.model_validate(
        {
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "SlotState",
            "metadata": {"name": "held"},
            "spec": {"allocations": allocations},
        }
    )
    snapshot = snapshot_from_fleet(fleet, [state])
    queue = queued_requests(requests, tenants)
    passes = []
    for _ in range(repeat):
        started = time.perf_counter()
        admission_pass(snapshot, queue, {}, QueueingStrategy.BEST_EFFORT_FIFO, running)
        passes.append((time.perf_counter() - started) * 1000)
    plans = []
    lender = Preemptor("lender", "t00", 10, 0.0, PlacementRequest(gpu_count=8, tenant="t00", region="r1"))
    for _ in range(repeat):
        started = time.perf_counter()
        plan_preemption(snapshot, "r1", lender, running, "quota_exceeded")
        plans.append((time.perf_counter() - started) * 1000)
    return {"pass_ms": statistics.median(passes), "preempt_ms": statistics.median(plans)}


def queued_requests(requests: int, tenants: int) -> list[Any]:
    """`requests` queued requests of 1, 2, 4 and 8 H100 GPUs spread over the tenants, arrivals shuffled (seed 1)."""
    PlacementRequest = _found("PlacementRequest", *REQUEST)
    QueuedRequest = _found("QueuedRequest", *PASS)

    rng = random.Random(1)
    arrivals = list(range(requests))
    rng.shuffle(arrivals)
    queue = []
    for i, arrival in enumerate(arrivals):
        tenant = f"t{i % tenants:02d}"
        request = PlacementRequest(gpu_count=(1, 2, 4, 8)[i % 4], gpu_product="H100", tenant=tenant, region="r1")
        queue.append(QueuedRequest(f"q-{i}", tenant, "r1", 0, arrival, request))
    return queue


def fleet_nodes(fleet: Any) -> list[str]:
    return [node.name for pool in fleet.pools() for node in pool.nodes]


def baseline(revision: str, args: argparse.Namespace) -> dict[str, float]:
    """The flat shape timed with the code at `revision`, in a temporary worktree and a child process whose imports
    come from that worktree (an editable install's finder, which would point back here, is removed first)."""
    with tempfile.TemporaryDirectory(prefix="berth-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), revision], cwd=REPO, check=True, capture_output=True
        )
        try:
            code = (
                "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
                f"sys.path.insert(0, {str(tree)!r}); import runpy; sys.argv = ['cohort_tree', '--child', 'flat', "
                f"'--requests', '{args.requests}', '--tenants', '{args.tenants}', '--nodes', '{args.nodes}', "
                f"'--repeat', '{args.repeat}']; runpy.run_path({str(Path(__file__))!r}, run_name='__main__')"
            )
            out = subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, capture_output=True, text=True)
            return json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", help="a git revision whose flat pass is timed too (e.g. the previous release)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one shape, printed as JSON (the baseline's process)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.requests, args.tenants, args.nodes, args.repeat)))
        return
    rows: list[tuple[str, dict[str, float]]] = []
    if args.baseline:
        rows.append((f"flat at {args.baseline}", baseline(args.baseline, args)))
    for shape in ("flat", "tree", "tree-fair"):
        rows.append((shape, measure(shape, args.requests, args.tenants, args.nodes, args.repeat)))
    print(
        f"{args.requests} queued requests, {args.tenants} tenants, {args.nodes} nodes x 8 GPUs; median of "
        f"{args.repeat}, ms"
    )
    print(f"{'shape':<24}{'pass, no policy':>18}{'pass, reclaiming':>18}{'one plan':>10}")
    for name, figures in rows:
        print(f"{name:<24}{figures['quiet_ms']:>18.1f}{figures['pass_ms']:>18.1f}{figures['preempt_ms']:>10.2f}")


if __name__ == "__main__":
    main()
