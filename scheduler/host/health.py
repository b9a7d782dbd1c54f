"""A slot's health: what its host can see of its devices, judged by one pure function.

    agent (agent/host/health.py)            reads, per approved slot, every report interval, in use or not:
                                            the GPU, the fabric VF and the NVMe controller still at their addresses
                                            and bound to vfio-pci; their PCIe AER counters; their links' trained
                                            speed and width against the maximum; Xids where a driver or the guest
                                            saw them; a wipe's failed function-level reset
        -> assess(now, before)              this module: a verdict and reasons a person can read
        -> the agent's report               (`NodeReport.health`, sent when a verdict changes)
        -> the control plane                keeps the worst verdict since the slot's last repair

Verdicts: `healthy`; `degraded` (what runs keeps running, no new work is placed); `failed` (the slot is quarantined
once free, and its allocation's owner is told now); `unknown` (nothing could be read: never taken for healthy).

A GPU bound to vfio-pci is invisible to the host's NVIDIA driver, so a slice host judges it by what PCI itself shows
(AER, the link, presence); Xids come from the guest or, where the host driver holds the GPU, from NVML.

The driver also gives its own advice after an error, its recovery action (NVML's
`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, `nvidia-smi -q`'s `GPU Recovery Action`), and says when a repair waits for
the next GPU reset (`nvmlDeviceGetRepairStatus`: `Channel Repair Pending`, `TPC Repair Pending`). Both are judged
here with everything else (`RECOVERY_POLICY`): what a reset repairs is `degraded`, as a pending row remap is; what
only a reboot or a drain repairs is `failed`, and the slot's verdict asks for its node to be drained.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# A burst of correctable errors between two reports that says the link is marginal (one a minute is noise; DCGM's
# PCIe replay watch uses the same idea). Fatal and non-fatal errors count from one.
CORRECTABLE_BURST = 100


class HealthState(StrEnum):
    HEALTHY = "healthy"
    UNKNOWN = "unknown"
    DEGRADED = "degraded"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def placeable(self) -> bool:
        """Whether new work may be placed on a slot in this state."""
        return self is HealthState.HEALTHY


_RANK = {HealthState.HEALTHY: 0, HealthState.UNKNOWN: 1, HealthState.DEGRADED: 2, HealthState.FAILED: 3}


# Verdicts that stand until the slot is repaired: the control plane keeps them whatever the agent says next.
STICKY = frozenset({HealthState.DEGRADED, HealthState.FAILED})


def worst(*states: HealthState) -> HealthState:
    return max(states, key=lambda s: s.rank, default=HealthState.HEALTHY)


class Bucket(StrEnum):
    """NVIDIA's resolution buckets (immediate action) of the Xid catalog."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"  # reboot the node
    CONTACT_SUPPORT = "CONTACT_SUPPORT"


@dataclass(frozen=True)
class XidPolicy:
    mnemonic: str
    bucket: Bucket
    verdict: HealthState  # Berth's: what the bucket means for placing work on the GPU


# NVIDIA's Xid catalog for Ampere and newer (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid
# Catalog", resolution bucket, immediate action), and its page-retirement notes (Xid 48, 63, 64). The verdict is
# Berth's reading of the bucket: an application's own fault (RESTART_APP) leaves the GPU healthy unless the catalog
# says a reset is pending to repair memory; a reset or a reboot to recover is `failed`, since a passed-through GPU
# can be reset only once free; a reset wanted "when convenient" to activate a remap is `degraded`.
XID_CATALOG: dict[int, XidPolicy] = {
    13: XidPolicy("Graphics engine exception", Bucket.RESTART_APP, HealthState.HEALTHY),
    31: XidPolicy("GPU memory page fault", Bucket.RESTART_APP, HealthState.HEALTHY),
    43: XidPolicy("GPU stopped processing", Bucket.RESTART_APP, HealthState.HEALTHY),
    45: XidPolicy("Preemptive cleanup, due to previous errors", Bucket.IGNORE, HealthState.HEALTHY),
    48: XidPolicy("Double bit ECC error", Bucket.RESET_GPU, HealthState.FAILED),
    61: XidPolicy("Internal micro-controller breakpoint/warning", Bucket.RESET_GPU, HealthState.FAILED),
    62: XidPolicy("Internal micro-controller halt", Bucket.RESET_GPU, HealthState.FAILED),
    63: XidPolicy("ECC page retirement or row remapping recording event", Bucket.RESET_GPU, HealthState.DEGRADED),
    64: XidPolicy("ECC page retirement or row remapper recording failure", Bucket.RESET_GPU, HealthState.FAILED),
    74: XidPolicy("NVLink error", Bucket.RESET_GPU, HealthState.FAILED),
    79: XidPolicy("GPU has fallen off the bus", Bucket.RESTART_BM, HealthState.FAILED),
    92: XidPolicy("High single-bit ECC error rate", Bucket.CONTACT_SUPPORT, HealthState.DEGRADED),
    94: XidPolicy("Contained ECC error", Bucket.RESTART_APP, HealthState.DEGRADED),
    95: XidPolicy("Uncontained ECC error", Bucket.RESET_GPU, HealthState.FAILED),
    119: XidPolicy("GSP RPC timeout", Bucket.RESET_GPU, HealthState.FAILED),
    120: XidPolicy("GSP error", Bucket.RESET_GPU, HealthState.FAILED),
}


class RecoveryAction(StrEnum):
    """The driver's recommended action after an error (NVIDIA, "GPU Memory Error Management", error recovery and
    response flags; nvml.h `nvmlDeviceGpuRecoveryAction_t`), by the name `berth nodes get` shows."""

    NONE = "none"
    GPU_RESET = "GPU reset"
    NODE_REBOOT = "node reboot"
    DRAIN_P2P = "drain peer-to-peer"
    DRAIN_AND_RESET = "drain and reset"


# nvml.h's values of the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.
NVML_RECOVERY_ACTIONS = {
    0: RecoveryAction.NONE,
    1: RecoveryAction.GPU_RESET,
    2: RecoveryAction.NODE_REBOOT,
    3: RecoveryAction.DRAIN_P2P,
    4: RecoveryAction.DRAIN_AND_RESET,
}


@dataclass(frozen=True)
class RecoveryPolicy:
    verdict: HealthState
    drain_node: bool  # the node must be drained: what the driver asks for touches more than this slot's GPU
    why: str


# Berth's reading of each action, from NVIDIA's description of it. A reset is what a wipe does to a free slot (its
# function-level reset), so what a reset repairs is `degraded`, as a pending row remap is: running work may go on,
# nothing new is placed. Peer-to-peer traffic to drain is the same until the driver names the action that follows.
# A reboot (the OS may be inconsistent) or a drain and reset (the GPU runs at reduced capacity) is more than a wipe
# can do: `failed`, and the node is to be drained.
RECOVERY_POLICY: dict[RecoveryAction, RecoveryPolicy] = {
    RecoveryAction.GPU_RESET: RecoveryPolicy(HealthState.DEGRADED, False, "a GPU reset repairs it"),
    RecoveryAction.DRAIN_P2P: RecoveryPolicy(
        HealthState.DEGRADED, False, "its peer-to-peer traffic must stop before the driver names the next action"
    ),
    RecoveryAction.NODE_REBOOT: RecoveryPolicy(
        HealthState.FAILED, True, "the OS may be inconsistent until the node reboots"
    ),
    RecoveryAction.DRAIN_AND_RESET: RecoveryPolicy(
        HealthState.FAILED, True, "it runs at reduced capacity until drained and reset"
    ),
}


class NvmeWarning(IntEnum):
    """The NVMe SMART/Health log's Critical Warning bits (NVM Express Base Specification, Get Log Page 02h)."""

    SPARE_BELOW_THRESHOLD = 0
    TEMPERATURE = 1
    RELIABILITY_DEGRADED = 2
    READ_ONLY = 3
    VOLATILE_BACKUP_FAILED = 4


_NVME_FAILED = {NvmeWarning.RELIABILITY_DEGRADED, NvmeWarning.READ_ONLY, NvmeWarning.VOLATILE_BACKUP_FAILED}


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PcieSignals(Model):
    """One PCI function as sysfs shows it now (Linux: sysfs-bus-pci, sysfs-bus-pci-devices-aer_stats)."""

    address: str = Field(max_length=16)
    present: bool
    driver: str | None = Field(default=None, max_length=64)
    aer_fatal: int | None = Field(default=None, ge=0)  # TOTAL_ERR_FATAL of aer_dev_fatal
    aer_nonfatal: int | None = Field(default=None, ge=0)  # TOTAL_ERR_NONFATAL of aer_dev_nonfatal
    aer_correctable: int | None = Field(default=None, ge=0)  # TOTAL_ERR_COR of aer_dev_correctable
    link_speed: float | None = Field(default=None, ge=0)  # GT/s, current_link_speed
    max_link_speed: float | None = Field(default=None, ge=0)
    link_width: int | None = Field(default=None, ge=0)  # lanes, current_link_width
    max_link_width: int | None = Field(default=None, ge=0)


class DriverSignals(Model):
    """What an NVIDIA driver says of the slot's GPU: the guest's, while a slice holds it (`nvidia-smi -q` and the
    kernel's Xid lines through the QEMU guest agent; agent/libvirt/guest_health.py), or the host's where it holds the
    GPU (NVML: Xid events, remapped rows, retired pages, ECC counts; agent/host/nvml_health.py). `answered` False: no
    guest agent, an image that refuses it, no `nvidia-smi`: the GPU's health inside is unknown, never healthy."""

    via: Literal["nvidia-smi -q", "NVML"] = "nvidia-smi -q"
    answered: bool
    detail: str | None = Field(default=None, max_length=512)  # why it did not answer
    # The VM holding the GPU is not running (its QEMU killed, a crash, a poweroff inside): the allocation lost its
    # GPUs whatever their own health, which is what its replacement path is for.
    vm_stopped: str | None = Field(default=None, max_length=512)
    lost: bool = False  # the guest's driver lost the GPU (nvidia-smi: "GPU is lost"), Xid 79's face inside
    xids: list[int] = Field(default_factory=list, max_length=64)  # the guest's kernel log since boot, NVML's events
    ecc_uncorrectable: int | None = Field(default=None, ge=0)  # volatile uncorrectable (double-bit, DRAM) count
    remap_pending: bool | None = None  # Remapped Rows: Pending (a reset applies the remap)
    remap_failed: bool | None = None  # Remapped Rows: Remapping Failure Occurred
    retirement_pending: bool | None = None  # Retired Pages: Pending Page Blacklist / Retirement (pre-Ampere)
    recovery_action: RecoveryAction | None = None  # GPU Recovery Action (None: a driver that does not say)
    channel_repair_pending: bool | None = None  # ECC Errors: Channel Repair Pending (a reset applies it)
    tpc_repair_pending: bool | None = None  # ECC Errors: TPC Repair Pending (a reset applies it)


class SlotSignals(Model):
    """Everything read of one slot's devices in one report interval."""

    index: int = Field(ge=0)
    gpu: PcieSignals | None = None
    fabric: PcieSignals | None = None  # the per-slot VF, where the slot has one
    nvme: PcieSignals | None = None  # the NVMe controller's function
    nvme_critical_warning: int | None = Field(default=None, ge=0, le=255)
    xids: list[int] = Field(default_factory=list, max_length=64)  # seen since the last report (guest or NVML)
    wipe_failed: str | None = Field(default=None, max_length=512)  # a function-level reset that failed, and why
    guest: DriverSignals | None = None  # the guest's view of the GPU, while a slice holds the slot
    nvml: DriverSignals | None = None  # the host driver's view, where it holds the GPU


class SlotHealth(Model):
    """A slot's verdict and why, most severe reason first, with the signals it was judged on (`describe`): what
    `berth nodes get` shows of each slot."""

    index: int = Field(ge=0)
    state: HealthState
    reasons: list[str] = Field(default_factory=list, max_length=32)
    signals: dict[str, str] = Field(default_factory=dict, max_length=16)
    # The driver's advice, by name, where it advised anything but none, and whether it means the node is to be drained.
    recovery_action: RecoveryAction | None = None
    drain_node: bool = False
    # Whether a degraded or failed verdict stands until the slot is repaired (a device's fault), or ends with its
    # cause: a stopped VM fails the slot's allocation, not the GPU, and the slot serves again after its teardown.
    lasting: bool = True

    @property
    def reason(self) -> str | None:
        return self.reasons[0] if self.reasons else None

    @property
    def verdict(self) -> tuple[int, HealthState, tuple[str, ...]]:
        """What a change is judged by: the signals' values move all the time (a counter ticks), the verdict rarely."""
        return self.index, self.state, tuple(self.reasons)


def describe(now: SlotSignals) -> dict[str, str]:
    """Each signal's last value, as a person reads it: one line per device or source."""
    lines: dict[str, str] = {}
    for role, signals in (("gpu", now.gpu), ("fabric", now.fabric), ("nvme", now.nvme)):
        if signals is not None:
            lines[role] = _device_line(signals)
    if now.nvme_critical_warning is not None:
        lines["nvme smart"] = f"critical warning {now.nvme_critical_warning:#04x}"
    for source, driver in (("guest", now.guest), ("nvml", now.nvml)):
        if driver is not None:
            lines[source] = _driver_line(driver)
    if now.xids:
        lines["xids"] = ", ".join(str(x) for x in sorted(set(now.xids)))
    if now.wipe_failed:
        lines["wipe"] = f"reset failed: {now.wipe_failed}"[:512]
    return lines


def _device_line(s: PcieSignals) -> str:
    if not s.present:
        return f"{s.address} not on the PCI bus"
    aer = "/".join("?" if v is None else str(v) for v in (s.aer_fatal, s.aer_nonfatal, s.aer_correctable))
    return (
        f"{s.address} on {s.driver or 'no driver'}, AER fatal/non-fatal/correctable {aer}, link "
        f"{_link(s.link_speed, s.link_width)} of {_link(s.max_link_speed, s.max_link_width)}"
    )


def _driver_line(d: DriverSignals) -> str:
    if d.vm_stopped:
        return f"VM stopped ({d.vm_stopped})"[:512]
    if not d.answered:
        return f"no answer ({d.detail or 'no reply'})"[:512]
    facts = ["GPU lost" if d.lost else "GPU present"]
    facts.append(f"Xids {', '.join(str(x) for x in d.xids)}" if d.xids else "no Xids")
    for name, value in (
        ("uncorrectable ECC", d.ecc_uncorrectable),
        ("remap pending", d.remap_pending),
        ("remap failed", d.remap_failed),
        ("retirement pending", d.retirement_pending),
        ("channel repair pending", d.channel_repair_pending),
        ("TPC repair pending", d.tpc_repair_pending),
        ("recovery action", d.recovery_action),
    ):
        if value is not None:
            facts.append(f"{name} {'yes' if value is True else 'no' if value is False else value}")
    return f"{d.via}: " + ", ".join(facts)


def assess(now: SlotSignals, before: SlotSignals | None = None) -> SlotHealth:
    """The slot's verdict from this interval's signals; counters are judged by how far they rose since `before`
    (the previous interval's reading of the same slot), so a counter that merely stands high is not news."""
    found: list[tuple[HealthState, str]] = []
    for role, signals, previous in (
        ("GPU", now.gpu, before.gpu if before else None),
        ("fabric VF", now.fabric, before.fabric if before else None),
        ("NVMe controller", now.nvme, before.nvme if before else None),
    ):
        if signals is not None:
            found.extend(_pcie(role, signals, previous))
    if now.nvme_critical_warning:
        found.extend(_nvme_warning(now.nvme_critical_warning))
    drivers = [(now.guest, before.guest if before else None), (now.nvml, before.nvml if before else None)]
    xids = set(now.xids)
    advised: list[RecoveryAction] = []
    for driver, previous in drivers:
        if driver is not None:
            found.extend(_driver(driver, previous))
            xids.update(driver.xids)
            if driver.answered and driver.recovery_action not in (None, RecoveryAction.NONE):
                advised.append(driver.recovery_action)
    for xid in sorted(xids):
        policy = XID_CATALOG.get(xid)
        if policy is None:
            found.append((HealthState.DEGRADED, f"Xid {xid}, not in NVIDIA's catalog: held from new work"))
        elif policy.verdict is not HealthState.HEALTHY:
            found.append((policy.verdict, f"Xid {xid} ({policy.mnemonic}): NVIDIA says {policy.bucket.value}"))
    if now.wipe_failed:
        found.append((HealthState.FAILED, f"the wipe's function-level reset failed: {now.wipe_failed}"))
    if now.gpu is None:
        found.append((HealthState.UNKNOWN, "the GPU's PCI function could not be read"))
    lasting = any(state in STICKY for state, _ in found)  # the devices' own verdicts stand until a repair
    if now.guest is not None and now.guest.vm_stopped:
        found.append((HealthState.FAILED, f"the VM holding the GPU stopped: {now.guest.vm_stopped}"))
    found.sort(key=lambda pair: -pair[0].rank)
    # The weightiest advice, when the guest's and the host's drivers give different ones.
    action = max(advised, key=lambda a: (RECOVERY_POLICY[a].drain_node, RECOVERY_POLICY[a].verdict.rank), default=None)
    drain = action is not None and RECOVERY_POLICY[action].drain_node
    return SlotHealth(
        index=now.index,
        state=worst(*(state for state, _ in found)),
        reasons=[reason for _, reason in found],
        signals=describe(now),
        recovery_action=action,
        drain_node=drain,
        lasting=lasting or not (now.guest is not None and now.guest.vm_stopped),
    )


def _pcie(role: str, now: PcieSignals, before: PcieSignals | None) -> list[tuple[HealthState, str]]:
    if not now.present:
        if before is not None and before.present:  # it fell off the bus: Xid 79's host-side face
            return [(HealthState.FAILED, f"the {role} {now.address} is gone from the PCI bus")]
        # Never seen by this agent: a slot approved for a GPU the host does not have is validation's (`gpu_absent`),
        # not a failure; unknown, so never taken for healthy.
        return [(HealthState.UNKNOWN, f"the {role} {now.address} is not on the PCI bus")]
    found: list[tuple[HealthState, str]] = []  # its binding is validation's (scheduler/host/validate.py)
    rises = (
        ("aer_fatal", "fatal", 1, HealthState.FAILED),
        ("aer_nonfatal", "non-fatal", 1, HealthState.DEGRADED),
        ("aer_correctable", "correctable", CORRECTABLE_BURST, HealthState.DEGRADED),
    )
    for field, words, at_least, state in rises:
        rise = _rise(getattr(now, field), getattr(before, field) if before else None)
        if rise >= at_least:
            found.append(
                (state, f"the {role} {now.address} logged {rise} {words} PCIe errors (AER) since the last report")
            )
    if _below(now.link_speed, now.max_link_speed) or _below(now.link_width, now.max_link_width):
        found.append(
            (
                HealthState.DEGRADED,
                f"the {role} {now.address}'s link trained at {_link(now.link_speed, now.link_width)}, "
                f"below its {_link(now.max_link_speed, now.max_link_width)}",
            )
        )
    return found


def _driver(now: DriverSignals, before: DriverSignals | None) -> list[tuple[HealthState, str]]:
    via, who = now.via, "guest" if now.via == "nvidia-smi -q" else "host"
    if now.vm_stopped:
        return []  # not the driver's word on the GPU: `assess` judges the stopped VM on its own
    if not now.answered:
        return [
            (
                HealthState.UNKNOWN,
                f"the {who} driver did not answer for the GPU ({now.detail or 'no reply'}): its health is unknown",
            )
        ]
    found: list[tuple[HealthState, str]] = []
    if now.lost:
        found.append((HealthState.FAILED, f"the {who}'s driver lost the GPU ({via}: GPU is lost)"))
    if now.remap_failed:
        found.append((HealthState.FAILED, f"the GPU's row remapping failed ({via}): NVIDIA says CONTACT_SUPPORT"))
    if now.remap_pending:
        found.append((HealthState.DEGRADED, f"a row remap of the GPU's memory waits for a GPU reset ({via})"))
    if now.retirement_pending:
        found.append((HealthState.DEGRADED, f"a retired page of the GPU's memory waits for a GPU reset ({via})"))
    for what, pending in (("channel", now.channel_repair_pending), ("TPC", now.tpc_repair_pending)):
        if pending:
            found.append((HealthState.DEGRADED, f"a {what} repair of the GPU waits for a GPU reset ({via})"))
    policy = RECOVERY_POLICY.get(now.recovery_action) if now.recovery_action is not None else None
    if policy is not None:
        drain = ": drain the node" if policy.drain_node else ""
        found.append(
            (
                policy.verdict,
                f"the {who} driver's recovery action is {now.recovery_action.value} ({via}): {policy.why}{drain}",
            )
        )
    rise = _rise(now.ecc_uncorrectable, before.ecc_uncorrectable if before else 0)
    if rise:
        found.append((HealthState.DEGRADED, f"the GPU logged {rise} uncorrectable ECC errors ({via})"))
    return found


def _nvme_warning(bits: int) -> list[tuple[HealthState, str]]:
    found = []
    for warning in NvmeWarning:
        if bits & (1 << warning.value):
            state = HealthState.FAILED if warning in _NVME_FAILED else HealthState.DEGRADED
            found.append((state, f"the NVMe reports a critical warning: {warning.name.lower().replace('_', ' ')}"))
    return found


def _rise(now: int | None, before: int | None) -> int:
    """How far a counter rose; a counter that went down was reset (a reboot, a driver rebind): no news."""
    if now is None or before is None or now < before:
        return 0
    return now - before


def _below(value: float | None, maximum: float | None) -> bool:
    return value is not None and maximum is not None and value < maximum


def _link(speed: float | None, width: int | None) -> str:
    return f"{speed if speed is not None else '?'} GT/s x{width if width is not None else '?'}"
