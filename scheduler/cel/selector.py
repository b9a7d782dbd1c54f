"""Compiled selectors, and the two caches that keep CEL off the scheduler's hot path.

cel-python costs about 0.3 ms per evaluation and a few ms per compilation. A fleet placement over 1,000
clusters x 8 pools whose classes publish a handful of distinct devices must not pay that per pool, so:

* `compile_selector` parses and checks an expression once per process (an LRU keyed by the text);
* each `Selector` remembers the outcome (match, or runtime failure) per distinct device content, so an
  (expression, device) pair is evaluated once however many pools publish that device.

`evaluation_count()` and `compilation_count()` count the real work done, for benchmarks and tests.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError

from scheduler.cel.checker import check
from scheduler.cel.cost import CostLimitExceeded, tracking
from scheduler.cel.device import Device, prepare_device
from scheduler.cel.errors import DeviceError, SelectorRuntimeError
from scheduler.cel.evaluator import evaluate
from scheduler.cel.library import type_name
from scheduler.cel.syntax import parse

MAX_REMEMBERED_DEVICES = 65536  # per selector; far above the distinct devices of any fleet

_counts = {"compilations": 0, "evaluations": 0}
_counts_lock = threading.Lock()


def _count(what: str) -> None:
    with _counts_lock:
        _counts[what] += 1


def compilation_count() -> int:
    """How many expressions this process has parsed and checked, failures included (cache hits excluded)."""
    return _counts["compilations"]


def evaluation_count() -> int:
    """How many (expression, device) evaluations this process has run (remembered outcomes excluded)."""
    return _counts["evaluations"]


@dataclass(frozen=True)
class _Failure:
    """A remembered runtime failure; each `matches` call raises a fresh error from it."""

    reason: str
    line: int | None = None
    column: int | None = None


class Selector:
    """A compiled DRA CEL selector. Build it with `compile_selector`."""

    def __init__(self, expression: str, tree: lark.Tree) -> None:
        self.expression = expression
        self._tree = tree
        self._outcomes: dict[str, bool | _Failure] = {}
        self._lock = threading.Lock()

    def matches(self, device: Mapping[str, Any] | Device) -> bool:
        """Whether the device satisfies the selector.

        `device` is a published device mapping (see `device.py`) or a `Device` from `prepare_device`,
        which saves re-serializing the same device for every selector. Raises SelectorRuntimeError when
        evaluation fails: a missing attribute, a value of the wrong type, a malformed device.
        """
        try:
            prepared = prepare_device(device)
        except DeviceError as error:
            raise SelectorRuntimeError(self.expression, str(error)) from None
        with self._lock:
            outcome = self._outcomes.get(prepared.key)
        if outcome is None:
            outcome = self._evaluate(prepared)
            with self._lock:
                if len(self._outcomes) >= MAX_REMEMBERED_DEVICES:
                    del self._outcomes[next(iter(self._outcomes))]
                self._outcomes[prepared.key] = outcome
        if isinstance(outcome, _Failure):
            raise SelectorRuntimeError(self.expression, outcome.reason, outcome.line, outcome.column)
        return outcome

    def _evaluate(self, device: Device) -> bool | _Failure:
        _count("evaluations")
        try:
            with tracking():
                result = evaluate(self._tree, {"device": device.value})
        except CostLimitExceeded as error:
            return _Failure(str(error))
        except CELEvalError as error:
            return _Failure(_reason(error), error.line, error.column)
        except (TypeError, ValueError, ArithmeticError, RecursionError) as error:
            return _Failure(f"{type(error).__name__}: {error}")
        if not isinstance(result, celtypes.BoolType):
            return _Failure(f"CEL result of type {type_name(result)} could not be converted to bool")
        return bool(result)

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


def _reason(error: CELEvalError) -> str:
    """cel-python's message, with the detail it keeps in its arguments ("no such overload" alone says
    little; the detail names the function and the argument types)."""
    message = str(error.args[0]) if error.args else "evaluation failed"
    details = error.args[2] if len(error.args) > 2 and isinstance(error.args[2], tuple) else ()
    detail = str(details[0]) if details else ""
    if not detail or detail == message:
        return message
    return detail if detail.startswith(message) else f"{message}: {detail}"


@functools.lru_cache(maxsize=4096)
def compile_selector(expression: str) -> Selector:
    """The compiled selector for `expression`, shared process-wide; raises SelectorCompileError."""
    _count("compilations")
    tree = parse(expression)
    check(expression, tree)
    return Selector(expression, tree)
