"""The cluster side's contracts: how Berth reaches a real cluster, and what a driver reports of it.

How Berth reaches a real cluster's API server: a reference to credentials, never the credentials themselves.

An InferenceCluster declares it the way Modelplane does, and Berth adds a few optional annotations:

    spec.cluster: {source: Existing, existing: {secretRef: {name: prod-east, key: kubeconfig}}}
        -> the kubeconfig file `<BERTH_CLUSTER_SECRETS_DIR>/prod-east/kubeconfig` (the operator mounts the Secret
           there, as Kubernetes mounts a Secret's keys as files); `key` defaults to `kubeconfig` as in the XRD
    metadata.annotations:
        berth.dev/kubeconfig-secret: <name>[/<key>]   the same for any source (GKE, EKS, ...: the Secret the
                                                       provisioner wrote); wins over spec.cluster.existing
        berth.dev/kube-context: <context>              a context of that kubeconfig (default: its current-context)
        berth.dev/cluster-connection: in-cluster       the control worker's own service account: for the cluster
                                                       Berth itself runs in
        berth.dev/gateway: <namespace>/<name>          the Gateway (gateway.networking.k8s.io) whose address is
                                                       the cluster's gateway address (default below)

A cluster with none of these has no connection and stays on the simulated driver. What reaches PostgreSQL (and
from there the control worker) is this reference; the Secret's content is read only by the control worker, from
the mounted file, at the moment it connects, and is never logged, stored, or put in a search attribute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The tolerations a cluster's workloads carry are the ModelDeployment's one model, matched by
# `scheduler.deployment.tolerations.tolerates`, Kubernetes' rule; serialized as before: key, operator, value, effect.
from contracts.manifest import Toleration

KUBECONFIG_SECRET_ANNOTATION = "berth.dev/kubeconfig-secret"
CONTEXT_ANNOTATION = "berth.dev/kube-context"
CONNECTION_ANNOTATION = "berth.dev/cluster-connection"
GATEWAY_ANNOTATION = "berth.dev/gateway"
DEFAULT_SECRET_KEY = "kubeconfig"
DEFAULT_GATEWAY = "modelplane-system/inference-gateway"


class ConnectionUnavailable(RuntimeError):
    """The connection's credentials cannot be read here (no secrets directory, file missing); says which file."""


class ClusterConnection(BaseModel):
    """A reference to a cluster's credentials, as stored in `clusters.connection`."""

    model_config = ConfigDict(frozen=True)

    method: Literal["kubeconfig", "in-cluster"]
    secret_name: str | None = None
    secret_key: str = DEFAULT_SECRET_KEY
    context: str | None = None
    gateway: str = DEFAULT_GATEWAY

    def kubeconfig_path(self, secrets_dir: Path | None) -> Path:
        """The mounted Secret key holding the kubeconfig; refuses names that would leave the secrets directory."""
        if secrets_dir is None:
            raise ConnectionUnavailable(
                f"secret {self.secret_name}: BERTH_CLUSTER_SECRETS_DIR is not set on the control worker"
            )
        parts = [self.secret_name or "", self.secret_key]
        if any(not p or p in (".", "..") or "/" in p for p in parts):
            raise ConnectionUnavailable(f"secret {self.secret_name}/{self.secret_key}: not a Secret name and key")
        path = secrets_dir.joinpath(*parts)
        if not path.is_file():
            raise ConnectionUnavailable(f"secret {self.secret_name}: no kubeconfig file at {path}")
        return path

    def describe(self) -> str:
        if self.method == "in-cluster":
            return "in-cluster service account"
        context = f", context {self.context}" if self.context else ""
        return f"kubeconfig from secret {self.secret_name} key {self.secret_key}{context}"


def connection_of(cluster: Any, annotations: dict[str, str]) -> ClusterConnection | None:
    """The connection an InferenceCluster declares (its carried `spec.cluster` and Berth's annotations), or None."""
    context = annotations.get(CONTEXT_ANNOTATION) or None
    gateway = annotations.get(GATEWAY_ANNOTATION) or DEFAULT_GATEWAY
    if annotations.get(CONNECTION_ANNOTATION) == "in-cluster":
        return ClusterConnection(method="in-cluster", gateway=gateway)
    named = annotations.get(KUBECONFIG_SECRET_ANNOTATION)
    if named:
        name, _, key = named.partition("/")
        return ClusterConnection(
            method="kubeconfig",
            secret_name=name,
            secret_key=key or DEFAULT_SECRET_KEY,
            context=context,
            gateway=gateway,
        )
    spec = cluster if isinstance(cluster, dict) else {}
    ref = ((spec.get("existing") or {}).get("secretRef") or {}) if spec.get("source") == "Existing" else {}
    if not ref.get("name"):
        return None
    return ClusterConnection(
        method="kubeconfig",
        secret_name=ref["name"],
        secret_key=ref.get("key") or DEFAULT_SECRET_KEY,
        context=context,
        gateway=gateway,
    )


class ClusterTarget(BaseModel):
    """What the driver needs to know of a real cluster, read from PostgreSQL (no secret in it): the connection,
    the taints its workloads tolerate (the InferenceCluster's `spec.taints`, which Modelplane's workloads carry
    tolerations for) and the pools the autoscaler grows."""

    model_config = ConfigDict(frozen=True)

    connection: ClusterConnection
    tolerations: list[Toleration] = Field(default_factory=list)
    autoscaled: dict[str, int | None] = Field(default_factory=dict, description="pool -> maxNodeCount")


class PoolObservation(BaseModel):
    """One pool as the cluster shows it: nodes carrying its label, and of them those that can take work."""

    model_config = ConfigDict(frozen=True)

    name: str
    nodes: int = Field(description="Nodes carrying the pool label.")
    schedulable: int = Field(description="Of them, Ready, not cordoned and without an untolerated taint.")
    autoscaled: bool = False
    excluded: list[str] = Field(default_factory=list, description="`<node>: <why>` for every node left out.")
    message: str = ""


class ClusterObservation(BaseModel):
    """What the fleet scheduler reads of a cluster's health: Ready, and the address its gateway serves on."""

    model_config = ConfigDict(frozen=True)

    cluster: str
    ready: bool
    gateway_address: str | None = None
    message: str = ""
    pools: list[PoolObservation] | None = Field(
        default=None, description="Per pool, the nodes that can take work (a real cluster); None: not observed."
    )
    evicted: dict[str, str] = Field(
        default_factory=dict,
        description="`<namespace>/<replica>` -> why, for replicas with a pod on a node tainted NoExecute that the pod "
        "does not tolerate: the deployment moves them.",
    )


class WorkloadReadiness(BaseModel):
    model_config = ConfigDict(frozen=True)

    exists: bool
    ready: bool
    pods_ready: int = 0
    pods_total: int = 0
    message: str = ""
