"""Product names and memory for GPUs the host driver holds, to put on top of what the PCI id table says.

A GPU bound to `vfio-pci` (every passthrough GPU) is invisible to NVML and `nvidia-smi`, so these sources are only
ever an overlay: discovery is PCI-level and complete without them. NVML is the stable interface; a recorded
`nvidia-smi -q -x` is what an operator can attach to a report, and lets tests exercise the join without a GPU.
Both name GPUs by `pci_bus_id` with an 8-hex-digit domain (`00000000:3C:00.0`), normalised here before any join.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Protocol

from contracts.pci import normalise_pci
from scheduler.host.inventory import GpuDetailSource

GpuDetail = tuple[str, int | None]  # (product name, memory MiB)
MIB = 1024 * 1024


class GpuDetailsError(Exception):
    """A detail source that should have answered could not be read (a recorded file is missing or malformed)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class GpuDetails(Protocol):
    """Where a GPU's product and memory come from when the host driver holds it."""

    source: GpuDetailSource

    def details(self) -> dict[str, GpuDetail]:
        """Normalised PCI address (`0000:3c:00.0`) -> (product name, memory MiB). Raises only GpuDetailsError."""
        ...


class NvmlDetails:
    """NVML through `pynvml`. No driver, no NVML library, or every GPU on vfio-pci all mean the same thing here:
    NVML knows no GPU, so the answer is empty rather than an error."""

    source = GpuDetailSource.NVML

    def __init__(self, library: Any | None = None) -> None:
        self._library = library  # the `pynvml` module, or what answers as it (a recorded machine's NVML, in tests)

    def details(self) -> dict[str, GpuDetail]:
        pynvml = self._library
        if pynvml is None:
            try:
                import pynvml
            except ImportError:
                return {}
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError):
            return {}
        try:
            found: dict[str, GpuDetail] = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                address = normalise_pci(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
                name = _text(pynvml.nvmlDeviceGetName(handle))
                found[address] = (name, pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB)
            return dict(sorted(found.items()))
        except (pynvml.NVMLError, OSError, ValueError):
            return {}
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass


class RecordedNvidiaSmi:
    """A recorded `nvidia-smi -q -x`. NVIDIA does not promise this format stays stable, so only three elements are
    read (`pci/pci_bus_id`, falling back to the `id` attribute; `product_name`; `fb_memory_usage/total`) and a GPU
    element missing its address is skipped."""

    source = GpuDetailSource.NVIDIA_SMI

    def __init__(self, path: Path) -> None:
        self.path = path

    def details(self) -> dict[str, GpuDetail]:
        try:
            document = ElementTree.parse(self.path).getroot()
        except (OSError, ElementTree.ParseError) as error:
            raise GpuDetailsError(str(self.path), f"cannot read recorded nvidia-smi output: {error}") from error
        found: dict[str, GpuDetail] = {}
        for gpu in document.iter("gpu"):
            raw_address = gpu.findtext("pci/pci_bus_id") or gpu.get("id") or ""
            try:
                address = normalise_pci(raw_address)
            except ValueError:
                continue
            product = (gpu.findtext("product_name") or "").strip() or "NVIDIA GPU"
            found[address] = (product, _mib(gpu.findtext("fb_memory_usage/total")))
        return dict(sorted(found.items()))


def _text(value: str | bytes) -> str:
    """pynvml returns bytes or str depending on its version."""
    return value.decode() if isinstance(value, bytes) else value


def _mib(value: str | None) -> int | None:
    """`143771 MiB` -> 143771; anything else (`N/A`, absent) -> None."""
    match = re.fullmatch(r"\s*(\d+)\s*MiB\s*", value or "")
    return int(match.group(1)) if match else None
