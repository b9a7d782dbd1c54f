"""The parts every fleet object shares: apiVersion, kind and Kubernetes-style metadata.

Berth accepts its own group (`berth.dev/v1alpha1`) and Modelplane's (`modelplane.ai/v1alpha1`) so that manifests a
platform team already keeps for Modelplane can be applied unchanged.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

API_VERSIONS: tuple[str, ...] = ("berth.dev/v1alpha1", "modelplane.ai/v1alpha1")

# A DNS-1123 label-ish name: what Kubernetes would accept as an object name, and safe in a Temporal task queue.
Name = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([a-z0-9.\-]{0,251}[a-z0-9])?$"),
]


class Spec(BaseModel):
    """Base for every spec-like block: camelCase in YAML, snake_case in Python, unknown fields are errors.

    Unknown fields are refused rather than ignored because a typo such as `nodeCont` would otherwise silently
    change what gets scheduled.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ObjectMeta(BaseModel):
    """Kubernetes object metadata. Fields Berth does not use (uid, annotations, ...) are accepted and ignored, so
    objects copied out of a live cluster apply as they are."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: Name
    labels: dict[str, str] = Field(default_factory=dict)
