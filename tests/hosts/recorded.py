"""A real machine's recordings, made usable: its `/`-shaped tree as a discovery root, and its NVML answers as the
`pynvml` binding Berth's NVML readers call.

    tests/hosts/recorded/h200-guest-2026-11-27/     one NVIDIA H200 passed through to a virtual machine, recorded
                                                    inside it (its README says what each file is and what a guest
                                                    cannot show)

`host_root` copies the tree and recreates the symlinks the recording listed in `tree/links.json` (a recording
cannot keep them): `sys/bus/pci/devices/<addr>`, the function's `driver`, its `subsystem`, the NUMA node's CPUs and
memory blocks. Each link's target is a directory in sysfs; where the recording did not copy it (the driver's
directory, `sys/devices/system/cpu/cpu0`), an empty directory stands in for it, so the link resolves as on the
machine. Entries the recording could not read (`unreadable: ...`) are left out, as they were.

`RecordedPynvml` answers as `pynvml` does, from `nvml_raw.json` (each call's value, or the NVML error it raised) and
`costs.json` (the repair status and the recovery-action field, read on the same machine), one handle per recorded GPU.
`changes` replaces recorded values in this copy only, to put a GPU into an error state the recording did not catch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RECORDINGS = Path(__file__).parent / "recorded"
H200_GUEST = RECORDINGS / "h200-guest-2026-11-27"


def host_root(destination: Path, recording: Path = H200_GUEST) -> Path:
    """The recorded tree under `destination`, its symlinks recreated: a root discovery reads as it reads `/`."""
    root = destination / recording.name
    shutil.copytree(recording / "tree", root, ignore=shutil.ignore_patterns("links.json"))
    links = json.loads((recording / "tree" / "links.json").read_text())
    for path, target in sorted(links.items()):
        if target.startswith("unreadable:"):
            continue
        link = root / path.lstrip("/")
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)  # the recording copied what the link led to; the link itself leads there again
        link.parent.mkdir(parents=True, exist_ok=True)
        (link.parent / target).resolve().mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    return root


def nvidia_smi_q(recording: Path = H200_GUEST) -> str:
    return (recording / "nvidia-smi-q.txt").read_text()


# nvml.h's values for the constants the readers pass; pynvml defines the same names.
NVML_SUCCESS = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_FUNCTION_NOT_FOUND = 3, 10, 15, 13


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801
    pass


_ERRORS = {
    cls.__name__: cls
    for cls in (NVMLError_NotSupported, NVMLError_Timeout, NVMLError_GpuIsLost, NVMLError_FunctionNotFound)
}


class RecordedPynvml:
    """The recorded machine's NVML as `pynvml` answers: every call the health and detail readers make."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVML_SUCCESS = NVML_SUCCESS
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    nvmlEventTypeXidCriticalError = 0x0000000000000008

    def __init__(self, recording: Path = H200_GUEST, changes: dict[str, Any] | None = None) -> None:
        raw = json.loads((recording / "nvml_raw.json").read_text())
        costs = json.loads((recording / "costs.json").read_text())
        self.gpus: list[dict[str, Any]] = []
        for gpu in raw["gpus"]:
            answers = dict(gpu)
            # Read once on the machine, which had one GPU: its repair status and its recovery-action field value
            # as (NVML return, value).
            answers["repair_status"] = costs["nvmlDeviceGetRepairStatus"]
            answers["recovery_action"] = costs["field_recovery_action"][0]
            answers.update(changes or {})
            self.gpus.append(answers)

    # --- the binding's calls -------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        return object()

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, events: object) -> None:  # noqa: N802
        self._answer(handle, "xid_register")

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> Any:  # noqa: N802
        # One event set for every GPU: the recorded wait timed out (no Xid), as it does on each of them.
        for handle in range(len(self.gpus)):
            self._answer(handle, "xid_wait")
        raise NVMLError_Timeout("Timeout")

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(**self._answer(handle, "pci"))

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self._answer(handle, "name")

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(**self._answer(handle, "memory"))

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:  # noqa: N802
        return tuple(self._answer(handle, "remapped_rows"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:  # noqa: N802
        return self._answer(handle, "retired_pending")

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:  # noqa: N802
        kind = "uncorrected" if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        return self._answer(handle, f"ecc_{'volatile' if counter == NVML_VOLATILE_ECC else 'aggregate'}_{kind}")

    def nvmlDeviceGetRepairStatus(self, handle: int) -> list[int]:  # noqa: N802
        return list(self._answer(handle, "repair_status"))

    def nvmlDeviceGetFieldValues(self, handle: int, fields: list[int]) -> list[Any]:  # noqa: N802
        answers = []
        for field in fields:
            if field != NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                raise NVMLError_NotSupported(f"field {field} was not recorded")
            status, value = self._answer(handle, "recovery_action")
            answers.append(SimpleNamespace(fieldId=field, nvmlReturn=status, value=SimpleNamespace(uiVal=value)))
        return answers

    def _answer(self, handle: int, call: str) -> Any:
        gpu = self.gpus[handle]
        if gpu.get("lost"):
            raise NVMLError_GpuIsLost("GPU is lost")
        value = gpu[call]
        if isinstance(value, dict) and "error" in value:
            raise _ERRORS.get(value["error"], NVMLError)(value.get("str", value["error"]))
        return value
