"""ModelService: one model as a caller sees it, routed by Modelplane's gateways to the ModelEndpoints it selects.

Berth schedules capacity, not traffic: a ModelService affects no placement. A directory of Modelplane manifests
holds them beside the ModelDeployments, so they are read, checked against Modelplane's XRD (`fleet/xrd`, `spec`
and `status` as carried blocks: a typo is an error with its path) and carried, instead of failing the whole file
set as an unknown kind would.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from contracts.manifest import Spec
from fleet.meta import Carried, ObjectMeta
from fleet.openapi import check_block


class ModelService(Spec):
    api_version: str
    kind: Literal["ModelService"]
    metadata: ObjectMeta
    spec: Carried
    status: Carried | None = None

    @field_validator("spec")
    @classmethod
    def _spec(cls, value: Carried) -> Carried:
        return check_block("ModelService", "spec", value)

    @field_validator("status")
    @classmethod
    def _status(cls, value: Carried | None) -> Carried | None:
        return None if value is None else check_block("ModelService", "status", value)

    @property
    def namespace(self) -> str:
        return self.metadata.namespace_or_default
