"""Modelplane's manifests load and plan as they are, and what Berth emits validates against Modelplane's XRDs.

The schemas are Berth's copies of the XRDs' openAPIV3Schemas (fleet/xrd/*.json, each naming the modelplaneai/modelplane
commit it was copied from). The emitted ModelReplicas are checked with the `jsonschema` package, not with Berth's own
checker, so a bug in one cannot hide a bug in the other.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer
import yaml
from typer.testing import CliRunner

from cli.plan import plan
from fleet.errors import FleetError
from fleet.loader import parse_fleet
from fleet.openapi import xrd_schema

FIXTURES = Path(__file__).parent / "modelplane"
API = "modelplane.ai/v1alpha1"

app = typer.Typer(add_completion=False)
app.command()(plan)
runner = CliRunner()


def berth_plan(*texts_or_paths: str | Path, tmp_path: Path | None = None) -> tuple[int, str]:
    args: list[str] = []
    for n, item in enumerate(texts_or_paths):
        if isinstance(item, str):
            assert tmp_path is not None
            path = tmp_path / f"doc{n}.yaml"
            path.write_text(item)
            item = path
        args += ["-f", str(item)]
    result = runner.invoke(app, args)
    return result.exit_code, result.output


def emitted(output: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(output) if doc]


def assert_valid_replica(document: dict[str, Any]) -> None:
    jsonschema.validate(document, xrd_schema("ModelReplica"))
    for engine in document["spec"]["engines"]:
        for member in engine["members"]:
            assert "nodes" not in member
            for request in member.get("deviceRequests", []):
                assert set(request) <= {"name", "deviceClassName", "count", "selectors"}


# -- the documented shapes, planned as they are ----------------------------------------------------------------------


def test_a_live_eks_prefill_decode_set_with_its_model_cache_plans_unmodified() -> None:
    code, output = berth_plan(FIXTURES / "eks-h200.yaml")
    assert code == 0, output
    assert "ModelDeployment kimi-k2: FullyScheduled: 1 of 1 replicas scheduled" in output
    [replica] = emitted(output)
    assert_valid_replica(replica)
    assert replica["metadata"]["namespace"] == "ml-team"
    assert replica["spec"]["modelCacheRef"] == {"name": "kimi-k2"}
    assert replica["spec"]["serving"] == {"mode": "PrefillDecode"}
    assert [e["phase"] for e in replica["spec"]["engines"]] == ["Prefill", "Decode"]
    prefill = replica["spec"]["engines"][0]["members"][0]
    assert prefill["nodePoolName"] == "gpu-h200"
    assert [(r["name"], r["deviceClassName"], r["count"]) for r in prefill["deviceRequests"]] == [
        ("gpu", "gpu.nvidia.com", 8),
        ("efa", "efa.networking.k8s.aws", 16),
    ]
    assert prefill["template"]["spec"]["containers"][0]["command"] == ["vllm", "serve", "/mnt/models"]


def test_byo_and_autoscaled_clusters_plan_with_published_counts_and_say_what_waits_for_the_autoscaler() -> None:
    code, output = berth_plan(FIXTURES / "byo-multinode.yaml")
    assert code == 0, output
    head = output.splitlines()[0]
    assert head.startswith("# ModelDeployment llama-405b: FullyScheduled: 3 of 3 replicas scheduled")
    assert "autoscaler has not created yet (maxNodeCount) in gke-central/h100 (4 counted, nodeCount 1)" in head
    replicas = emitted(output)
    assert sorted(
        (r["spec"]["clusterName"], r["spec"]["engines"][0]["members"][0]["nodePoolName"]) for r in replicas
    ) == [
        ("gke-central", "h100"),
        ("gke-central", "h100"),
        ("onprem", "H100 rack A"),
    ]
    for replica in replicas:
        assert_valid_replica(replica)
        assert replica["metadata"]["labels"]["team"] == "research"


def test_the_plans_output_fed_back_keeps_every_replica(tmp_path: Path) -> None:
    _, first = berth_plan(FIXTURES / "byo-multinode.yaml")
    (tmp_path / "replicas.yaml").write_text(first)
    code, second = berth_plan(FIXTURES / "byo-multinode.yaml", tmp_path / "replicas.yaml")
    assert code == 0, second
    assert "(retained 3, new 0)" in second
    assert emitted(second) == []


def test_an_omitted_node_count_is_one_node(tmp_path: Path) -> None:
    fleet = (FIXTURES / "byo-multinode.yaml").read_text()
    # Drop gke-central's status and the onprem cluster: gke-central's pool then counts maxNodeCount (4) from its spec.
    documents = [d for d in yaml.safe_load_all(fleet) if d["metadata"]["name"] != "onprem"]
    for document in documents:
        if document["kind"] == "InferenceCluster":
            pool = document["spec"]["nodePools"][0]
            del pool["maxNodeCount"], pool["nodeCount"], pool["minNodeCount"]
            document["status"].pop("gpuPools")
        if document["kind"] == "ModelDeployment":
            member = document["spec"]["template"]["spec"]["engines"][0]["members"]
            document["spec"]["template"]["spec"]["engines"][0]["members"] = [{**member[0], "role": "Standalone"}]
    code, output = berth_plan(yaml.safe_dump_all(documents), tmp_path=tmp_path)
    assert code == 0, output
    assert "PartiallyScheduled: 1 of 3 replicas scheduled" in output


def test_published_devices_are_what_pools_match_not_the_class(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all((FIXTURES / "eks-h200.yaml").read_text()))
    cluster = next(d for d in documents if d["kind"] == "InferenceCluster")
    cluster["status"]["gpuPools"][0]["devices"][0]["capacity"]["memory"]["value"] = "80Gi"  # the class says 140Gi
    code, output = berth_plan(yaml.safe_dump_all(documents), tmp_path=tmp_path)
    assert code == 1, output
    assert "no device of class eks-kimi/gpu-h200 satisfies its selectors with 8 left" in output


def test_a_missing_model_cache_holds_placement_and_says_why(tmp_path: Path) -> None:
    documents = [d for d in yaml.safe_load_all((FIXTURES / "eks-h200.yaml").read_text()) if d["kind"] != "ModelCache"]
    code, output = berth_plan(yaml.safe_dump_all(documents), tmp_path=tmp_path)
    assert code == 1
    assert "ModelCache kimi-k2 not found; holding replica placement (0 retained)" in output
    assert "reason: ModelCacheNotFound" in output
    assert emitted(output) == []


def test_a_missing_model_cache_keeps_the_replicas_already_placed(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all((FIXTURES / "eks-h200.yaml").read_text()))
    _, placed = berth_plan(FIXTURES / "eks-h200.yaml")
    without_cache = [d for d in documents if d["kind"] != "ModelCache"]
    deployment = next(d for d in without_cache if d["kind"] == "ModelDeployment")
    deployment["spec"]["replicas"] = 2
    code, output = berth_plan(yaml.safe_dump_all([*without_cache, *emitted(placed)]), tmp_path=tmp_path)
    assert code == 0, output
    assert "ModelCache kimi-k2 not found; holding replica placement (1 retained)" in output
    assert "(retained 1, new 0)" in output


def test_new_replicas_go_only_where_the_cache_is_staged(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all((FIXTURES / "eks-h200.yaml").read_text()))
    cache = next(d for d in documents if d["kind"] == "ModelCache")
    cache["status"]["clusters"] = [{"name": "eks-kimi", "phase": "Hydrating"}]
    code, output = berth_plan(yaml.safe_dump_all(documents), tmp_path=tmp_path)
    assert code == 1
    assert "eks-kimi: UntoleratedTaint: untolerated taint berth.dev/model-cache-not-staged=kimi-k2:NoSchedule" in output


def test_the_same_deployment_name_in_two_namespaces_is_two_deployments(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all((FIXTURES / "byo-multinode.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "ModelDeployment")
    other = copy.deepcopy(deployment)
    other["metadata"]["namespace"] = "team-b"
    other["spec"]["replicas"] = 1
    code, output = berth_plan(yaml.safe_dump_all([*documents, other]), tmp_path=tmp_path)
    assert output.count("ModelDeployment llama-405b:") == 2
    namespaces = sorted(r["metadata"]["namespace"] for r in emitted(output))
    # 4 + 4 published nodes, 2 per replica: the first planned takes 3 replicas, the second the one left.
    assert namespaces == ["default", "default", "default", "team-b"], output
    assert code == 0


def test_a_field_no_xrd_defines_is_an_error_with_its_path(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all((FIXTURES / "eks-h200.yaml").read_text()))
    eks = next(d for d in documents if d["kind"] == "InferenceClass")["spec"]["provisioning"]["eks"]
    eks["instanceTyp"] = eks.pop("instanceType")
    next(d for d in documents if d["kind"] == "InferenceCluster")["spec"]["nodePools"][0]["zone"] = "x"
    with pytest.raises(FleetError) as caught:
        parse_fleet([("fleet.yaml", yaml.safe_dump_all(documents))])
    text = str(caught.value)
    assert (
        "InferenceClass/eks-h200-8x-p5en: spec.provisioning: eks.instanceType: is required but missing; "
        "eks.instanceTyp: is not a known field"
    ) in text
    assert "InferenceCluster/eks-kimi: spec.nodePools[0].zone: is not a known field" in text


def test_a_pool_name_is_any_string_up_to_40_characters() -> None:
    def fleet_with_pool(name: str) -> str:
        return yaml.safe_dump_all(
            [
                {
                    "apiVersion": API,
                    "kind": "InferenceClass",
                    "metadata": {"name": "c"},
                    "spec": {
                        "devices": [{"name": "gpu", "driver": "gpu.nvidia.com", "deviceClassName": "gpu.nvidia.com"}]
                    },
                },
                {
                    "apiVersion": API,
                    "kind": "InferenceCluster",
                    "metadata": {"name": "k"},
                    "spec": {
                        "cluster": {"source": "Existing", "existing": {"secretRef": {"name": "s"}}},
                        "nodePools": [{"name": name, "className": "c"}],
                    },
                },
            ]
        )

    fleet = parse_fleet([("f.yaml", fleet_with_pool("GPU Pool #1 (rack A)"))])
    assert fleet.clusters["k"].spec.node_pools[0].name == "GPU Pool #1 (rack A)"
    assert fleet.clusters["k"].spec.node_pools[0].node_count == 1
    with pytest.raises(FleetError, match=r"spec.nodePools\[0\].name: String should have at most 40 characters"):
        parse_fleet([("f.yaml", fleet_with_pool("p" * 41))])


# -- every property of the four XRDs (and ModelCache's) -------------------------------------------------------------


def _sample(schema: dict[str, Any], path: str) -> Any:
    """A value for `schema` that sets every property it defines (one item per array, one entry per map)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties")
        if properties:
            return {key: _sample(value, f"{path}.{key}") for key, value in properties.items()}
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return {"k": _sample(extra, f"{path}.*")}
        return {"type": "Ready", "status": "True"} if path.endswith("conditions[]") else {}
    if kind == "array":
        return [_sample(schema["items"], f"{path}[]")]
    if kind == "integer":
        return max(schema.get("minimum", 1), 1)
    if kind == "boolean":
        return True
    if "pattern" in schema:
        return "cr-0123456789abcdef"
    return "x" if schema.get("minLength", 1) <= 1 else "x" * schema["minLength"]


def _walk(schema: dict[str, Any], path: str = "") -> set[str]:
    """Every property path a schema defines."""
    found: set[str] = set()
    for key, value in schema.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        found.add(here)
        found |= _walk(value, here)
    if isinstance(schema.get("additionalProperties"), dict):
        found |= _walk(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        found |= _walk(schema["items"], f"{path}[]")
    return found


def _paths_of(value: Any, path: str = "", maps: frozenset[str] = frozenset()) -> set[str]:
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            step = "*" if path in maps else key
            here = f"{path}.{step}" if path else step
            found.add(here)
            found |= _paths_of(item, here, maps)
    elif isinstance(value, list):
        for item in value:
            found |= _paths_of(item, f"{path}[]", maps)
    return found


CEL = 'device.driver == "x"'


def _attributes() -> dict[str, Any]:
    return {"s": {"string": "x"}, "v": {"version": "1.0.0"}, "b": {"bool": True}, "i": {"int": 1}}


def _fix_devices(devices: list[dict[str, Any]]) -> None:
    for device in devices:
        device["attributes"] = _attributes()
        device["capacity"] = {"memory": {"value": "80Gi"}}


def _fix_engines(spec: dict[str, Any], *, replica: bool) -> None:
    """XRD CEL rules the structural sample breaks: a Leader + Worker gang, a worker block only on the Worker, one
    container named engine, a phase per engine under PrefillDecode, CEL that compiles."""
    spec["serving"] = {"mode": "PrefillDecode"}
    engine = spec["engines"][0]
    member = engine["members"][0]
    if replica:
        for request in member["deviceRequests"]:
            request["selectors"] = [{"cel": CEL}]
    else:
        member["nodeSelector"]["devices"][0]["selectors"] = [{"cel": CEL}]
    member["template"]["spec"]["containers"][0]["name"] = "engine"
    member["template"]["metadata"]["labels"] = {"tier": "x"}
    member["template"]["metadata"]["annotations"] = {"note": "x"}
    leader = {key: value for key, value in copy.deepcopy(member).items() if key != "worker"}
    engine["members"] = [{**leader, "role": "Leader"}, {**member, "role": "Worker"}]
    engine["name"] = "prefill"
    engine["phase"] = "Prefill"
    decode = copy.deepcopy(engine)
    decode["name"], decode["phase"] = "decode", "Decode"
    spec["engines"] = [engine, decode]


def _manifest(kind: str) -> dict[str, Any]:
    body = _sample(xrd_schema(kind), "")
    metadata: dict[str, Any] = {"name": f"every-{kind.lower()}", "uid": "u", "resourceVersion": "1"}
    if kind in ("ModelDeployment", "ModelReplica", "ModelCache"):
        metadata["namespace"] = "team-a"
    body["spec"]["crossplane"] = {"compositionRef": {"name": "x"}, "compositionUpdatePolicy": "Automatic"}
    if kind == "InferenceClass":
        _fix_devices(body["spec"]["devices"])
    elif kind == "InferenceCluster":
        body["spec"]["nodePools"][0]["className"] = "every-inferenceclass"
        body["spec"]["taints"][0]["effect"] = "NoSchedule"
        _fix_devices(body["status"]["gpuPools"][0]["devices"])
    elif kind == "ModelDeployment":
        _fix_engines(body["spec"]["template"]["spec"], replica=False)
        body["spec"]["template"]["spec"]["tolerations"][0]["operator"] = "Equal"
        body["spec"]["template"]["metadata"]["labels"] = {"team": "x"}
    elif kind == "ModelReplica":
        _fix_engines(body["spec"], replica=True)
    return {"apiVersion": API, "kind": kind, "metadata": metadata, **body}


KINDS = ["InferenceClass", "InferenceCluster", "ModelDeployment", "ModelReplica", "ModelCache"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_manifest_setting_every_property_of_the_xrd_loads(kind: str) -> None:
    manifest = _manifest(kind)
    jsonschema.validate(
        {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind", "metadata")}, xrd_schema(kind)
    )
    maps = frozenset(
        p
        for p in _walk(xrd_schema(kind))
        if p.endswith(("attributes", "capacity", "labels", "annotations", "matchLabels"))
    )
    used = _paths_of({k: v for k, v in manifest.items() if k not in ("apiVersion", "kind", "metadata")}, maps=maps)
    assert _walk(xrd_schema(kind)) - used == set()  # the manifest really uses every property
    documents = [manifest]
    if kind == "InferenceCluster":
        documents.insert(0, _manifest("InferenceClass"))
    fleet = parse_fleet([("every.yaml", yaml.safe_dump_all(documents))])
    loaded = [
        *fleet.classes.values(),
        *fleet.clusters.values(),
        *fleet.deployments.values(),
        *fleet.replicas.values(),
        *fleet.caches.values(),
    ]
    assert manifest["metadata"]["name"] in [obj.metadata.name for obj in loaded]


def test_a_deployment_using_every_property_plans_and_its_replicas_validate(tmp_path: Path) -> None:
    deployment = _manifest("ModelDeployment")
    deployment["spec"]["replicas"] = 1
    deployment["spec"]["template"]["spec"].pop("modelCacheRef")
    deployment["spec"]["template"]["spec"]["clusterSelector"] = {"matchLabels": {"k": "x"}}
    cluster = _manifest("InferenceCluster")
    cluster["metadata"]["labels"] = {"k": "x"}
    cluster["spec"]["taints"] = []
    cluster["status"]["gpuPools"] = [
        {
            "name": "x",
            "nodes": 4,
            "devices": [{"name": "gpu", "driver": "x", "deviceClassName": "gpu.example.com", "count": 8}],
        }
    ]
    cluster["status"]["gateway"] = {"address": "192.0.2.1"}
    cluster["status"]["conditions"] = [{"type": "Ready", "status": "True"}]  # Crossplane's, beside the XRD's status
    documents = [_manifest("InferenceClass"), cluster, deployment]
    code, output = berth_plan(yaml.safe_dump_all(documents), tmp_path=tmp_path)
    assert code == 0, output
    [replica] = emitted(output)
    assert_valid_replica(replica)
    assert replica["spec"]["engines"][0]["members"][0]["deviceRequests"][0]["deviceClassName"] == "gpu.example.com"
