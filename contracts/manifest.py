"""What manifests share with the messages that carry them: the spec base every fleet object's blocks use, the
default namespace, the error a broken manifest rule raises, a member's role, taints' effects and tolerations.

The fleet's documents (`fleet/`) are built of these, and so are the messages the cluster driver and the deployment
workflow exchange (`contracts/cluster.py`, `contracts/deployment.py`, `contracts/fleet_plan.py`): one model of each,
so a toleration a ModelDeployment writes is the one the driver puts on a pod.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

DEFAULT_NAMESPACE = "default"

# A DNS-1123 label-ish name: what Kubernetes would accept as an object name, and safe in a Temporal task queue.
Name = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([a-z0-9.\-]{0,251}[a-z0-9])?$"),
]

MANIFEST_RULE = "manifest_rule"


def rule_broken(message: str) -> PydanticCustomError:
    """A rule between a manifest's fields (Modelplane's admission rules: unique names, a serving unit's roles, what
    a member may carry), which no schema states: its own problem type (`manifest_rule`), so a client, and the API's
    schema checks, can tell it from a malformed field."""
    return PydanticCustomError(MANIFEST_RULE, "{rule}", {"rule": message})


class Spec(BaseModel):
    """Base for every spec-like block: camelCase in YAML, snake_case in Python, unknown fields are errors.

    Unknown fields are refused rather than ignored because a typo such as `nodeCont` would otherwise silently
    change what gets scheduled.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Role(StrEnum):
    """A member's part in its engine: a Standalone pod, or the Leader and Workers of a gang."""

    STANDALONE = "Standalone"
    LEADER = "Leader"
    WORKER = "Worker"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(Spec):
    """A toleration as a ModelDeployment and a pod spec write it; the one model of it in Berth (a deployment's
    tolerations and those the cluster driver puts on a cluster's workloads). Kubernetes' matching rule is
    `scheduler.deployment.tolerations`."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: TaintEffect | None = Field(default=None, description="Unset matches every effect.")

    @model_validator(mode="after")
    def _operator_fields(self) -> Toleration:
        if self.operator == "Equal" and not self.key:
            raise rule_broken("an Equal toleration must set a key")
        if self.operator == "Exists" and self.value is not None:
            raise rule_broken("an Exists toleration must not set a value")
        return self

    def manifest(self) -> dict[str, str]:
        """As a pod spec writes it: unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
