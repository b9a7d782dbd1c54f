"""What a guest's NVIDIA driver says of its GPUs, parsed from the text of two commands run inside it:

    nvidia-smi -q     per GPU ("GPU 00000000:06:00.0"), the health fields of its query report: ECC Errors >
                      Volatile (`DRAM Uncorrectable`, or `Double Bit` > `Total` before Ampere), Remapped Rows
                      (`Pending`, `Remapping Failure Occurred`), Retired Pages (`Pending Page Blacklist`), ECC
                      Errors > `Channel Repair Pending` / `TPC Repair Pending`, and `GPU Recovery Action` (driver
                      570 and newer); or "GPU is lost" when the driver lost one (exit code 15)
    dmesg             the kernel's Xid lines, "NVRM: Xid (PCI:0000:06:00): 79, pid=..., GPU has fallen off the bus."
                      (NVIDIA, "Xid Errors"): all of them since the guest booted, which is this allocation's life

The guest's GPUs in PCI order are the plan's bundles in order (agent/libvirt/domain.py pins bundle i's GPU on root
port 2i+1, so the guest's firmware enumerates them in plan order). How the commands reach the guest is the VM
runtime's: agent/libvirt/guest_health.py through the QEMU guest agent, agent/simulated.py from recorded outputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scheduler.host.health import DriverSignals, RecoveryAction

NVIDIA_SMI_Q = ["nvidia-smi", "-q"]
KERNEL_LOG = ["dmesg"]

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\s*$")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?\): (\d+)")
_LOST = re.compile(r"GPU is lost", re.IGNORECASE)


@dataclass(frozen=True)
class Exited:
    """A command's outcome once it exited."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""


@dataclass(frozen=True)
class _Gpu:
    bus: tuple[int, int, int]  # (domain, bus, device)
    fields: dict[str, str]  # "Section > Sub > Key" -> value


def parse_nvidia_smi_q(text: str) -> list[_Gpu]:
    """Every GPU section of `nvidia-smi -q`, its keys flattened by their indentation ("Remapped Rows > Pending")."""
    gpus: list[_Gpu] = []
    path: list[tuple[int, str]] = []
    for line in text.splitlines():
        header = _GPU_HEADER.match(line)
        if header:
            domain, bus, device, _ = (int(part, 16) for part in header.groups())
            gpus.append(_Gpu((domain, bus, device), {}))
            path = []
            continue
        if not gpus or not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, colon, value = line.strip().partition(":")
        while path and path[-1][0] >= indent:
            path.pop()
        if colon and value.strip():
            gpus[-1].fields[" > ".join([*(name for _, name in path), key.strip()])] = value.strip()
        else:
            path.append((indent, key.strip()))
    return sorted(gpus, key=lambda gpu: gpu.bus)


def parse_xids(kernel_log: str) -> dict[tuple[int, int, int], list[int]]:
    """The Xids of each GPU (domain, bus, device) in the kernel's log, in order."""
    found: dict[tuple[int, int, int], list[int]] = {}
    for match in _XID.finditer(kernel_log):
        domain, bus, device = (int(part, 16) for part in match.groups()[:3])
        found.setdefault((domain, bus, device), []).append(int(match.group(4)))
    return found


def guest_signals(nvidia_smi: Exited, kernel_log: Exited | None, gpus: int) -> list[DriverSignals]:
    """One reading per GPU of the plan, in plan order, from the two commands' outcomes."""
    xids = parse_xids(kernel_log.stdout) if kernel_log is not None and kernel_log.exit_code == 0 else {}
    if nvidia_smi.exit_code != 0:
        said = (nvidia_smi.stderr or nvidia_smi.stdout).strip()
        if _LOST.search(said):
            all_xids = sorted({x for seen in xids.values() for x in seen})
            return [DriverSignals(answered=True, lost=True, xids=all_xids) for _ in range(gpus)]
        detail = said.splitlines()[-1][:200] if said else f"exit {nvidia_smi.exit_code}"
        return [DriverSignals(answered=False, detail=f"nvidia-smi -q failed: {detail}") for _ in range(gpus)]
    seen = parse_nvidia_smi_q(nvidia_smi.stdout)
    readings = []
    for position in range(gpus):
        if position >= len(seen):
            readings.append(DriverSignals(answered=False, detail=f"nvidia-smi -q lists {len(seen)} of {gpus} GPUs"))
            continue
        gpu = seen[position]
        readings.append(
            DriverSignals(
                answered=True,
                xids=sorted(set(xids.get(gpu.bus, []))),
                ecc_uncorrectable=_count(
                    gpu, "ECC Errors > Volatile > DRAM Uncorrectable", "ECC Errors > Volatile > Double Bit > Total"
                ),
                remap_pending=_yes(gpu, "Remapped Rows > Pending"),
                remap_failed=_yes(gpu, "Remapped Rows > Remapping Failure Occurred"),
                retirement_pending=_yes(
                    gpu, "Retired Pages > Pending Page Blacklist", "Retired Pages > Pending Page Retirement"
                ),
                channel_repair_pending=_yes(gpu, "ECC Errors > Channel Repair Pending"),
                tpc_repair_pending=_yes(gpu, "ECC Errors > TPC Repair Pending"),
                recovery_action=_recovery_action(_value(gpu, "GPU Recovery Action")),
            )
        )
    return readings


def _value(gpu: _Gpu, *keys: str) -> str | None:
    return next((gpu.fields[key] for key in keys if key in gpu.fields), None)


def _yes(gpu: _Gpu, *keys: str) -> bool | None:
    value = _value(gpu, *keys)
    return None if value is None or value == "N/A" else value.lower() == "yes"


def _recovery_action(value: str | None) -> RecoveryAction | None:
    """driver 580 prints `None` (recorded on an H200); the other actions by NVIDIA's names for them (Reset, Reboot,
    Drain P2P, Drain and Reset, in its GPU memory error management guide), read by their words, so "GPU Reset
    Required" or "Node Reboot Required" read the same. `N/A` or an older driver's silence: no advice."""
    words = (value or "").lower()
    if not words or words == "n/a":
        return None
    if words == "none":
        return RecoveryAction.NONE
    if "drain" in words:
        return RecoveryAction.DRAIN_AND_RESET if "reset" in words else RecoveryAction.DRAIN_P2P
    if "reboot" in words:
        return RecoveryAction.NODE_REBOOT
    if "reset" in words:
        return RecoveryAction.GPU_RESET
    return None


def _count(gpu: _Gpu, *keys: str) -> int | None:
    value = _value(gpu, *keys)
    return int(value) if value is not None and value.isdigit() else None
