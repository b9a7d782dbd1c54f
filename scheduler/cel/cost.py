"""The actual cost of one evaluation, and the limit that cancels it (cel-go's `CostLimit`, as Kubernetes sets it).

The checker refuses expressions whose estimated worst case exceeds the limit, but an estimate cannot know how long
a published string attribute is or how many elements a `split` makes, so, as in Kubernetes, evaluation counts too
and stops with cel-go's error, "operation cancelled: actual cost limit exceeded", once it passes 1,000,000
(resource.k8s.io's CELSelectorExpressionMaxCost).

What counts (close to cel-go's runtime tracker, rounded up where they differ, so Berth never lets through what
Kubernetes would cancel for this reason):

* every evaluated operation costs 1: a name, a field selection, an index, an operator, a function or method call,
  a list or map literal (literal constants cost nothing, as in cel-go);
* every iteration of a comprehension (`all`, `exists`, `exists_one`, `map`, `filter`) costs 1 besides its body;
* string functions add their traversal: ceil(0.1 x the characters they read), cel-go's string traversal factor
  (`contains`, `startsWith`, `endsWith`, the strings extension, `+` of strings);
* `matches` costs ceil(0.1 x the text's length) x ceil(0.25 x the pattern's length), cel-go's regex estimate.

Berth charges, besides, what cel-go gets for nothing but cel-python copies or walks element by element (found
probing Berth as a tenant): joining two lists costs the elements copied, `in` the elements scanned, `==` of
lists and maps every element compared (a list nesting itself k times holds 2**k elements for k units otherwise), and
`join`, `replace` and `format` the characters they write.

The tracker lives in a context variable set for the duration of one `evaluate`, so library functions charge it
without being handed it.

**The request budget**. Kubernetes' limit is per expression, and cel-go runs 1,000,000 units in about a
millisecond; cel-python runs 15 to 60 units per millisecond (`python -m bench.cel_cost`), so one expression at that
limit is about a minute of CPU, and a request carries up to 32 selectors evaluated against every distinct device
it meets. So every evaluation made for one request (all its selectors over all the devices of one scheduling pass)
also charges one `RequestBudget` of `REQUEST_BUDGET` units, at most about 65 ms of CPU at the slowest speed measured
(derivation in docs/benchmarks.md, "CEL selectors: the evaluator's speed and the request budget"); past it the whole request stops with `RequestCostExceeded`, which is the
request's fault, not the device's: it is never remembered as a device's outcome, and callers refuse the request
(HTTP 422 `selector_cost_exceeded` from explain, placement refusal `selector_cost_exceeded` for an allocation). A
selector whose estimated cost alone is over the budget is refused the same way at admission. An evaluation made
outside any request (the fleet scheduler's, for admin-authored ModelDeployments) keeps Kubernetes' per-expression
limit alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

MAX_COST = 1_000_000  # resource.CELSelectorExpressionMaxCost, both the estimate's and one evaluation's limit
# What all of one request's selectors may spend together in one scheduling pass: about 65 ms of CPU at the slowest
# speed bench/cel_cost.py measured (15 units/ms), 30 at the median shape's (32); see docs/benchmarks.md.
REQUEST_BUDGET = 1000
STRING_TRAVERSAL_FACTOR = 0.1
REGEX_FACTOR = 0.25
LIMIT_MESSAGE = "operation cancelled: actual cost limit exceeded"


class CostLimitExceeded(Exception):
    """Raised out of the evaluation (not a CEL error value: `||` or `exists` must not absorb it)."""

    def __init__(self) -> None:
        super().__init__(LIMIT_MESSAGE)


class RequestCostExceeded(Exception):
    """One request's selectors together passed the request budget: raised out of the evaluation and out of the
    scheduling pass (never absorbed, never remembered as a device's outcome)."""

    def __init__(self, budget: RequestBudget) -> None:
        self.budget = budget
        super().__init__(f"the request's selectors passed their cost budget of {budget.limit}")


class RequestBudget:
    """The cost one request's selectors may spend together, over every device of one scheduling pass.

    Each distinct (selector, device) pair is charged once per request, whether it is evaluated now or its outcome is
    remembered from an earlier request (then its recorded cost is charged): so whether a request fits its budget
    depends on its selectors and the devices alone, never on what other requests happened to warm up."""

    __slots__ = ("charged", "limit", "spent")

    def __init__(self, limit: int = REQUEST_BUDGET) -> None:
        self.limit = limit
        self.spent = 0
        self.charged: set[tuple[int, str]] = set()  # (id of the compiled selector, device key) pairs already paid

    def charge(self, amount: int) -> None:
        self.spent += amount
        if self.spent > self.limit:
            raise RequestCostExceeded(self)


class CostTracker:
    __slots__ = ("limit", "request", "spent")

    def __init__(self, limit: int = MAX_COST, request: RequestBudget | None = None) -> None:
        self.limit = limit
        self.spent = 0
        self.request = request

    def charge(self, amount: int) -> None:
        self.spent += amount
        if self.request is not None:
            self.request.charge(amount)
        if self.spent > self.limit:
            raise CostLimitExceeded


_current: ContextVar[CostTracker | None] = ContextVar("berth_cel_cost", default=None)
_request: ContextVar[RequestBudget | None] = ContextVar("berth_cel_request", default=None)


@contextmanager
def tracking(limit: int = MAX_COST, request: RequestBudget | None = None) -> Iterator[CostTracker]:
    """Count the cost of everything evaluated inside the block against `limit` (and `request`'s budget, if given)."""
    tracker = CostTracker(limit, request)
    token = _current.set(tracker)
    try:
        yield tracker
    finally:
        _current.reset(token)


@contextmanager
def request_budget(budget: RequestBudget | None = None) -> Iterator[RequestBudget]:
    """Charge every selector evaluated inside the block (in this thread or task) to one request's budget.

    Pass the same `budget` again to go on charging it in a later step of the same scheduling pass (the placement
    activity runs the region and cluster levels apart)."""
    budget = budget if budget is not None else RequestBudget()
    token = _request.set(budget)
    try:
        yield budget
    finally:
        _request.reset(token)


def current_request() -> RequestBudget | None:
    """The budget of the request being scheduled, if any."""
    return _request.get()


def charge(amount: int) -> None:
    tracker = _current.get()
    if tracker is not None:
        tracker.charge(amount)


def traversal(*texts: str) -> int:
    return math.ceil(STRING_TRAVERSAL_FACTOR * sum(len(text) for text in texts))


def charge_text(*texts: str) -> None:
    """A string function reading these texts."""
    charge(traversal(*texts))


def charge_regex(text: str, pattern: str) -> None:
    charge(max(traversal(text), 1) * max(math.ceil(REGEX_FACTOR * len(pattern)), 1))


def charge_length(length: int) -> None:
    """A string function writing `length` characters (Berth's own charge, see the module's docstring)."""
    charge(math.ceil(STRING_TRAVERSAL_FACTOR * length))
