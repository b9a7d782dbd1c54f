"""Compiled selectors, and the two caches that keep CEL off the scheduler's hot path.

cel-python costs about 0.3 ms per evaluation and a few ms per compilation. A fleet placement over 1,000
clusters x 8 pools whose classes publish a handful of distinct devices must not pay that per pool, so:

* `compile_selector` parses and checks an expression once per process (an LRU keyed by the text, bounded both in
  entries and in the total length of the texts it holds, since a tenant can vary a constant at will and a parsed
  10 KB expression is megabytes of syntax tree);
* each `Selector` remembers the outcome (match, or runtime failure) and its actual cost per distinct device
  content, so an (expression, device) pair is evaluated once however many pools publish that device, and a request
  is charged the same cost for it whether it is evaluated now or remembered (`cost.RequestBudget`).

`evaluation_count()` and `compilation_count()` count the real work done, for benchmarks and tests.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError

from scheduler.cel.checker import check
from scheduler.cel.cost import (
    MAX_COST,
    CostLimitExceeded,
    RequestBudget,
    RequestCostExceeded,
    current_request,
    tracking,
)
from scheduler.cel.device import Device, prepare_device
from scheduler.cel.errors import DeviceError, SelectorCostExceeded, SelectorRuntimeError
from scheduler.cel.evaluator import evaluate
from scheduler.cel.syntax import parse
from scheduler.cel.values import type_name

MAX_REMEMBERED_DEVICES = 65536  # per selector; far above the distinct devices of any fleet
MAX_COMPILED = 4096  # compiled selectors kept, least recently used dropped first
MAX_COMPILED_CHARACTERS = 1 << 20  # and at most this much expression text among them (about 1 MiB)

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

    def __init__(self, expression: str, tree: lark.Tree, estimated_cost: int = 0) -> None:
        self.expression = expression
        self.estimated_cost = estimated_cost  # the checker's worst case for one device
        self._tree = tree
        self._outcomes: dict[str, tuple[bool | _Failure, int]] = {}  # device key -> (outcome, its actual cost)
        self._lock = threading.Lock()

    def matches(self, device: Mapping[str, Any] | Device) -> bool:
        """Whether the device satisfies the selector.

        `device` is a published device mapping (see `device.py`) or a `Device` from `prepare_device`,
        which saves re-serializing the same device for every selector. Raises SelectorRuntimeError when
        evaluation fails: a missing attribute, a value of the wrong type, a malformed device. Inside
        `cost.request_budget()`, charges the request the pair's cost once and raises SelectorCostExceeded when the
        request's selectors pass their budget.
        """
        try:
            prepared = prepare_device(device)
        except DeviceError as error:
            raise SelectorRuntimeError(self.expression, str(error)) from None
        request = current_request()
        pair = (id(self), prepared.key)
        unpaid = request if request is not None and pair not in request.charged else None
        with self._lock:
            remembered = self._outcomes.get(prepared.key)
        try:
            if remembered is None:
                remembered = self._evaluate(prepared, unpaid)
                with self._lock:
                    if len(self._outcomes) >= MAX_REMEMBERED_DEVICES:
                        del self._outcomes[next(iter(self._outcomes))]
                    self._outcomes[prepared.key] = remembered
            elif unpaid is not None:
                unpaid.charge(remembered[1])
        except RequestCostExceeded as exceeded:
            budget = exceeded.budget
            raise SelectorCostExceeded(self.expression, budget.spent, budget.limit) from None
        if unpaid is not None:
            unpaid.charged.add(pair)
        outcome = remembered[0]
        if isinstance(outcome, _Failure):
            raise SelectorRuntimeError(self.expression, outcome.reason, outcome.line, outcome.column)
        return outcome

    def _evaluate(self, device: Device, request: RequestBudget | None) -> tuple[bool | _Failure, int]:
        """The outcome and its actual cost; RequestCostExceeded passes through (the request's fault, not the
        device's: nothing is remembered)."""
        _count("evaluations")
        with tracking(MAX_COST, request) as tracker:
            try:
                result = evaluate(self._tree, {"device": device.value})
            except CostLimitExceeded as error:
                return _Failure(str(error)), tracker.spent
            except CELEvalError as error:
                return _Failure(_reason(error), error.line, error.column), tracker.spent
            except (TypeError, ValueError, ArithmeticError, RecursionError) as error:
                return _Failure(f"{type(error).__name__}: {error}"), tracker.spent
        if not isinstance(result, celtypes.BoolType):
            return _Failure(f"CEL result of type {type_name(result)} could not be converted to bool"), tracker.spent
        return bool(result), tracker.spent

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


class _CompiledCache:
    """An LRU of compiled selectors by text, bounded in entries and in total text length. Failures are not kept
    (they are cheap to find again and a tenant could otherwise fill the cache with them)."""

    def __init__(self, entries: int, characters: int) -> None:
        self.entries = entries
        self.characters = characters
        self._held = 0
        self._selectors: OrderedDict[str, Selector] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, expression: str) -> Selector | None:
        with self._lock:
            selector = self._selectors.get(expression)
            if selector is not None:
                self._selectors.move_to_end(expression)
            return selector

    def put(self, selector: Selector) -> Selector:
        """Keep `selector` (or the one another thread kept first, so everyone shares one) and drop the least
        recently used past either bound."""
        with self._lock:
            kept = self._selectors.setdefault(selector.expression, selector)
            if kept is selector:
                self._held += len(selector.expression)
            self._selectors.move_to_end(kept.expression)
            while len(self._selectors) > 1 and (len(self._selectors) > self.entries or self._held > self.characters):
                dropped, _ = self._selectors.popitem(last=False)
                self._held -= len(dropped)
            return kept

    def clear(self) -> None:
        with self._lock:
            self._selectors.clear()
            self._held = 0

    def __len__(self) -> int:
        return len(self._selectors)

    @property
    def held_characters(self) -> int:
        return self._held


_compiled = _CompiledCache(MAX_COMPILED, MAX_COMPILED_CHARACTERS)


def compile_selector(expression: str) -> Selector:
    """The compiled selector for `expression`, shared process-wide; raises SelectorCompileError."""
    selector = _compiled.get(expression)
    if selector is not None:
        return selector
    _count("compilations")
    tree = parse(expression)
    estimated = check(expression, tree)
    return _compiled.put(Selector(expression, tree, estimated))


compile_selector.cache_clear = _compiled.clear  # type: ignore[attr-defined]  # as functools.lru_cache had it


def compiled_cache() -> _CompiledCache:
    """The process-wide cache of compiled selectors (for tests and benchmarks: its size and held text)."""
    return _compiled


def admit_selector(expression: str, budget: int) -> Selector:
    """The compiled selector, if a request may carry it: raises SelectorCompileError, or SelectorCostExceeded when its
    estimated cost alone is over what a whole request may spend (`budget`)."""
    selector = compile_selector(expression)
    if selector.estimated_cost > budget:
        raise SelectorCostExceeded(expression, selector.estimated_cost, budget, estimated=True)
    return selector
