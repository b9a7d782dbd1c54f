"""`berth plan` on the Modelplane examples, as a platform team runs it before applying anything: the placement it
prints, the replicas it writes (which the next plan takes back as input), its JSON document and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from cli.plan import plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "modelplane"
FLEET = str(EXAMPLES / "fleet.yaml")
DEPLOYMENT = str(EXAMPLES / "deployment.yaml")
MEMORY = str(EXAMPLES / "deployment-memory.yaml")
REPLICAS = str(EXAMPLES / "replicas.yaml")

app = typer.Typer(add_completion=False)
app.command()(plan)
runner = CliRunner()


def run(*files: str, output: str = "text") -> tuple[int, str]:
    args = [arg for file in files for arg in ("-f", file)] + ["--output", output]
    result = runner.invoke(app, args)
    return result.exit_code, result.output


def placements(stream: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(cluster, replica-index label, [(engine, pool of its first member)]) of each ModelReplica in a YAML stream."""
    return [
        (
            doc["spec"]["clusterName"],
            doc["metadata"]["labels"]["modelplane.ai/replica-index"],
            [(e["name"], e["members"][0]["nodePoolName"]) for e in doc["spec"]["engines"]],
        )
        for doc in yaml.safe_load_all(stream)
        if doc is not None
    ]


def test_plan_spreads_the_example_deployment_and_prints_replicas_as_yaml() -> None:
    code, out = run(FLEET, DEPLOYMENT)
    assert code == 0
    assert out.startswith("# ModelDeployment llama-70b: FullyScheduled: 3 of 3 replicas scheduled\n")
    disaggregated = [("prefill", "h200"), ("decode", "h100")]
    assert placements(out) == [
        ("us-east-1", "0", disaggregated),
        ("us-east-1", "1", disaggregated),
        ("us-west-2", "0", disaggregated),
    ]
    first = next(d for d in yaml.safe_load_all(out) if d)
    assert first["kind"] == "ModelReplica" and first["apiVersion"] == "modelplane.ai/v1alpha1"
    assert first["metadata"]["labels"] == {
        "team": "inference",
        "modelplane.ai/deployment": "llama-70b",
        "modelplane.ai/cluster": "us-east-1",
        "modelplane.ai/replica-index": "0",
    }
    leader = first["spec"]["engines"][0]["members"][0]
    assert leader["deviceRequests"][0]["count"] == 8


def test_the_printed_replicas_fed_back_are_all_kept_and_nothing_is_added(tmp_path: Path) -> None:
    _, out = run(FLEET, DEPLOYMENT)
    planned = tmp_path / "planned.yaml"
    planned.write_text(out)
    code, again = run(FLEET, DEPLOYMENT, str(planned))
    assert code == 0
    assert "desired 3, available 3 (retained 3, new 0)" in again
    assert placements(again) == []


def test_existing_replicas_are_kept_and_other_deployments_hold_their_nodes() -> None:
    code, out = run(FLEET, DEPLOYMENT, REPLICAS)
    assert code == 0
    assert "llama-70b-us-east-1-0  us-east-1  0      retained" in out
    assert [(c, i) for c, i, _ in placements(out)] == [("us-east-1", "1"), ("us-west-2", "0")]


def test_json_output_is_the_documented_stable_document() -> None:
    code, out = run(FLEET, MEMORY, DEPLOYMENT, REPLICAS, output="json")
    assert code == 0
    document = json.loads(out)
    assert [p["deployment"] for p in document["plans"]] == ["llama-70b", "qwen-32b"]
    llama, qwen = document["plans"]
    assert set(llama) == {"deployment", "replicas", "dropped", "status", "newReplicas"}
    assert set(llama["status"]) == {
        "desired",
        "minReplicas",
        "available",
        "retained",
        "new",
        "phase",
        "reason",
        "message",
        "clustersChecked",
        "clusters",
        "selectorError",
        "moving",
    }
    assert [(r["name"], r["origin"]) for r in llama["replicas"]] == [
        ("llama-70b-us-east-1-0", "retained"),
        ("llama-70b-us-east-1-1", "new"),
        ("llama-70b-us-west-2-0", "new"),
    ]
    assert [m["metadata"]["name"] for m in llama["newReplicas"]] == ["llama-70b-us-east-1-1", "llama-70b-us-west-2-0"]
    # qwen is planned after llama and sees its new replicas: us-west-2 has only the L40S pool left, where 200Gi
    # needs two whole nodes (the third step of docs/seeds.md, "Resource fit from a memory need").
    assert qwen["status"]["phase"] == "FullyScheduled" and qwen["status"]["minReplicas"] == 2
    west = [r for r in qwen["replicas"] if r["cluster"] == "us-west-2"]
    assert [
        (e["pool"], e["nodes"], e["members"][0]["fit"], e["members"][0]["span"]) for r in west for e in r["engines"]
    ] == [
        ("l40s", 2, "SeveralNodes", 2),
        ("l40s", 2, "SeveralNodes", 2),
    ]


def test_a_deployment_that_cannot_be_scheduled_exits_1_with_a_reason_per_cluster(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(
        Path(DEPLOYMENT).read_text().replace("name: llama-70b", "name: llama-405b").replace("nodes: 1}", "nodes: 9}")
    )
    code, out = run(FLEET, str(big))
    assert code == 1
    assert "ScheduleFailed: 0 of 3 replicas scheduled (checked 4 clusters)" in out
    assert "#   eu-central-1: NotReady: the cluster is not Ready" in out
    assert "#   research-1: UntoleratedTaint: untolerated taint team=research:NoSchedule" in out
    assert "#   us-east-1: InsufficientNodes: engine prefill: pool h200: needs 10 free nodes, has 4" in out


def test_a_not_ready_cluster_says_why_when_its_status_does(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    text = Path(FLEET).read_text()
    not_ready = '- {type: Ready, status: "False"}'
    assert text.count(not_ready) == 1
    fleet.write_text(text.replace(not_ready, '- {type: Ready, status: "False", message: "API server unreachable"}'))
    big = tmp_path / "big.yaml"
    big.write_text(Path(DEPLOYMENT).read_text().replace("nodes: 1}", "nodes: 9}"))
    code, out = run(str(fleet), str(big))
    assert code == 1
    assert "#   eu-central-1: NotReady: the cluster is not Ready: API server unreachable" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "apiVersion: modelplane.ai/v1alpha1\nkind: ModelDeployment\nmetadata: {name: x}\nspec: {replicas: 1}\n",
            "spec.template",
        ),
        ("apiVersion: example.com/v1\nkind: ModelReplica\nmetadata: {name: x}\n", "apiVersion"),
        (
            "apiVersion: modelplane.ai/v1alpha1\nkind: InferenceClass\nmetadata: {name: x}\nspec: {devicez: []}\n",
            "devicez",
        ),
    ],
)
def test_invalid_files_exit_2_naming_the_document_and_field(tmp_path: Path, text: str, message: str) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)
    code, out = run(FLEET, DEPLOYMENT, str(broken))
    assert code == 2
    assert "broken.yaml document 1" in out and message in out


def test_files_without_a_deployment_are_refused() -> None:
    code, out = run(FLEET)
    assert code == 2
    assert "no ModelDeployment" in out


def test_a_directory_of_modelplane_manifests_plans_with_its_model_service_checked_and_carried(tmp_path: Path) -> None:
    """A Modelplane example directory holds ModelServices beside the deployments; they are checked against
    Modelplane's XRD and carried (they place nothing), and a directory is read as `kubectl apply -f DIR` reads it."""
    code, out = run(str(EXAMPLES), output="json")
    assert code == 0, out
    document = json.loads(out)
    assert [(p["deployment"], p["status"]["phase"]) for p in document["plans"]] == [
        ("llama-70b", "FullyScheduled"),
        ("qwen-32b", "FullyScheduled"),
    ]
    # The same plan as without the service: it changes no placement.
    without = tmp_path / "without"
    without.mkdir()
    for name in ("fleet.yaml", "deployment.yaml", "deployment-memory.yaml", "replicas.yaml"):
        (without / name).write_text((EXAMPLES / name).read_text())
    assert json.loads(run(str(without), output="json")[1])["plans"] == document["plans"]


def test_a_model_service_that_breaks_modelplanes_schema_is_refused_with_its_path(tmp_path: Path) -> None:
    service = yaml.safe_load((EXAMPLES / "service.yaml").read_text())
    service["spec"]["endpoints"][1]["weight"] = 0  # Modelplane: remove the entry instead of weighting it 0
    (tmp_path / "service.yaml").write_text(yaml.safe_dump(service))
    code, out = run(FLEET, DEPLOYMENT, str(tmp_path / "service.yaml"))
    assert code == 2
    assert "ModelService/llama-70b: spec: endpoints[1].weight: 0 is less than the minimum of 1" in out


def test_a_directory_without_manifests_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a manifest")
    code, out = run(str(tmp_path))
    assert code == 2 and "is a directory with no .yaml, .yml or .json file" in out
