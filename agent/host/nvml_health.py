"""The host driver's view of the GPUs it holds: a GPU bound to vfio-pci is invisible to NVML, so this only
ever speaks for GPUs on the `nvidia` driver (bare metal between tenants, a host not used for slices, a GPU not yet
handed to vfio-pci). Read at each look of the agent, through NVML (nvidia-ml-py):

    nvmlEventSetCreate, nvmlDeviceRegisterEvents(XidCriticalError)    once; each look drains the set without waiting
    nvmlEventSetWait_v2(set, 0)                                       (NVML_ERROR_TIMEOUT: nothing more); eventData
                                                                      is the Xid
    nvmlDeviceGetRemappedRows -> (correctable, uncorrectable,         Ampere and newer (NOT_SUPPORTED before)
                                  pending, failure occurred)
    nvmlDeviceGetRetiredPagesPendingStatus                            before Ampere (NOT_SUPPORTED after)
    nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)                double-bit / DRAM uncorrectable since load
    nvmlDeviceGetRepairStatus -> [channel, TPC repair pending]        driver 575 and newer
    nvmlDeviceGetFieldValues([NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])   the driver's recovery action (0 none, 1 GPU
                                                                      reset, 2 node reboot, 3 drain P2P, 4 drain and
                                                                      reset); older drivers answer NOT_SUPPORTED
    NVML_ERROR_GPU_IS_LOST on any call                                the GPU fell off the bus (Xid 79)

`RecordedNvml` replays a recorded sequence of such readings (tests/hosts/nvml/), one per look, for hosts that have no
NVIDIA GPU; its README says where the sequences' shape comes from. `PynvmlHealth` takes the NVML binding as an
argument, so tests run it unchanged over a recorded machine's NVML answers (tests/hosts/recorded.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from contracts.pci import normalise_pci
from scheduler.host.health import NVML_RECOVERY_ACTIONS, DriverSignals


class NvmlHealth(Protocol):
    def read(self) -> dict[str, DriverSignals]:
        """Normalised PCI address (`0000:3c:00.0`) -> this look's reading, for every GPU the host driver holds.
        Never raises: no driver or no NVML is an empty answer."""
        ...


class PynvmlHealth:
    """NVML itself. Initialised once, on the first look that finds it; the event set lives as long as the agent."""

    def __init__(self, library: Any | None = None) -> None:
        self._library = library  # the `pynvml` module, or what answers as it; None: import it on the first look
        self._nvml: Any | None = None
        self._events: Any | None = None
        self._handles: dict[str, Any] = {}

    def read(self) -> dict[str, DriverSignals]:
        nvml = self._start()
        if nvml is None:
            return {}
        xids = self._drain(nvml)
        found: dict[str, DriverSignals] = {}
        for address, handle in self._handles.items():
            try:
                found[address] = DriverSignals(
                    via="NVML", answered=True, xids=sorted(set(xids.get(address, []))), **_memory(nvml, handle)
                )
            except nvml.NVMLError_GpuIsLost:
                found[address] = DriverSignals(via="NVML", answered=True, lost=True, xids=xids.get(address, []))
            except nvml.NVMLError as error:
                found[address] = DriverSignals(via="NVML", answered=False, detail=str(error)[:200])
        return found

    def _start(self) -> Any | None:
        if self._nvml is not None:
            return self._nvml
        pynvml = self._library
        if pynvml is None:
            try:
                import pynvml
            except ImportError:
                return None
        try:
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            events = pynvml.nvmlEventSetCreate()
            for handle in handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
                except pynvml.NVMLError_NotSupported:
                    pass  # no Xid events from this GPU: its counters still count
            self._handles = {_address(pynvml, handle): handle for handle in handles}
        except (pynvml.NVMLError, OSError):
            return None  # no driver, no library, no GPU it holds: nothing to say, and asked again next look
        self._nvml, self._events = pynvml, events
        return pynvml

    def _drain(self, nvml: Any) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: the set is empty
                return found
            try:
                address = _address(nvml, event.device)
            except nvml.NVMLError:
                continue
            found.setdefault(address, []).append(int(event.eventData))


def _memory(nvml: Any, handle: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    try:
        _, _, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
        fields.update(remap_pending=bool(pending), remap_failed=bool(failure))
    except nvml.NVMLError_NotSupported:
        pass
    try:
        fields["retirement_pending"] = bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    except nvml.NVMLError_NotSupported:
        pass
    try:
        fields["ecc_uncorrectable"] = int(
            nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        )
    except nvml.NVMLError_NotSupported:
        pass
    # Newer than the calls above: a driver or binding without them has nothing to say, which is not an error.
    absent = (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, AttributeError)
    try:
        channel, tpc = nvml.nvmlDeviceGetRepairStatus(handle)
        fields.update(channel_repair_pending=bool(channel), tpc_repair_pending=bool(tpc))
    except absent:
        pass
    try:
        (value,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if value.nvmlReturn == nvml.NVML_SUCCESS:
            fields["recovery_action"] = NVML_RECOVERY_ACTIONS.get(int(value.value.uiVal))
    except absent:
        pass
    return fields


def _address(nvml: Any, handle: Any) -> str:
    bus = nvml.nvmlDeviceGetPciInfo(handle).busId
    return normalise_pci(bus.decode() if isinstance(bus, bytes) else bus)


class RecordedNvml:
    """A recorded sequence of NVML readings, one per look (the last one repeating): a JSON list of looks, each
    `{"<pci address>": {"xids": [...], "remap_pending": false, ...}}`, the fields of `DriverSignals`."""

    def __init__(self, path: Path) -> None:
        looks = json.loads(path.read_text())["looks"]
        self._looks = [
            {normalise_pci(address): DriverSignals(via="NVML", **reading) for address, reading in look.items()}
            for look in looks
        ]
        self._next = 0

    def read(self) -> dict[str, DriverSignals]:
        look = self._looks[min(self._next, len(self._looks) - 1)]
        self._next += 1
        return look
