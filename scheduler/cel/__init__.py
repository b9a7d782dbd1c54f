"""Kubernetes DRA CEL selectors on cel-python: `compile_selector(expression).matches(device)`.

See README.md in this folder for the vocabulary and how evaluation flows.
"""

from scheduler.cel.device import Device, prepare_device
from scheduler.cel.errors import DeviceError, SelectorCompileError, SelectorError, SelectorRuntimeError
from scheduler.cel.selector import Selector, compilation_count, compile_selector, evaluation_count

__all__ = [
    "Device",
    "DeviceError",
    "Selector",
    "SelectorCompileError",
    "SelectorError",
    "SelectorRuntimeError",
    "compilation_count",
    "compile_selector",
    "evaluation_count",
    "prepare_device",
]
