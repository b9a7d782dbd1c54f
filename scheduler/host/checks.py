"""Reason codes for an approved slot that does not match its host (docs/seeds.md, "Approved slots, checked on the
host"), and what each failure means for scheduling.

A slot whose failures are all about the fabric (`RAW_ONLY_CHECKS`) still counts as a raw GPU and can go to a
bare-metal request, but is never a slice bundle (docs/seeds.md, "Raw free GPUs versus placeable slices"). Any other
failure makes the slot unusable until the host or the fleet file is fixed.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class SlotCheck(StrEnum):
    GPU_ABSENT = "gpu_absent"  # no NVIDIA GPU at the slot's PCI address
    GPU_NOT_VFIO = "gpu_not_vfio"  # the GPU is bound to another driver (nvidia, nouveau) or to none
    SYSFS_UNREADABLE = "sysfs_unreadable"  # an entry of one of the slot's devices could not be read or parsed
    IOMMU_GROUP_SHARED = "iommu_group_shared"  # the group holds a device outside the slot (bridges aside)
    IOMMU_GROUP_NOT_VFIO = "iommu_group_not_vfio"  # a sibling function (the GPU's audio) is not vfio-bound
    IOMMU_GROUP_MISSING = "iommu_group_missing"  # no IOMMU group: the IOMMU is off, passthrough is impossible
    NUMA_MISMATCH = "numa_mismatch"  # a device's NUMA node differs from the slot's declared one
    NVME_ABSENT = "nvme_absent"
    NVME_IN_USE = "nvme_in_use"  # mounted, or held by LVM/dm/md, on the host
    NVME_SHARED_CONTROLLER = "nvme_shared_controller"  # another namespace on its controller: a format may erase both
    NO_PER_SLOT_VF = "no_per_slot_vf"  # fabricClaimMode is not per_slot_vf, or no VF address is declared
    VF_ABSENT = "vf_absent"
    VF_NOT_CHILD = "vf_not_child"  # the VF's physfn is not the declared parent
    VF_DECLARED_TWICE = "vf_declared_twice"  # two slots of the node declare the same VF


RAW_ONLY_CHECKS = frozenset(
    {SlotCheck.NO_PER_SLOT_VF, SlotCheck.VF_ABSENT, SlotCheck.VF_NOT_CHILD, SlotCheck.VF_DECLARED_TWICE}
)


class ValidationState(StrEnum):
    VALID = "valid"  # a slice bundle and a raw GPU
    RAW_ONLY = "raw_only"  # a raw GPU (bare metal, raw counts) but not a slice bundle: only fabric checks failed
    INVALID = "invalid"  # not usable at all until fixed
    UNVALIDATED = "unvalidated"  # no live agent has reported this slot against its host yet

    @property
    def counts_raw(self) -> bool:
        return self in (ValidationState.VALID, ValidationState.RAW_ONLY)


def state_of(checks: list[SlotCheck]) -> ValidationState:
    if not checks:
        return ValidationState.VALID
    if all(check in RAW_ONLY_CHECKS for check in checks):
        return ValidationState.RAW_ONLY
    return ValidationState.INVALID


class SlotVerdict(BaseModel):
    """One approved slot checked against its host: every failed check, most severe first, each with a sentence."""

    model_config = ConfigDict(frozen=True)

    index: int
    state: ValidationState
    checks: list[SlotCheck] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)  # one per check, same order

    @property
    def reason(self) -> SlotCheck | None:
        return self.checks[0] if self.checks else None

    @property
    def message(self) -> str | None:
        return self.messages[0] if self.messages else None


class NodeValidation(BaseModel):
    """Every approved slot of one node against its host, and whether the node can host slices at all."""

    model_config = ConfigDict(frozen=True)

    slots: list[SlotVerdict] = Field(default_factory=list)
    # Why no slot of the node may be sliced (docs/seeds.md, "A shared parent fabric device blocks slices").
    slices_blocked: str | None = None

    def verdict(self, index: int) -> SlotVerdict | None:
        return next((slot for slot in self.slots if slot.index == index), None)
