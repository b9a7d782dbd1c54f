"""The parts every fleet object shares: apiVersion, kind and Kubernetes-style metadata.

Berth accepts its own group (`berth.dev/v1alpha1`) and Modelplane's (`modelplane.ai/v1alpha1`) so that manifests a
platform team already keeps for Modelplane can be applied unchanged.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from contracts.manifest import DEFAULT_NAMESPACE, Name

API_VERSIONS: tuple[str, ...] = ("berth.dev/v1alpha1", "modelplane.ai/v1alpha1")

# A node pool's name, as Modelplane's InferenceCluster XRD allows it: any string of 1 to 40 characters. It is never
# an object name, a task queue or a path segment in Berth; it is a PostgreSQL column (253 characters) and the value
# of the `modelplane.ai/pool` node label, which Kubernetes restricts further (see `fleet.meta.label_value_problem`).
PoolName = Annotated[str, StringConstraints(min_length=1, max_length=40)]

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_value_problem(value: str) -> str | None:
    """Why `value` cannot be a Kubernetes label value (at most 63 characters, alphanumeric at both ends, `-_.`
    inside), or None. Pods are pinned to a pool by the label `modelplane.ai/pool=<pool name>`."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return f"{value!r} is not a valid Kubernetes label value, so pods cannot be pinned to it by modelplane.ai/pool"
    return None


class ObjectMeta(BaseModel):
    """Kubernetes object metadata. Fields Berth does not use (uid, resourceVersion, generation, managedFields,
    finalizers, ownerReferences, ...) are accepted and ignored, so objects copied out of a live cluster apply as they
    are. `namespace` matters for namespaced kinds (ModelDeployment, ModelReplica, ModelCache); cluster-scoped kinds
    ignore it, as the API server does."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: Name
    namespace: Name | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    # Set by the API server once deletion is asked for while finalizers hold the object: it is being deleted.
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")

    @property
    def namespace_or_default(self) -> str:
        return self.namespace or DEFAULT_NAMESPACE


Carried = dict[str, Any]
"""A block Berth accepts and keeps but does not read (checked against the XRD where Modelplane defines it)."""
