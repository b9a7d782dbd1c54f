"""InferenceClass: the devices one node of a pool publishes, in the shape Modelplane publishes them.

Attributes and capacities follow Kubernetes DRA: each attribute holds exactly one typed value, each capacity a
quantity. CEL selectors in requests and deployments are evaluated against these devices.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import Field, NonNegativeInt, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from contracts.manifest import Spec
from fleet.meta import Carried, ObjectMeta
from fleet.openapi import check_block

# Kubernetes resource.Quantity: a signed decimal number with a binary suffix, a decimal suffix, or an exponent.
QUANTITY_PATTERN = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


class ClaimKind(StrEnum):
    DRA = "DRA"  # claimed through a ResourceClaim: counts against the pool
    SYNTHETIC = "Synthetic"  # matched by selectors but never claimed (e.g. a published CPU or NIC description)


class DeviceAttribute(Spec):
    """One typed attribute value; exactly one of the four fields is set."""

    string: StrictStr | None = None
    int: StrictInt | None = None
    bool: StrictBool | None = None
    version: StrictStr | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceAttribute:
        given = [k for k in ("string", "int", "bool", "version") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"an attribute holds exactly one of string, int, bool or version (got {given or 'none'})")
        return self


class DeviceCapacity(Spec):
    value: str

    @field_validator("value", mode="before")
    @classmethod
    def _quantity(cls, value: object) -> str:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not QUANTITY_PATTERN.match(text):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (for example 141Gi, 500m, 8)")
        return text


class Device(Spec):
    name: str
    claim: ClaimKind = ClaimKind.DRA
    driver: str | None = None
    device_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="DRA DeviceClass a DRA device is claimed through (Modelplane requires it; Berth falls back to the "
        "driver, whose install creates a DeviceClass of that name).",
    )
    count: NonNegativeInt = 1
    attributes: dict[str, DeviceAttribute] = Field(default_factory=dict)
    capacity: dict[str, DeviceCapacity] = Field(default_factory=dict)

    @property
    def claimed_through(self) -> str:
        """The DeviceClass a ResourceClaim names for this device: its deviceClassName, else its driver, else its name."""
        return self.device_class_name or self.driver or self.name

    def as_cel_device(self) -> dict[str, object]:
        """The mapping `scheduler.cel` evaluates selectors against (plain JSON-like data)."""
        return self.model_dump(
            mode="json",
            by_alias=True,
            exclude_none=True,
            include={"name", "driver", "attributes", "capacity"},
        )


class InferenceClassSpec(Spec):
    description: str | None = None
    crossplane: Carried | None = Field(default=None, description="What Crossplane adds to a live XR; carried.")
    provisioning: Carried | None = Field(
        default=None, description="How Modelplane provisions a pool of this class (GKE, EKS, ...); carried, not read."
    )
    devices: list[Device] = Field(default_factory=list)
    capabilities: list[str] = Field(
        default_factory=list,
        description="Serving capabilities of pools of this class, e.g. vllm, sglang: a pool serves a deployment "
        "only if they include every one it requires and each member's backend.",
    )

    @field_validator("provisioning")
    @classmethod
    def _provisioning(cls, value: Carried | None) -> Carried | None:
        return None if value is None else check_block("InferenceClass", "spec.provisioning", value)

    @field_validator("devices")
    @classmethod
    def _unique_device_names(cls, devices: list[Device]) -> list[Device]:
        seen: set[str] = set()
        for device in devices:
            if device.name in seen:
                raise ValueError(f"device name {device.name!r} appears twice")
            seen.add(device.name)
        return devices


class InferenceClass(Spec):
    api_version: str
    kind: Literal["InferenceClass"]
    metadata: ObjectMeta
    spec: InferenceClassSpec
    status: Carried | None = Field(default=None, description="Observed status (conditions); carried, not read.")
