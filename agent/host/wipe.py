"""Wiping a slot on release, before it is free again (docs/seeds.md, "Wiping a slot before reuse"), as Ironic
cleans disks:

    NVMe:  `nvme id-ctrl <dev> -o json`: Format NVM supported (OACS bit 1)?
              crypto erase supported (FNA bit 2)?  -> `nvme format <dev> --ses=2 --force`   (crypto erase)
              otherwise                            -> `nvme format <dev> --ses=1 --force`   (user-data erase)
           no Format NVM                           -> `blkdiscard --force <dev>`           (discard the whole device)
    GPU:   a function-level reset through sysfs: write 1 to /sys/bus/pci/devices/<gpu>/reset

Every command goes through a `HostRunner`, so tests see exactly what ran (`RecordingRunner`) and a host runs it for
real (`SubprocessRunner`). A slot whose wipe fails is reported, never silently returned: the agent fails the
teardown with `WipeFailed`, and the workflow quarantines the slots with the reason until a wipe succeeds.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from fleet.node import Slot

OACS_FORMAT_NVM = 1 << 1  # Optional Admin Command Support: Format NVM
FNA_CRYPTO_ERASE = 1 << 2  # Format NVM Attributes: cryptographic erase supported


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str = ""
    stderr: str = ""


class HostRunner(Protocol):
    def run(self, argv: Sequence[str], timeout: float = 600.0) -> Ran: ...

    def write(self, path: Path, value: str) -> None:
        """Write a sysfs attribute; raises OSError when the kernel refuses."""
        ...


class SubprocessRunner:
    def __init__(self, sysfs_root: Path = Path("/")) -> None:
        self.root = sysfs_root

    def run(self, argv: Sequence[str], timeout: float = 600.0) -> Ran:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return Ran(exit_code=-1, stderr=str(error))
        return Ran(done.returncode, done.stdout, done.stderr)

    def write(self, path: Path, value: str) -> None:
        (self.root / path.relative_to("/")).write_text(value)


@dataclass
class RecordingRunner:
    """For tests: records every command and write, answers from scripted results keyed by the command line."""

    results: dict[str, Ran] = field(default_factory=dict)
    refused_writes: set[str] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    def run(self, argv: Sequence[str], timeout: float = 600.0) -> Ran:
        line = " ".join(argv)
        self.log.append(line)
        return self.results.get(line, Ran(0))

    def write(self, path: Path, value: str) -> None:
        self.log.append(f"write {value} > {path}")
        if str(path) in self.refused_writes:
            raise OSError(f"[Errno 25] Inappropriate ioctl for device: '{path}'")


class SlotWipe(BaseModel):
    """How one slot was wiped, or why it could not be."""

    model_config = ConfigDict(frozen=True)

    index: int
    nvme_method: str | None = None  # crypto_erase, user_data_erase, discard; None when the slot has no NVMe
    gpu_reset: bool = False
    error: str | None = None
    reset_error: str | None = None  # the GPU's function-level reset failed: a health signal too

    @property
    def ok(self) -> bool:
        return self.error is None


def wipe_slot(slot: Slot, runner: HostRunner) -> SlotWipe:
    method: str | None = None
    if slot.nvme_device is not None:
        method, error = _erase_nvme(slot.nvme_device, runner)
        if error is not None:
            return SlotWipe(index=slot.index, nvme_method=method, error=error)
    reset = Path("/sys/bus/pci/devices") / slot.gpu_pci / "reset"
    try:
        runner.write(reset, "1")
    except OSError as error:
        failed = f"GPU {slot.gpu_pci} reset failed: {error}"
        return SlotWipe(index=slot.index, nvme_method=method, error=failed, reset_error=failed)
    return SlotWipe(index=slot.index, nvme_method=method, gpu_reset=True)


def _erase_nvme(device: str, runner: HostRunner) -> tuple[str | None, str | None]:
    """(method, error): the strongest erase the controller offers, as Ironic chooses it."""
    identify = runner.run(["nvme", "id-ctrl", device, "-o", "json"], timeout=30)
    if identify.exit_code != 0:
        return None, f"NVMe {device}: nvme id-ctrl failed: {_last(identify)}"
    try:
        controller = json.loads(identify.stdout)
        oacs, fna = int(controller.get("oacs", 0)), int(controller.get("fna", 0))
    except (ValueError, TypeError, AttributeError):
        return None, f"NVMe {device}: nvme id-ctrl gave no readable JSON"
    if oacs & OACS_FORMAT_NVM:
        method, ses = ("crypto_erase", "2") if fna & FNA_CRYPTO_ERASE else ("user_data_erase", "1")
        ran = runner.run(["nvme", "format", device, f"--ses={ses}", "--force"])
    else:
        method, ran = "discard", runner.run(["blkdiscard", "--force", device])
    if ran.exit_code != 0:
        return method, f"NVMe {device}: {method.replace('_', ' ')} failed: {_last(ran)}"
    return method, None


def _last(ran: Ran) -> str:
    text = (ran.stderr or ran.stdout).strip()
    return text.splitlines()[-1] if text else f"exit {ran.exit_code}"
