"""The Kubernetes cluster driver: what it renders (validated offline against the Kubernetes schemas and the
LeaderWorkerSet CRD), and what it does against the API server fake (tests/kube_fake.py): server-side apply with
field manager berth, readiness from status, garbage collection and deletion that waits, refusals, and what it
observes of nodes, gateways and unreachable clusters."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.cluster.k8s_objects import WorkloadNotRenderable, dns_name, render_objects
from activities.cluster.k8s_status import observe_pools
from activities.cluster.kubernetes import KubernetesClusterDriver, WorkloadRejected
from activities.cluster.simulated import SimulatedClusterDriver
from activities.cluster.workload import Workload, render_workload
from contracts.cluster import ClusterConnection, ClusterTarget, connection_of
from contracts.manifest import Toleration
from fleet.loader import load_fleet
from fleet.replica import ModelReplica
from scheduler.deployment import manifest_dict, replica_manifest
from scheduler.deployment.planning import plan_deployment
from tests.kube_fake import FakeKubernetes, matches, node, node_list, validate_object

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "modelplane"
FIXTURES = Path(__file__).resolve().parents[1] / "fleet" / "modelplane"


def example_replicas() -> list[ModelReplica]:
    """The replicas `berth plan -f examples/modelplane/fleet.yaml -f .../deployment.yaml` places."""
    fleet = load_fleet([EXAMPLES / "fleet.yaml", EXAMPLES / "deployment.yaml"])
    deployment = fleet.deployments[next(iter(fleet.deployments))]
    plan = plan_deployment(deployment, fleet.clusters.values(), fleet.classes, [], fleet.caches)
    return [ModelReplica.model_validate(manifest_dict(replica_manifest(deployment, p))) for p in plan.new]


# -- rendering --------------------------------------------------------------------------------------------------------


def test_example_deployment_renders_objects_that_validate_offline() -> None:
    replicas = example_replicas()
    assert replicas, "the example places replicas"
    for replica in replicas:
        objects = render_objects(render_workload(replica))
        kinds = sorted(o["kind"] for o in objects)
        # prefill (Leader + Worker) is one LeaderWorkerSet, decode (Standalone) a Deployment, one claim template
        # per claiming member.
        assert kinds == [
            "Deployment",
            "LeaderWorkerSet",
            "ResourceClaimTemplate",
            "ResourceClaimTemplate",
            "ResourceClaimTemplate",
        ]
        for obj in objects:
            assert validate_object(obj) == [], obj["kind"]
            assert obj["metadata"]["namespace"] == "ml"
            assert obj["metadata"]["labels"]["modelplane.ai/replica"] == replica.metadata.name
            assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "berth"
        lws = next(o for o in objects if o["kind"] == "LeaderWorkerSet")
        template = lws["spec"]["leaderWorkerTemplate"]
        assert (lws["spec"]["replicas"], template["size"]) == (1, 2)
        prefill_pool = replica.spec.engines[0].members[0].node_pool_name
        for pod in (template["leaderTemplate"], template["workerTemplate"]):
            assert pod["spec"]["nodeSelector"] == {"modelplane.ai/pool": prefill_pool}
            assert pod["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.9.0"  # the member's own template
            assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "berth-devices"}]
        assert template["leaderTemplate"]["spec"]["containers"][0]["args"] == ["--tensor-parallel-size=8"]
        claim = next(o for o in objects if o["kind"] == "ResourceClaimTemplate")
        request = claim["spec"]["spec"]["devices"]["requests"][0]
        assert request["exactly"]["count"] == 8 and request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
        assert request["exactly"]["selectors"] == [
            {"cel": {"expression": 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("141Gi")) >= 0'}}
        ]
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        assert deployment["spec"]["template"]["spec"]["nodeSelector"]["modelplane.ai/pool"] == (
            replica.spec.engines[1].members[0].node_pool_name
        )


def test_a_gpu_level_replica_claims_exactly_its_gpus_per_pod() -> None:
    """GPU-level fit (docs/seeds.md, "GPU-level fit"; examples/gpustack): a 140Gi vLLM instance holds 2 of a worker's
    8 H100s, so its pod's ResourceClaimTemplate asks for exactly 2 GPUs, and the pod shares the worker with other
    instances."""
    gpustack = EXAMPLES.parent / "gpustack"
    fleet = load_fleet([gpustack / "fleet.yaml", gpustack / "deployments.yaml"])
    deployment = fleet.deployments["llama-70b"]
    plan = plan_deployment(deployment, fleet.clusters.values(), fleet.classes, [], fleet.caches)
    on_h100 = next(p for p in plan.new if p.engines[0].pool == "h100")
    replica = ModelReplica.model_validate(manifest_dict(replica_manifest(deployment, on_h100)))
    objects = render_objects(render_workload(replica))
    assert [o["kind"] for o in objects].count("ResourceClaimTemplate") == 1
    for obj in objects:
        assert validate_object(obj) == [], obj["kind"]
    claim = next(o for o in objects if o["kind"] == "ResourceClaimTemplate")
    request = claim["spec"]["spec"]["devices"]["requests"][0]
    assert (request["exactly"]["count"], request["exactly"]["deviceClassName"]) == (2, "gpu.nvidia.com")


def test_the_offline_validators_refuse_what_a_server_refuses() -> None:
    objects = render_objects(render_workload(example_replicas()[0]))
    lws = copy.deepcopy(next(o for o in objects if o["kind"] == "LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    assert any("sise" in p for p in validate_object(lws))
    lws = copy.deepcopy(next(o for o in objects if o["kind"] == "LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    assert any("size" in p for p in validate_object(lws))
    claim = copy.deepcopy(next(o for o in objects if o["kind"] == "ResourceClaimTemplate"))
    claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = "eight"
    assert validate_object(claim) != []


def rider_replica(template: bool = True) -> ModelReplica:
    """A Standalone engine whose pod claims 8 GPUs, and a sidecar engine member claiming nothing."""
    members: list[dict[str, Any]] = [
        {
            "role": "Standalone",
            "nodePoolName": "serve",
            "deviceRequests": [
                {
                    "name": "gpu",
                    "count": 8,
                    "deviceClassName": "gpu.example.com",
                    "selectors": [{"cel": 'device.attributes["gpu.example.com"].arch == "hopper"'}],
                }
            ],
        },
    ]
    if template:
        members[0]["template"] = {
            "metadata": {"labels": {"app": "llm"}},
            "spec": {
                "nodeSelector": {"disk": "nvme", "modelplane.ai/pool": "elsewhere"},
                "containers": [{"name": "vllm", "image": "vllm:1"}],
            },
        }
    return ModelReplica.model_validate(
        {
            "apiVersion": "modelplane.ai/v1alpha1",
            "kind": "ModelReplica",
            "metadata": {
                "name": "chat-east-0",
                "namespace": "default",
                "labels": {
                    "modelplane.ai/deployment": "chat",
                    "modelplane.ai/cluster": "east",
                    "modelplane.ai/replica-index": "0",
                },
            },
            "spec": {
                "clusterName": "east",
                "engines": [
                    {"name": "serve", "copies": 2, "members": members},
                    {"name": "router", "members": [{"role": "Standalone", "nodePoolName": "serve"}]},
                ],
            },
        }
    )


def test_member_template_merged_and_rider_claims_nothing() -> None:
    objects = render_objects(render_workload(rider_replica()))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ResourceClaimTemplate", "chat-east-0-serve-m0-devices"),
        ("Deployment", "chat-east-0-serve-m0"),
        ("Deployment", "chat-east-0-router-m0"),
    ]
    for obj in objects:
        assert validate_object(obj) == []
    serve, router = objects[1], objects[2]
    assert serve["spec"]["replicas"] == 2  # one pod per copy
    pod = serve["spec"]["template"]
    assert pod["metadata"]["labels"]["app"] == "llm" and pod["metadata"]["labels"]["modelplane.ai/replica"] == (
        "chat-east-0"
    )
    # The template's own selector stays; Berth's pool pin wins on its key.
    assert pod["spec"]["nodeSelector"] == {"disk": "nvme", "modelplane.ai/pool": "serve"}
    assert pod["spec"]["resourceClaims"] == [
        {"name": "berth-devices", "resourceClaimTemplateName": "chat-east-0-serve-m0-devices"}
    ]
    rider = router["spec"]["template"]["spec"]
    assert rider["nodeSelector"] == {"modelplane.ai/pool": "serve"} and "resourceClaims" not in rider
    assert rider["containers"] == [{"name": "engine", "image": "registry.k8s.io/pause:3.10"}]  # no template given


def tolerating_replica() -> ModelReplica:
    """The byo-multinode fixture's deployment (it tolerates maintenance=soon:NoSchedule) planned, its LeaderWorkerSet
    worker template already tolerating that taint and one of its own."""
    fleet = load_fleet([FIXTURES / "byo-multinode.yaml"])
    deployment = next(iter(fleet.deployments.values()))
    plan = plan_deployment(deployment, fleet.clusters.values(), fleet.classes, [], fleet.caches)
    manifest = manifest_dict(replica_manifest(deployment, plan.new[0]))
    written = [
        {"key": "maintenance", "operator": "Equal", "value": "soon", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    for member in manifest["spec"]["engines"][0]["members"]:
        member["template"] = {"spec": {"containers": [{"name": "vllm", "image": "vllm:1"}], "tolerations": written}}
        break  # the leader only: the workers' template writes none
    return ModelReplica.model_validate(manifest)


def test_the_deployments_tolerations_reach_every_pod_once() -> None:
    replica = tolerating_replica()
    assert json.loads(replica.metadata.annotations["berth.dev/tolerations"]) == [
        {"key": "maintenance", "operator": "Equal", "value": "soon", "effect": "NoSchedule"}
    ]
    objects = render_objects(render_workload(replica))
    for obj in objects:
        assert validate_object(obj) == [], obj["kind"]
    template = next(o for o in objects if o["kind"] == "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    # The leader's template already tolerates the taint: its own list stays as written, nothing duplicated.
    assert template["leaderTemplate"]["spec"]["tolerations"] == [
        {"key": "maintenance", "operator": "Equal", "value": "soon", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert template["workerTemplate"]["spec"]["tolerations"] == [
        {"key": "maintenance", "operator": "Equal", "value": "soon", "effect": "NoSchedule"}
    ]
    # A deployment without tolerations renders pods without any (and its replicas carry no annotation).
    for replica in example_replicas():
        assert "berth.dev/tolerations" not in replica.metadata.annotations
        for obj in render_objects(render_workload(replica)):
            pods = [obj["spec"]["template"]] if obj["kind"] == "Deployment" else []
            pods += obj["spec"].get("leaderWorkerTemplate", {}).values() if obj["kind"] == "LeaderWorkerSet" else []
            assert all("tolerations" not in pod["spec"] for pod in pods if isinstance(pod, dict))


def test_the_simulated_driver_stores_the_tolerations(tmp_path: Path) -> None:
    replica = tolerating_replica()
    driver = SimulatedClusterDriver(tmp_path)
    driver.apply_workload(render_workload(replica))
    [path] = driver.workload_files()
    stored = json.loads(path.read_text())["workload"]
    assert stored["tolerations"] == [
        {"key": "maintenance", "operator": "Equal", "value": "soon", "effect": "NoSchedule"}
    ]


def test_a_malformed_tolerations_annotation_is_refused_not_retried() -> None:
    manifest = tolerating_replica().model_dump(mode="json", by_alias=True)
    manifest["metadata"]["annotations"]["berth.dev/tolerations"] = "{not json"
    with pytest.raises(WorkloadNotRenderable, match="berth.dev/tolerations"):
        render_workload(ModelReplica.model_validate(manifest))
    # A toleration Kubernetes would not match (an operator it does not know) is not rendered onto pods either.
    manifest["metadata"]["annotations"]["berth.dev/tolerations"] = '[{"key":"gpu","operator":"Gt","value":"4"}]'
    with pytest.raises(WorkloadNotRenderable, match="berth.dev/tolerations"):
        render_workload(ModelReplica.model_validate(manifest))


def test_names_stay_dns_labels() -> None:
    long = dns_name("a-very-long-deployment-name-that-goes-on", "us-east-1-production", "prefill-engine")
    assert len(long) <= 63 and long != dns_name(
        "a-very-long-deployment-name-that-goes-on", "us-east-1-production", "prefill-engine2"
    )
    assert dns_name("Decode_Engine") != "decode-engine" and dns_name("decode") == "decode"


def test_workers_that_differ_cannot_be_one_leader_worker_set() -> None:
    replica = example_replicas()[0].model_dump(mode="json", by_alias=True)
    prefill = replica["spec"]["engines"][0]
    prefill["members"].append(
        {**prefill["members"][1], "template": {"spec": {"containers": [{"name": "other", "image": "x"}]}}}
    )
    with pytest.raises(WorkloadNotRenderable, match="Worker members differ"):
        render_objects(render_workload(ModelReplica.model_validate(replica)))


# -- connections ------------------------------------------------------------------------------------------------------


def test_connections_from_the_inference_cluster() -> None:
    existing = {"source": "Existing", "existing": {"secretRef": {"name": "prod-east"}}}
    assert connection_of(existing, {}) == ClusterConnection(method="kubeconfig", secret_name="prod-east")
    assert connection_of(existing, {"berth.dev/kube-context": "admin"}).context == "admin"
    assert connection_of({"source": "GKE", "gke": {}}, {}) is None  # provisioned: needs the annotation
    assert connection_of({"source": "GKE"}, {"berth.dev/kubeconfig-secret": "gke-east/config"}) == ClusterConnection(
        method="kubeconfig", secret_name="gke-east", secret_key="config"
    )
    assert connection_of(None, {"berth.dev/cluster-connection": "in-cluster"}).method == "in-cluster"
    assert connection_of(None, {}) is None


# -- against the API server fake --------------------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes(boot_seconds=0.3, terminate_seconds=0.3) as server:
        server.namespaces.add("ml")
        yield server


def driver_for(fake: FakeKubernetes, tmp_path: Path, target: ClusterTarget | None = None) -> KubernetesClusterDriver:
    secrets = tmp_path / "secrets"
    (secrets / "prod-east").mkdir(parents=True, exist_ok=True)
    (secrets / "prod-east" / "kubeconfig").write_text(fake.kubeconfig())
    target = target or ClusterTarget(connection=ClusterConnection(method="kubeconfig", secret_name="prod-east"))
    return KubernetesClusterDriver(
        lambda cluster: target if cluster == "us-east-1" or cluster == "east" else None,
        SimulatedClusterDriver(tmp_path / "simulated"),
        secrets,
        delete_wait_seconds=5,
        poll_seconds=0.05,
    )


def test_apply_ready_and_delete_on_the_api_server(fake: FakeKubernetes, tmp_path: Path) -> None:
    driver = driver_for(fake, tmp_path)
    workload = render_workload(example_replicas()[0])
    assert workload.cluster == "us-east-1"
    fake.never_ready = True  # booting until told otherwise: a loaded machine must not find it ready already
    driver.apply_workload(workload)
    patches = [q for method, _, q in fake.requests if method == "PATCH"]
    assert len(patches) == 5 and all(q["fieldManager"] == "berth" and q["force"] == "true" for q in patches)
    lws = fake.of_kind("LeaderWorkerSet")[0]
    assert lws["metadata"]["managedFields"][0]["manager"] == "berth"
    assert lws["metadata"]["generation"] == 1

    readiness = driver.workload_ready("us-east-1", workload.name, "ml")
    assert readiness.exists and not readiness.ready and readiness.pods_total == 3  # 1 group of 2, 1 decode pod
    assert "0/1 group(s) of 2 ready" in readiness.message
    driver.apply_workload(workload)  # idempotent: same spec, same generation
    assert fake.of_kind("LeaderWorkerSet")[0]["metadata"]["generation"] == 1
    fake.never_ready = False  # booted
    deadline = time.monotonic() + 5
    while not (readiness := driver.workload_ready("us-east-1", workload.name, "ml")).ready:
        assert time.monotonic() < deadline, readiness.message
        time.sleep(0.05)
    assert (readiness.pods_ready, readiness.pods_total, readiness.message) == (3, 3, "all pods ready")

    # Another namespace's replica of the same name is not touched.
    assert driver.workload_ready("us-east-1", workload.name, "default").exists is False

    assert driver.delete_workload("us-east-1", workload.name, "ml") is True
    assert fake.workloads() == []
    deletes = [q for method, _, q in fake.requests if method == "DELETE"]
    assert len(deletes) == 5 and all(q["propagationPolicy"] == "Foreground" for q in deletes)
    assert driver.delete_workload("us-east-1", workload.name, "ml") is False  # idempotent
    assert driver.workload_ready("us-east-1", workload.name, "ml").exists is False


def test_objects_no_longer_rendered_are_garbage_collected(fake: FakeKubernetes, tmp_path: Path) -> None:
    driver = driver_for(fake, tmp_path)
    with_router = render_workload(rider_replica())
    driver.apply_workload(with_router)
    assert [o["metadata"]["name"] for o in fake.of_kind("Deployment")] == [
        "chat-east-0-router-m0",
        "chat-east-0-serve-m0",
    ]
    without = Workload.model_validate(
        {**with_router.model_dump(), "pods": [p for p in with_router.model_dump()["pods"] if p["engine"] == "serve"]}
    )
    driver.apply_workload(without)
    fake._reconcile()
    names = [o["metadata"]["name"] for o in fake.of_kind("Deployment") if not o["metadata"].get("deletionTimestamp")]
    assert names == ["chat-east-0-serve-m0"]


def test_refusals_are_not_retried(fake: FakeKubernetes, tmp_path: Path) -> None:
    driver = driver_for(fake, tmp_path)
    workload = render_workload(example_replicas()[0])
    fake.installed_crds.discard("LeaderWorkerSet")
    with pytest.raises(WorkloadRejected, match="is the LeaderWorkerSet CRD installed"):
        driver.apply_workload(workload)
    fake.installed_crds.add("LeaderWorkerSet")
    fake.namespaces.discard("ml")
    with pytest.raises(WorkloadRejected, match='namespaces "ml" not found'):
        driver.apply_workload(workload)


def test_a_cluster_without_a_connection_stays_simulated(fake: FakeKubernetes, tmp_path: Path) -> None:
    driver = driver_for(fake, tmp_path)
    replica = rider_replica().model_dump(mode="json", by_alias=True)
    replica["spec"]["clusterName"] = "west"
    workload = render_workload(ModelReplica.model_validate(replica))
    driver.apply_workload(workload)
    assert fake.workloads() == [] and fake.requests == []
    assert driver.fallback.stored("west", workload.name) is not None  # type: ignore[attr-defined]
    assert driver.observe_cluster("west").gateway_address == "west.gateway.berth.internal"


# -- observation ------------------------------------------------------------------------------------------------------


def test_pool_counts_only_nodes_that_can_take_work() -> None:
    nodes = node_list(
        node("h200-a", "h200"),
        node("h200-b", "h200", cordoned=True),
        node("h200-c", "h200", ready=False),
        node("h200-d", "h200", taints=[{"key": "maintenance", "value": "true", "effect": "NoExecute"}]),
        node("h200-e", "h200", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        node("h200-f", "h200", taints=[{"key": "spot", "effect": "PreferNoSchedule"}]),
        node("cpu-a", None),
        node("h100-a", "h100"),
    )["items"]
    pools = observe_pools(
        nodes, [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")], {"h100": 4, "b200": None}
    )
    by_name = {p.name: p for p in pools}
    assert sorted(by_name) == ["b200", "h100", "h200"]  # the unlabelled node is in no pool
    h200 = by_name["h200"]
    assert (h200.nodes, h200.schedulable) == (6, 3)  # a, e (tolerated taint), f (PreferNoSchedule only)
    assert h200.excluded == [
        "h200-b: cordoned",
        "h200-c: NotReady (NodeStatusUnknown)",
        "h200-d: tainted maintenance=true:NoExecute",
    ]
    assert not h200.autoscaled
    h100 = by_name["h100"]
    assert (h100.nodes, h100.schedulable, h100.autoscaled) == (1, 1, True)
    assert "autoscaled pool (maxNodeCount 4): counting the 1 node(s) that exist" in h100.message
    assert (by_name["b200"].nodes, by_name["b200"].schedulable) == (0, 0)
    # Without the toleration, the GPU taint keeps h200-e out too.
    assert observe_pools(nodes, [])[1].schedulable == 2


def test_node_taints_are_matched_by_kubernetes_rules() -> None:
    """A node's taints as the API server returns them (a NoExecute one with its `timeAdded`) are read into the one
    Taint model and matched by the one rule: an Equal toleration of the cluster's declared taint covers the same
    key, value and effect, a keyless Exists covers every taint."""
    taints = [
        {"key": "dedicated", "value": "inference", "effect": "NoExecute", "timeAdded": "2025-01-01T00:00:00Z"},
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
    ]
    nodes = node_list(node("h200-a", "h200", taints=taints))["items"]
    declared = Toleration(key="dedicated", operator="Equal", value="inference", effect="NoExecute")
    assert observe_pools(nodes, [declared])[0].excluded == ["h200-a: tainted nvidia.com/gpu:NoSchedule"]
    assert observe_pools(nodes, [])[0].excluded == ["h200-a: tainted dedicated=inference:NoExecute"]
    assert observe_pools(nodes, [Toleration(operator="Exists")])[0].schedulable == 1
    other_value = Toleration(key="dedicated", operator="Equal", value="training", effect="NoExecute")
    assert observe_pools(nodes, [other_value, Toleration(key="nvidia.com/gpu", operator="Exists")])[0].excluded == [
        "h200-a: tainted dedicated=inference:NoExecute"
    ]


def test_observe_a_real_cluster(fake: FakeKubernetes, tmp_path: Path) -> None:
    target = ClusterTarget(
        connection=ClusterConnection(method="kubeconfig", secret_name="prod-east", gateway="gw/inference"),
        autoscaled={"h100": 8},
    )
    driver = driver_for(fake, tmp_path, target)
    fake.set_nodes(node_list(node("h200-a", "h200"), node("h200-b", "h200", cordoned=True), node("h100-a", "h100")))
    observed = driver.observe_cluster("east")
    assert observed.ready and observed.gateway_address is None
    assert "gateway gw/inference" in observed.message
    assert [(p.name, p.nodes, p.schedulable) for p in observed.pools] == [("h100", 1, 1), ("h200", 2, 1)]
    fake.put(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "inference", "namespace": "gw"},
            "status": {"addresses": [{"type": "IPAddress", "value": "203.0.113.7"}]},
        }
    )
    assert driver.observe_cluster("east").gateway_address == "203.0.113.7"


def test_an_unreachable_cluster_is_not_ready_with_the_reason(fake: FakeKubernetes, tmp_path: Path) -> None:
    driver = driver_for(fake, tmp_path)
    fake.reachable = False
    observed = driver.observe_cluster("east")
    assert not observed.ready and observed.message.startswith("unreachable: 503")
    fake.stop()
    observed = driver.observe_cluster("east")
    assert not observed.ready and observed.message.startswith("unreachable:")
    # A missing Secret file: the reason names the Secret and the path, never a credential.
    (tmp_path / "secrets" / "prod-east" / "kubeconfig").unlink()
    observed = driver.observe_cluster("east")
    assert not observed.ready
    assert "secret prod-east: no kubeconfig file at" in observed.message and "token" not in observed.message
    unset = KubernetesClusterDriver(driver.targets, driver.fallback, None)
    assert "BERTH_CLUSTER_SECRETS_DIR is not set" in unset.observe_cluster("east").message
    # A kubeconfig that does not parse: the reason says so, and quotes none of the file (a YAML error would).
    (tmp_path / "secrets" / "prod-east" / "kubeconfig").write_text("users:\n- name: a\n  user: {token: s3cr3t\n")
    observed = driver.observe_cluster("east")
    assert (
        not observed.ready and "secret prod-east" in observed.message and "not a usable kubeconfig" in observed.message
    )
    assert "s3cr3t" not in observed.message


# -- the fake against the API conventions it imitates -------------------------------------------------------------


def test_the_fake_follows_the_api_conventions(fake: FakeKubernetes) -> None:
    base = f"http://127.0.0.1:{fake.port}/apis/apps/v1/namespaces/default/deployments"
    manifest = render_objects(render_workload(rider_replica()))[1]
    manifest["metadata"]["namespace"] = "default"
    apply = {"Content-Type": "application/apply-patch+yaml"}
    body = json.dumps(manifest)
    name = manifest["metadata"]["name"]
    with httpx.Client() as http:
        no_manager = http.patch(f"{base}/{name}", content=body, headers=apply)
        assert no_manager.status_code == 400 and no_manager.json()["kind"] == "Status"
        wrong_name = http.patch(f"{base}/other", params={"fieldManager": "t"}, content=body, headers=apply)
        assert wrong_name.status_code == 400
        created = http.patch(f"{base}/{name}", params={"fieldManager": "t"}, content=body, headers=apply)
        assert created.status_code == 201 and created.json()["metadata"]["generation"] == 1
        again = http.patch(f"{base}/{name}", params={"fieldManager": "t"}, content=body, headers=apply)
        assert again.status_code == 200 and again.json()["metadata"]["generation"] == 1
        listed = http.get(base, params={"labelSelector": "modelplane.ai/replica=chat-east-0,!absent"}).json()
        assert listed["kind"] == "DeploymentList" and [i["metadata"]["name"] for i in listed["items"]] == [name]
        assert http.get(base, params={"labelSelector": "modelplane.ai/replica!=chat-east-0"}).json()["items"] == []
        missing = http.get(f"{base}/nope")
        assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"
        invalid = json.loads(body)
        invalid["spec"]["replicas"] = "two"
        refused = http.patch(f"{base}/{name}", params={"fieldManager": "t"}, content=json.dumps(invalid), headers=apply)
        assert refused.status_code == 422 and refused.json()["reason"] == "Invalid"
        gone = http.delete(f"{base}/{name}", params={"propagationPolicy": "Background"})
        assert gone.status_code == 200 and gone.json()["status"] == "Success"
        assert http.delete(f"{base}/{name}").status_code == 404
    assert matches({"a": "1"}, "a==1") and not matches({"a": "1"}, "a,b") and matches({}, "!a")
