"""A small Kubernetes API server fake on a loopback port, for the cluster driver's tests (no API server runs here).

It speaks the HTTP that lightkube sends and answers as the Kubernetes API conventions say
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md and the
server-side apply and garbage-collection docs), for the part Berth uses:

- resource paths `/api/v1/...` and `/apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>[/status]]`;
- server-side apply: `PATCH` with `Content-Type: application/apply-patch+yaml` needs `fieldManager` (400 without
  it); the body's apiVersion, kind and name must match the URL (400); the namespace must exist (404, as a real
  server says `namespaces "x" not found`); an object is created when missing (uid, resourceVersion, generation 1,
  creationTimestamp, managedFields with the manager and operation Apply) and otherwise updated, `generation` rising
  only when `spec` changes; every applied object is validated (kubernetes-validate for built-in kinds, the LWS CRD's
  schema for LeaderWorkerSets) and refused with 422 Invalid when it does not validate, as a real server refuses it;
  kinds whose CRD is not installed are 404;
- `GET` of an object or a list (`<Kind>List` with `metadata.resourceVersion`), list filtered by `labelSelector`
  (equality-based: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated), all namespaces without a namespace;
- `DELETE` with `propagationPolicy`: Background removes the object at once (and the answer is a Status Success);
  Foreground sets `deletionTimestamp` and the `foregroundDeletion` finalizer and returns the object, which goes
  away once its dependents are gone (here: after `terminate_seconds`); a missing object is a 404 Status NotFound;
- the garbage collector: an object whose `ownerReferences` name a deleted object is deleted with it;
- `GET`/`PATCH` (merge patch) of the `status` subresource, which is how tests play a controller; and a built-in
  controller that makes Deployments available and LeaderWorkerSet groups ready `boot_seconds` after the spec last
  changed, unless `never_ready` is set.

What it does not imitate: field ownership conflicts between managers (it has one client), watches, resourceVersion
preconditions, admission and scheduling.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

KUBERNETES_VERSION = "1.34.0"  # the schemas kubernetes-validate checks against (resource.k8s.io/v1 is GA in 1.34)
LWS_SCHEMA_FILE = Path(__file__).parent / "activities" / "cluster_k8s" / "lws-v1-openapi.json"

# (group, version, plural) -> (kind, namespaced)
KINDS: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("", "v1", "nodes"): ("Node", False),
    ("", "v1", "namespaces"): ("Namespace", False),
    ("", "v1", "pods"): ("Pod", True),  # only those a test puts, playing the scheduler: this fake schedules nothing
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("resource.k8s.io", "v1", "resourceclaimtemplates"): ("ResourceClaimTemplate", True),
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"): ("LeaderWorkerSet", True),
    ("gateway.networking.k8s.io", "v1", "gateways"): ("Gateway", True),
}
CRD_KINDS = {"LeaderWorkerSet", "Gateway"}


def strict_schema(schema: Any) -> Any:
    """A CRD's structural schema as a strict server reads it: an object with `properties` and neither
    `additionalProperties` nor `x-kubernetes-preserve-unknown-fields` takes no other field (the API server prunes
    or, with fieldValidation=Strict as kubectl sends, refuses them)."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema


_LWS_VALIDATOR: jsonschema.Draft7Validator | None = None


def validate_object(obj: dict[str, Any]) -> list[str]:
    """Why the object would be refused; [] when it validates."""
    global _LWS_VALIDATOR
    if obj.get("kind") == "LeaderWorkerSet":
        if _LWS_VALIDATOR is None:
            schema = strict_schema(json.loads(LWS_SCHEMA_FILE.read_text())["openAPIV3Schema"])
            # metadata is the API server's (ObjectMeta), not the CRD's: check only what the CRD says of it.
            schema["properties"]["metadata"] = {"type": "object"}
            _LWS_VALIDATOR = jsonschema.Draft7Validator(schema)
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _LWS_VALIDATOR.iter_errors(obj)]
    if obj.get("kind") == "Gateway":
        return []
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.path))}: {error.message}"]
    return []


def matches(labels: dict[str, str], selector: str | None) -> bool:
    for term in (selector or "").split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def status_error(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> JSONResponse:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return JSONResponse(body, status_code=code)


class FakeKubernetes:
    """The fake's state and HTTP app; `serve()` runs it on a free loopback port in a thread of its own."""

    def __init__(self, boot_seconds: float = 0.2, terminate_seconds: float = 0.2) -> None:
        self.boot_seconds = boot_seconds
        self.terminate_seconds = terminate_seconds
        self.never_ready = False
        self.controller = True  # the built-in Deployment/LWS status controller
        self.installed_crds: set[str] = set(CRD_KINDS)
        self.namespaces: set[str] = {"default", "kube-system"}
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, namespace, name) -> object
        self.changed_at: dict[tuple[str, str, str], float] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, query) of every request
        self.reachable = True
        self._version = 0
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/api/{version}/{rest:path}", self._handle, methods=["GET", "PATCH", "DELETE"]),
                Route("/apis/{group}/{version}/{rest:path}", self._handle, methods=["GET", "PATCH", "DELETE"]),
            ]
        )
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- test controls ----------------------------------------------------------------------------------------------

    def set_nodes(self, node_list: dict[str, Any]) -> None:
        """Nodes as `kubectl get nodes -o json` prints them (a List with items)."""
        with self._lock:
            for key in [k for k in self.objects if k[0] == "Node"]:
                del self.objects[key]
            for node in node_list.get("items", []):
                self.objects[("Node", "", node["metadata"]["name"])] = copy.deepcopy(node)

    def put(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        with self._lock:
            self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = copy.deepcopy(obj)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        self._reconcile()
        with self._lock:
            return [copy.deepcopy(o) for (k, _, _), o in sorted(self.objects.items()) if k == kind]

    def workloads(self) -> list[str]:
        """`namespace/replica` of every replica with objects here (what a `kubectl get -l` would show)."""
        names = {
            f"{o['metadata']['namespace']}/{o['metadata']['labels']['modelplane.ai/replica']}"
            for kind in ("Deployment", "LeaderWorkerSet", "ResourceClaimTemplate")
            for o in self.of_kind(kind)
            if "modelplane.ai/replica" in (o["metadata"].get("labels") or {})
        }
        return sorted(names)

    def kubeconfig(self, context: str = "fake") -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                "users": [{"name": "berth", "user": {"token": "not-a-real-token"}}],
                "contexts": [{"name": context, "context": {"cluster": "fake", "user": "berth"}}],
                "current-context": context,
            }
        )

    # -- serving ----------------------------------------------------------------------------------------------------

    def serve(self) -> FakeKubernetes:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=asyncio.run, args=(self._server.serve(),), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the fake API server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeKubernetes:
        return self.serve()

    def __exit__(self, *args: object) -> None:
        self.stop()

    # -- the API ----------------------------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> JSONResponse:
        group = request.path_params.get("group", "")
        version = request.path_params["version"]
        parts = request.path_params["rest"].strip("/").split("/")
        query = dict(request.query_params)
        self.requests.append((request.method, request.url.path, query))
        if not self.reachable:
            return status_error(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        namespace = ""
        if parts[0] == "namespaces" and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        plural, name, sub = parts[0], (parts[1] if len(parts) > 1 else None), (parts[2] if len(parts) > 2 else None)
        kind_info = KINDS.get((group, version, plural))
        if kind_info is None or (kind_info[0] in CRD_KINDS and kind_info[0] not in self.installed_crds):
            return status_error(404, "NotFound", "the server could not find the requested resource")
        kind, namespaced = kind_info
        self._reconcile()
        if request.method == "GET" and name is None:
            return self._list(kind, group, version, namespace if namespaced else "", query.get("labelSelector"))
        assert name is not None
        key = (kind, namespace, name)
        resource = f"{plural}.{group}" if group else plural
        if request.method == "GET":
            obj = self.objects.get(key)
            if obj is None:
                return status_error(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": plural})
            return JSONResponse(obj)
        if request.method == "DELETE":
            return self._delete(key, resource, query.get("propagationPolicy", "Background"))
        body = await request.body()
        if sub == "status":
            return self._patch_status(key, resource, json.loads(body))
        if request.headers.get("content-type", "").split(";")[0] != "application/apply-patch+yaml":
            return status_error(415, "UnsupportedMediaType", "only server-side apply is served by this fake")
        return self._apply(key, group, version, resource, query, yaml.safe_load(body))

    def _list(self, kind: str, group: str, version: str, namespace: str, selector: str | None) -> JSONResponse:
        with self._lock:
            items = [
                copy.deepcopy(o)
                for (k, ns, _), o in sorted(self.objects.items())
                if k == kind
                and (not namespace or ns == namespace)
                and matches((o.get("metadata") or {}).get("labels") or {}, selector)
            ]
            api_version = f"{group}/{version}" if group else version
            return JSONResponse(
                {
                    "kind": f"{kind}List",
                    "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(self._version)},
                    "items": items,
                }
            )

    def _apply(
        self,
        key: tuple[str, str, str],
        group: str,
        version: str,
        resource: str,
        query: dict[str, str],
        body: dict[str, Any],
    ) -> JSONResponse:
        kind, namespace, name = key
        if not query.get("fieldManager"):
            return status_error(400, "BadRequest", "PATCH requests with apply-patch require a fieldManager")
        api_version = f"{group}/{version}" if group else version
        meta = body.get("metadata") or {}
        if body.get("apiVersion") != api_version or body.get("kind") != kind or meta.get("name") != name:
            return status_error(400, "BadRequest", "the object's apiVersion, kind and name must match the URL")
        if meta.get("namespace", namespace) != namespace:
            return status_error(400, "BadRequest", "the namespace of the object does not match the URL")
        if namespace and namespace not in self.namespaces:
            return status_error(
                404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}
            )
        problems = validate_object(body)
        if problems:
            return status_error(
                422, "Invalid", f'{kind} "{name}" is invalid: ' + "; ".join(problems), {"name": name, "kind": kind}
            )
        with self._lock:
            self._version += 1
            existing = self.objects.get(key)
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if existing is None:
                obj = copy.deepcopy(body)
                obj["metadata"] = {
                    **meta,
                    "namespace": namespace,
                    "uid": str(uuid.uuid4()),
                    "generation": 1,
                    "creationTimestamp": now,
                }
                self.changed_at[key] = time.monotonic()
                code = 201
            else:
                if existing["metadata"].get("deletionTimestamp"):
                    return status_error(409, "Conflict", f'{resource} "{name}" is being deleted')
                obj = copy.deepcopy(existing)
                obj["metadata"]["labels"] = meta.get("labels") or {}
                for field, value in body.items():
                    if field not in ("metadata", "status", "apiVersion", "kind"):
                        if field == "spec" and value != existing.get("spec"):
                            obj["metadata"]["generation"] = existing["metadata"].get("generation", 1) + 1
                            self.changed_at[key] = time.monotonic()
                        obj[field] = copy.deepcopy(value)
                code = 200
            obj["metadata"]["resourceVersion"] = str(self._version)
            obj["metadata"]["managedFields"] = [
                {
                    "manager": query["fieldManager"],
                    "operation": "Apply",
                    "apiVersion": api_version,
                    "time": now,
                    "fieldsType": "FieldsV1",
                }
            ]
            self.objects[key] = obj
            return JSONResponse(copy.deepcopy(obj), status_code=code)

    def _delete(self, key: tuple[str, str, str], resource: str, policy: str) -> JSONResponse:
        with self._lock:
            obj = self.objects.get(key)
            if obj is None:
                return status_error(404, "NotFound", f'{resource} "{key[2]}" not found', {"name": key[2]})
            self._version += 1
            if policy == "Foreground" and key[0] in ("Deployment", "LeaderWorkerSet"):
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    obj["metadata"]["finalizers"] = ["foregroundDeletion"]
                    self.changed_at[key] = time.monotonic()
                return JSONResponse(copy.deepcopy(obj))
            del self.objects[key]
            self._collect(obj["metadata"].get("uid"))
            return JSONResponse(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {"name": key[2], "uid": obj["metadata"].get("uid")},
                }
            )

    def _patch_status(self, key: tuple[str, str, str], resource: str, patch: dict[str, Any]) -> JSONResponse:
        with self._lock:
            obj = self.objects.get(key)
            if obj is None:
                return status_error(404, "NotFound", f'{resource} "{key[2]}" not found')
            obj["status"] = {**(obj.get("status") or {}), **(patch.get("status") or {})}
            return JSONResponse(copy.deepcopy(obj))

    def _collect(self, owner_uid: str | None) -> None:
        """The garbage collector: objects whose ownerReferences name a deleted object go with it (here, the pods a
        test binds to a workload; the real chain runs through a ReplicaSet, which this fake does not keep)."""
        for key, obj in list(self.objects.items()):
            owners = {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}
            if owner_uid is not None and owner_uid in owners:
                del self.objects[key]

    def _reconcile(self) -> None:
        """The controllers: finish foreground deletions, and report workloads ready after their boot time."""
        now = time.monotonic()
        with self._lock:
            for key, obj in list(self.objects.items()):
                since = now - self.changed_at.get(key, now)
                if obj["metadata"].get("deletionTimestamp"):
                    if since >= self.terminate_seconds:
                        del self.objects[key]
                        self._collect(obj["metadata"].get("uid"))
                    continue
                if not self.controller or key[0] not in ("Deployment", "LeaderWorkerSet"):
                    continue
                wanted = obj["spec"].get("replicas", 1)
                up = 0 if self.never_ready or since < self.boot_seconds else wanted
                generation = obj["metadata"].get("generation", 1)
                if key[0] == "Deployment":
                    obj["status"] = {
                        "observedGeneration": generation,
                        "replicas": wanted,
                        "updatedReplicas": wanted,
                        "readyReplicas": up,
                        "availableReplicas": up,
                    }
                else:
                    obj["status"] = {
                        "observedGeneration": generation,
                        "replicas": wanted,
                        "readyReplicas": up,
                        "updatedReplicas": wanted,
                    }


def node(
    name: str,
    pool: str | None,
    *,
    ready: bool = True,
    cordoned: bool = False,
    taints: list[dict[str, str]] | None = None,
    conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A node as `kubectl get nodes -o json` prints it (the fields that matter, in their places); `conditions` are
    added as node-problem-detector adds its own (`type`, `status`, `reason`, `message`)."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if pool is not None:
        labels["modelplane.ai/pool"] = pool
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24", "providerID": f"fake://{name}"}
    if cordoned:
        spec["unschedulable"] = True
        taints = [
            *(taints or []),
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"},
        ]
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": spec,
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {
                    "type": "Ready",
                    "status": "True" if ready else "Unknown",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                },
                *(conditions or []),
            ],
            "allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110"},
        },
    }


def node_list(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": list(nodes)}
