"""The real cluster driver: ModelDeployment replicas on Kubernetes API servers, by server-side apply (lightkube).

`KubernetesClusterDriver` is the control worker's ClusterDriver. Per call it looks up the cluster's target (its
connection reference, the taints its workloads tolerate and its autoscaled pools, from PostgreSQL) and talks to
that cluster's API server; a cluster with no connection goes to the fallback driver (the simulated one), so one
control worker serves real and simulated clusters side by side.

    apply    render the replica's objects (k8s_objects.py), apply each with field manager `berth` (force: Berth
             owns these fields; a hand edit is taken back), then delete the replica's objects that are no longer
             rendered (found by the `modelplane.ai/replica` label), so a replica has exactly one set of objects
    ready    the replica's Deployments and LeaderWorkerSets, from their status (k8s_status.py)
    delete   every object of the replica, with foreground propagation (an object disappears only after its pods,
             so the devices are free before the ledger releases the nodes), then wait until the lists are empty;
             still there after the wait, the call fails and the activity retries
    observe  Ready when the API server answers; the gateway address from the Gateway the connection names;
             per pool the nodes that can take work. An unreachable cluster is observed not Ready with the reason;
             nothing is deleted because of it (retained replicas stay: docs/seeds.md, "Existing replicas keep
             their place")

The client is lightkube's synchronous one: the activities already run driver calls in a thread. Credentials are
read from the mounted Secret file only when a client is built; messages name the Secret, never its content (a
kubeconfig that does not parse is reported by the error's kind alone: a YAML error quotes the line it stopped at).
The reason an observation gives reaches the deployment's status ("NotReady: the cluster is not Ready: <reason>").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.operators import exists
from lightkube.types import CascadeType

from activities.cluster.driver import ClusterDriver
from activities.cluster.k8s_objects import MANAGER, REPLICA_LABEL, render_objects
from activities.cluster.k8s_status import evictions, object_readiness, observe_pools
from activities.cluster.workload import Workload
from contracts.cluster import (
    ClusterConnection,
    ClusterObservation,
    ClusterTarget,
    ConnectionUnavailable,
    WorkloadReadiness,
)
from contracts.manifest import DEFAULT_NAMESPACE

DeploymentResource = create_namespaced_resource("apps", "v1", "Deployment", "deployments")
LeaderWorkerSetResource = create_namespaced_resource(
    "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"
)
ClaimTemplateResource = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"
)
GatewayResource = create_namespaced_resource("gateway.networking.k8s.io", "v1", "Gateway", "gateways")
NodeResource = create_global_resource("", "v1", "Node", "nodes")
PodResource = create_namespaced_resource("", "v1", "Pod", "pods")

RESOURCES: dict[str, Any] = {
    "Deployment": DeploymentResource,
    "LeaderWorkerSet": LeaderWorkerSetResource,
    "ResourceClaimTemplate": ClaimTemplateResource,
}
# Deleted workloads first, claim templates last: a pod outliving its template would be stuck.
DELETE_ORDER = ("LeaderWorkerSet", "Deployment", "ResourceClaimTemplate")
# HTTP statuses that say the request itself is wrong: retrying the same request cannot succeed.
_REJECTED = {400, 403, 404, 405, 415, 422}


class WorkloadRejected(RuntimeError):
    """The cluster refused the replica's objects for a reason a retry will not change (invalid, forbidden, a
    missing CRD or namespace)."""


class WorkloadStillTerminating(RuntimeError):
    """Objects of the replica are still being deleted: the caller retries."""


TargetLookup = Callable[[str], ClusterTarget | None]


class KubernetesClusterDriver:
    def __init__(
        self,
        targets: TargetLookup,
        fallback: ClusterDriver,
        secrets_dir: Path | None,
        delete_wait_seconds: float = 20.0,
        poll_seconds: float = 0.5,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.targets = targets
        self.fallback = fallback
        self.secrets_dir = secrets_dir
        self.delete_wait_seconds = delete_wait_seconds
        self.poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds
        self._clients: dict[str, tuple[tuple[Any, ...], Client]] = {}
        self._lock = threading.Lock()

    # -- the interface ----------------------------------------------------------------------------------------------

    def apply_workload(self, workload: Workload) -> None:
        target = self.targets(workload.cluster)
        if target is None:
            return self.fallback.apply_workload(workload)
        client = self._client(workload.cluster, target.connection)
        objects = render_objects(workload)
        for manifest in objects:
            resource = RESOURCES[manifest["kind"]]
            try:
                client.apply(resource.from_dict(manifest), field_manager=MANAGER, force=True)
            except ApiError as error:
                raise _classified(error, workload.cluster, manifest) from error
        wanted = {(m["kind"], m["metadata"]["name"]) for m in objects}
        for kind, obj in self._owned(client, workload.name, workload.namespace):
            name = obj["metadata"]["name"]
            if (kind, name) not in wanted:
                self._delete_one(client, kind, name, workload.namespace)
        return None

    def delete_workload(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        target = self.targets(cluster)
        if target is None:
            return self.fallback.delete_workload(cluster, name, namespace)
        client = self._client(cluster, target.connection)
        found = self._owned(client, name, namespace)
        for kind, obj in found:
            self._delete_one(client, kind, obj["metadata"]["name"], namespace)
        deadline = time.monotonic() + self.delete_wait_seconds
        while left := self._owned(client, name, namespace):
            if time.monotonic() >= deadline:
                names = ", ".join(f"{kind} {obj['metadata']['name']}" for kind, obj in left)
                raise WorkloadStillTerminating(f"{cluster}: still terminating: {names}")
            time.sleep(self.poll_seconds)
        return bool(found)

    def workload_ready(self, cluster: str, name: str, namespace: str = DEFAULT_NAMESPACE) -> WorkloadReadiness:
        target = self.targets(cluster)
        if target is None:
            return self.fallback.workload_ready(cluster, name, namespace)
        client = self._client(cluster, target.connection)
        owned = self._owned(client, name, namespace)
        states = [r for _, obj in owned if (r := object_readiness(obj)) is not None]
        if not states:
            return WorkloadReadiness(exists=False, ready=False, message=f"no workload of {name} on {cluster}")
        ready = all(s.ready for s in states)
        return WorkloadReadiness(
            exists=True,
            ready=ready,
            pods_ready=sum(s.pods_ready for s in states),
            pods_total=sum(s.pods_total for s in states),
            message="all pods ready" if ready else "; ".join(s.message for s in states if not s.ready),
        )

    def observe_cluster(self, cluster: str) -> ClusterObservation:
        target = self.targets(cluster)
        if target is None:
            return self.fallback.observe_cluster(cluster)
        try:
            client = self._client(cluster, target.connection)
            nodes = [n.to_dict() for n in client.list(NodeResource)]
            pods = [p.to_dict() for p in client.list(PodResource, namespace="*", labels={REPLICA_LABEL: exists()})]
            gateway, note = self._gateway(client, target.connection.gateway)
        except (ConnectionUnavailable, ConfigError, ApiError, httpx2.HTTPError, OSError) as error:
            return ClusterObservation(cluster=cluster, ready=False, message=f"unreachable: {_describe(error)}")
        pools = observe_pools(nodes, target.tolerations, target.autoscaled)
        notes = [note] if note else []
        notes += [f"pool {p.name}: {p.message} ({'; '.join(p.excluded)})" for p in pools if p.excluded]
        return ClusterObservation(
            cluster=cluster,
            ready=True,
            gateway_address=gateway,
            pools=pools,
            evicted=evictions(nodes, pods, REPLICA_LABEL),
            message="; ".join(["Ready", *notes]),
        )

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _client(self, cluster: str, connection: ClusterConnection) -> Client:
        """One client per cluster, rebuilt when the connection or the mounted kubeconfig changes (rotation)."""
        if connection.method == "in-cluster":
            key: tuple[Any, ...] = (connection,)
            make: Callable[[], Any] = KubeConfig.from_service_account
        else:
            path = connection.kubeconfig_path(self.secrets_dir)
            key = (connection, path.stat().st_mtime_ns)

            def make() -> Any:
                return KubeConfig.from_file(path).get(connection.context)

        with self._lock:
            cached = self._clients.get(cluster)
            if cached is not None and cached[0] == key:
                return cached[1]
            try:
                config = make()
                if config is None:
                    raise ConfigError(f"{connection.describe()}: no context {connection.context!r} in the kubeconfig")
                client = Client(
                    config=config, field_manager=MANAGER, timeout=httpx2.Timeout(self.timeout_seconds), trust_env=False
                )
            except (ConfigError, OSError):
                raise  # lightkube's and the OS's own words: names and paths, no file content
            except Exception as error:  # a parser's message quotes the offending line, which may hold a credential
                raise ConnectionUnavailable(
                    f"{connection.describe()}: not a usable kubeconfig ({type(error).__name__})"
                ) from None
            self._clients[cluster] = (key, client)
            return client

    def _owned(self, client: Client, replica: str, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        """Every object of the replica, by its label, workloads before claim templates."""
        found = []
        for kind in DELETE_ORDER:
            try:
                listed = client.list(RESOURCES[kind], namespace=namespace, labels={REPLICA_LABEL: replica})
                found.extend((kind, obj.to_dict()) for obj in listed)
            except ApiError as error:
                if error.status.code != 404:  # 404: the kind is not served there (no LWS CRD): none of them
                    raise
        return found

    def _delete_one(self, client: Client, kind: str, name: str, namespace: str) -> None:
        try:
            client.delete(RESOURCES[kind], name, namespace=namespace, cascade=CascadeType.FOREGROUND)
        except ApiError as error:
            if error.status.code != 404:
                raise

    def _gateway(self, client: Client, ref: str) -> tuple[str | None, str]:
        namespace, _, name = ref.partition("/")
        try:
            gateway = client.get(GatewayResource, name, namespace=namespace).to_dict()
        except ApiError as error:
            return None, f"gateway {ref}: {error.status.message or error.status.reason}"
        addresses = (gateway.get("status") or {}).get("addresses") or []
        if not addresses:
            return None, f"gateway {ref} has no address yet"
        return addresses[0].get("value"), ""


def _classified(error: ApiError, cluster: str, manifest: dict[str, Any]) -> Exception:
    what = f"{cluster}: {manifest['kind']} {manifest['metadata']['namespace']}/{manifest['metadata']['name']}"
    code = error.status.code or 0
    if code in _REJECTED:
        hint = (
            " (is the LeaderWorkerSet CRD installed?)" if code == 404 and manifest["kind"] == "LeaderWorkerSet" else ""
        )
        return WorkloadRejected(f"{what} refused ({code}): {error.status.message}{hint}")
    return RuntimeError(f"{what}: {code} {error.status.message}")


def _describe(error: BaseException) -> str:
    if isinstance(error, ApiError):
        return f"{error.status.code} {error.status.message}"
    return str(error) or type(error).__name__
