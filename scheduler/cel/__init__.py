"""Kubernetes DRA CEL selectors on cel-python: `compile_selector(expression).matches(device)`.

See README.md in this folder for the vocabulary and how evaluation flows.
"""

from scheduler.cel.cost import REQUEST_BUDGET, RequestBudget, request_budget
from scheduler.cel.device import Device, prepare_device
from scheduler.cel.errors import (
    DeviceError,
    SelectorCompileError,
    SelectorCostExceeded,
    SelectorError,
    SelectorRuntimeError,
)
from scheduler.cel.selector import (
    Selector,
    admit_selector,
    compilation_count,
    compile_selector,
    compiled_cache,
    evaluation_count,
)

__all__ = [
    "REQUEST_BUDGET",
    "Device",
    "DeviceError",
    "RequestBudget",
    "Selector",
    "SelectorCompileError",
    "SelectorCostExceeded",
    "SelectorError",
    "SelectorRuntimeError",
    "admit_selector",
    "compilation_count",
    "compile_selector",
    "compiled_cache",
    "evaluation_count",
    "prepare_device",
    "request_budget",
]
