"""An operator's slots checked against what discovery found on the host (docs/seeds.md, "Approved slots, checked
on the host").

The fleet file is the operator's approved inventory; the host is the truth. A slot that names a GPU the host lacks,
a GPU still held by the host driver, an NVMe that is mounted or a VF that belongs to another PF would fail at VM
creation, so each slot gets every failed check up front, most severe first, each with a sentence naming the device.
Unapproved slots are checked too, so the operator sees what to fix before approving them.

One function per device kind (GPU, IOMMU group, NVMe, fabric) returns findings; `_verdict` merges them into one
entry per check code (a code appears once per slot, its sentences joined) and orders them by `SEVERITY`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from fleet.node import FabricClaimMode, Slot
from scheduler.host.checks import NodeValidation, SlotCheck, SlotVerdict, ValidationState, state_of
from scheduler.host.inventory import (
    FabricDevice,
    FabricRole,
    Gpu,
    HostInventory,
    NvmeNamespace,
    PciFunction,
    pci_device,
)

VFIO = "vfio-pci"

# Most severe first: a verdict's first check is the one an operator should fix first.
SEVERITY: tuple[SlotCheck, ...] = (
    SlotCheck.GPU_ABSENT,
    SlotCheck.SYSFS_UNREADABLE,
    SlotCheck.GPU_NOT_VFIO,
    SlotCheck.IOMMU_GROUP_MISSING,
    SlotCheck.IOMMU_GROUP_SHARED,
    SlotCheck.IOMMU_GROUP_NOT_VFIO,
    SlotCheck.NVME_ABSENT,
    SlotCheck.NVME_IN_USE,
    SlotCheck.NVME_SHARED_CONTROLLER,
    SlotCheck.NUMA_MISMATCH,
    SlotCheck.NO_PER_SLOT_VF,
    SlotCheck.VF_ABSENT,
    SlotCheck.VF_NOT_CHILD,
    SlotCheck.VF_DECLARED_TWICE,
)

Finding = tuple[SlotCheck, str]


def validate_slots(slots: Sequence[Slot], host: HostInventory) -> NodeValidation:
    """Every slot of one node (approved or not) against the node's discovered host, in slot index order."""
    declarers = _vf_declarers(slots)
    verdicts = [_verdict(slot, host, declarers) for slot in sorted(slots, key=lambda slot: slot.index)]
    return NodeValidation(slots=verdicts, slices_blocked=_slices_blocked(slots, verdicts))


def _verdict(slot: Slot, host: HostInventory, declarers: dict[str, list[int]]) -> SlotVerdict:
    gpu = host.gpu(slot.gpu_pci)
    namespace = _namespace(slot, host)
    vf = _declared_vf(slot, host)
    own = _own_devices(slot)
    findings = [
        *_gpu_findings(slot, gpu, host),
        *_iommu_findings(gpu, host, own, f"GPU {slot.gpu_pci}"),
        *_iommu_findings(vf, host, own, f"fabric VF {slot.fabric_vf_pci}"),
        *_nvme_findings(slot, namespace, host),
        *_fabric_findings(slot, host, declarers),
    ]
    checks, messages = _merge(findings)
    return SlotVerdict(index=slot.index, state=state_of(checks), checks=checks, messages=messages)


def _merge(findings: Iterable[Finding]) -> tuple[list[SlotCheck], list[str]]:
    """One entry per check code, most severe first; several sentences for one code become one, joined by `; `."""
    sentences: dict[SlotCheck, list[str]] = defaultdict(list)
    for check, sentence in findings:
        if sentence not in sentences[check]:
            sentences[check].append(sentence)
    checks = [check for check in SEVERITY if check in sentences]
    return checks, ["; ".join(sentences[check]) for check in checks]


# --- lookups ---------------------------------------------------------------------------------------------------


def _namespace(slot: Slot, host: HostInventory) -> NvmeNamespace | None:
    if not slot.nvme_device:
        return None
    return next((namespace for namespace in host.nvme if namespace.known_as(slot.nvme_device)), None)


def _declared_vf(slot: Slot, host: HostInventory) -> FabricDevice | None:
    """The slot's VF as the host knows it, only when the slot claims one (a PF at that address is not a VF)."""
    if not _claims_vf(slot):
        return None
    device = host.fabric_device(slot.fabric_vf_pci or "")
    return device if device is not None and device.role is FabricRole.VF else None


def _claims_vf(slot: Slot) -> bool:
    return slot.fabric_claim_mode is FabricClaimMode.PER_SLOT_VF and bool(slot.fabric_vf_pci)


def _own_devices(slot: Slot) -> frozenset[str]:
    """The PCI functions passed through to the slot's VM: they may share an IOMMU group with each other. Not the NVMe
    controller: its namespace is attached as a host block device, so the controller stays on the host's `nvme` driver,
    and VFIO refuses a group holding a device a host driver owns."""
    own = {slot.gpu_pci}
    if slot.fabric_vf_pci:
        own.add(slot.fabric_vf_pci)
    return frozenset(own)


def _function(host: HostInventory, address: str) -> PciFunction | None:
    return host.pci_functions.get(address) or host.gpu(address) or host.fabric_device(address)


def _vf_declarers(slots: Sequence[Slot]) -> dict[str, list[int]]:
    """Which slots name each VF address, whatever their claim mode (as `scheduler.compatibility.vf_usage` counts)."""
    declarers: dict[str, list[int]] = defaultdict(list)
    for slot in slots:
        if slot.fabric_vf_pci:
            declarers[slot.fabric_vf_pci].append(slot.index)
    return declarers


# --- checks, one function per device kind ------------------------------------------------------------------------


def _gpu_findings(slot: Slot, gpu: Gpu | None, host: HostInventory) -> list[Finding]:
    """A missing GPU makes every other GPU check meaningless, so it is the only finding then; one whose sysfs entry
    could not be read is not missing but unreadable, and says so."""
    label = f"GPU {slot.gpu_pci}"
    if gpu is None:
        unreadable = _problem_findings(host, label, [slot.gpu_pci])
        return unreadable or [
            (SlotCheck.GPU_ABSENT, f"{label} is not on this host (no NVIDIA GPU at that PCI address)")
        ]
    findings = _problem_findings(host, label, [gpu.address])
    if gpu.driver != VFIO:
        bound = f"bound to {gpu.driver}" if gpu.driver else "bound to no driver"
        findings.append((SlotCheck.GPU_NOT_VFIO, f"{label} is {bound}, not {VFIO}"))
    return findings + _numa_findings(label, gpu.numa_node, slot)


def _iommu_findings(device: PciFunction | None, host: HostInventory, own: frozenset[str], label: str) -> list[Finding]:
    """Passthrough hands the guest a whole IOMMU group, so every function in it must be the slot's own, a bridge,
    or a vfio-bound (or unbound) sibling function of one of the slot's own devices (the GPU's audio function)."""
    if device is None:
        return []
    if device.iommu_group is None:
        return [(SlotCheck.IOMMU_GROUP_MISSING, f"{label} has no IOMMU group (IOMMU off or not visible)")]
    group = device.iommu_group
    findings = [
        _group_member_finding(member, group, label, host, own) for member in sorted(host.iommu_groups.get(group, []))
    ]
    return [finding for finding in findings if finding is not None]


def _group_member_finding(
    member: str, group: int, label: str, host: HostInventory, own: frozenset[str]
) -> Finding | None:
    """What one other function in the group means: nothing (the slot's own, a bridge, a vfio-bound or unbound sibling
    function), a sibling function the host still drives, or a stranger."""
    function = _function(host, member)
    if member in own or (function is not None and function.is_bridge):
        return None
    if pci_device(member) in {pci_device(address) for address in own}:
        if function is not None and function.driver in (VFIO, None):
            return None
        driver = f"bound to {function.driver}" if function is not None else "of unknown driver"
        return (SlotCheck.IOMMU_GROUP_NOT_VFIO, f"{member} in IOMMU group {group} of {label} is {driver}, not {VFIO}")
    stranger = _describe(member, function)
    return (
        SlotCheck.IOMMU_GROUP_SHARED,
        f"IOMMU group {group} of {label} also holds {stranger}, which is not the slot's",
    )


def _nvme_findings(slot: Slot, namespace: NvmeNamespace | None, host: HostInventory) -> list[Finding]:
    if not slot.nvme_device:
        return []
    if namespace is None:
        return [(SlotCheck.NVME_ABSENT, f"NVMe {slot.nvme_device} is not on this host")]
    label = _nvme_label(slot.nvme_device, namespace)
    devices = [namespace.name, namespace.device_path, *([namespace.controller_pci] if namespace.controller_pci else [])]
    findings = _problem_findings(host, label, devices)
    if namespace.in_use:
        findings.append((SlotCheck.NVME_IN_USE, f"{label} is in use on the host: {', '.join(namespace.in_use)}"))
    siblings = sorted(
        other.name
        for other in host.nvme
        if namespace.controller_pci
        and other.controller_pci == namespace.controller_pci
        and other.name != namespace.name
    )
    if siblings:
        findings.append(
            (
                SlotCheck.NVME_SHARED_CONTROLLER,
                f"{label} shares its controller {namespace.controller_pci} with {', '.join(siblings)}: the wipe's NVMe "
                "format may erase every namespace of the controller",
            )
        )
    return findings + _numa_findings(label, namespace.numa_node, slot)


def _fabric_findings(slot: Slot, host: HostInventory, declarers: dict[str, list[int]]) -> list[Finding]:
    """A slice needs its own VF; a parent device without one is no concurrency approval (docs/seeds.md, "A slice
    needs its own fabric VF")."""
    if not _claims_vf(slot):
        return [(SlotCheck.NO_PER_SLOT_VF, _no_vf_sentence(slot))]
    address = slot.fabric_vf_pci or ""
    label = f"fabric VF {address}"
    others = [index for index in declarers.get(address, []) if index != slot.index]
    twice = [(SlotCheck.VF_DECLARED_TWICE, f"{label} is also declared by {_slots(others)}")] if others else []
    device = host.fabric_device(address)
    if device is None:
        return [(SlotCheck.VF_ABSENT, f"{label} is not on this host"), *twice]
    if device.role is not FabricRole.VF:
        return [(SlotCheck.VF_ABSENT, f"fabric device {address} is a physical function, not a VF"), *twice]
    findings = _problem_findings(host, label, [address])
    if slot.fabric_parent_pci and device.parent != slot.fabric_parent_pci:
        parent = f"belongs to {device.parent}" if device.parent else "has no parent PF"
        findings.append((SlotCheck.VF_NOT_CHILD, f"{label} {parent}, not the declared parent {slot.fabric_parent_pci}"))
    return findings + twice + _numa_findings(label, device.numa_node, slot)


def _problem_findings(host: HostInventory, label: str, devices: Iterable[str]) -> list[Finding]:
    """An unreadable sysfs entry means discovery cannot vouch for the device: the slot is not usable until it can."""
    problems = [problem for device in devices for problem in host.problems_for(device)]
    return [
        (SlotCheck.SYSFS_UNREADABLE, f"sysfs of {label} could not be read ({problem.path}: {problem.message})")
        for problem in problems
    ]


def _numa_findings(label: str, numa_node: int | None, slot: Slot) -> list[Finding]:
    """A NUMA node the firmware does not give (None) is unknown, not a mismatch."""
    if numa_node is None or numa_node == slot.numa_node:
        return []
    return [
        (SlotCheck.NUMA_MISMATCH, f"{label} is on NUMA node {numa_node}, not the slot's NUMA node {slot.numa_node}")
    ]


# --- sentences ------------------------------------------------------------------------------------------------------


def _no_vf_sentence(slot: Slot) -> str:
    on_parent = f" on parent fabric device {slot.fabric_parent_pci}" if slot.fabric_parent_pci else ""
    if slot.fabric_claim_mode is FabricClaimMode.PER_SLOT_VF:
        return f"slot {slot.index} claims a per-slot VF{on_parent} but declares no fabricVfPci"
    return f"slot {slot.index} has fabricClaimMode {slot.fabric_claim_mode}{on_parent}, not per_slot_vf with its own VF"


def _nvme_label(reference: str, namespace: NvmeNamespace) -> str:
    if reference == namespace.device_path:
        return f"NVMe {reference}"
    return f"NVMe {reference} ({namespace.device_path})"


def _describe(address: str, function: PciFunction | None) -> str:
    if function is None:
        return f"{address} (not described by discovery)"
    return f"{address} ({function.driver or 'no driver'}, class {function.class_code})"


def _slots(indices: Sequence[int]) -> str:
    return f"slot {indices[0]}" if len(indices) == 1 else f"slots {_indices(indices)}"


def _indices(indices: Iterable[int]) -> str:
    """`[0, 1, 2, 3, 5]` -> `0-3, 5`: compact, and the same wherever a sentence lists slots."""
    ordered = sorted(set(indices))
    runs: list[list[int]] = []
    for index in ordered:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


# --- the node ---------------------------------------------------------------------------------------------------------


def _slices_blocked(slots: Sequence[Slot], verdicts: Sequence[SlotVerdict]) -> str | None:
    """Slots mapping one parent fabric device with no per-slot VF identity make the node unschedulable for GPU VM
    slices (docs/seeds.md, "A shared parent fabric device blocks slices"); so does a node where no slot is a valid
    bundle but some are raw GPUs."""
    shared = _shared_parents(slots)
    if shared:
        indices = _indices(index for members in shared.values() for index in members)
        plural = "s" if len(shared) > 1 else ""
        parents = "; ".join(f"{parent} by slots {_indices(members)}" for parent, members in sorted(shared.items()))
        return (
            f"slots {indices} share parent fabric device{plural} ({parents}) with no per-slot VF: not schedulable for "
            "GPU VM slices until every slot has fabricClaimMode per_slot_vf and its own VF"
        )
    raw_only = [verdict for verdict in verdicts if verdict.state is ValidationState.RAW_ONLY]
    if raw_only and not any(verdict.state is ValidationState.VALID for verdict in verdicts):
        reasons = ", ".join(sorted({str(verdict.reason) for verdict in raw_only}))
        return (
            f"no slot is a valid slice bundle and slots {_indices(verdict.index for verdict in raw_only)} are raw GPUs "
            f"only ({reasons}): not schedulable for GPU VM slices"
        )
    return None


def _shared_parents(slots: Sequence[Slot]) -> dict[str, list[int]]:
    """Parent fabric devices that two or more slots without their own VF map (docs/seeds.md, "A shared parent
    fabric device blocks slices"). Several slots under one PF, each with its own VF, are fine."""
    by_parent: dict[str, list[int]] = defaultdict(list)
    for slot in slots:
        if slot.fabric_parent_pci and not _claims_vf(slot):
            by_parent[slot.fabric_parent_pci].append(slot.index)
    return {parent: members for parent, members in by_parent.items() if len(members) > 1}
