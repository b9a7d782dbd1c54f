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

The tracker lives in a context variable set for the duration of one `evaluate`, so library functions charge it
without being handed it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

MAX_COST = 1_000_000  # resource.CELSelectorExpressionMaxCost, both the estimate's and the evaluation's limit
STRING_TRAVERSAL_FACTOR = 0.1
REGEX_FACTOR = 0.25
LIMIT_MESSAGE = "operation cancelled: actual cost limit exceeded"


class CostLimitExceeded(Exception):
    """Raised out of the evaluation (not a CEL error value: `||` or `exists` must not absorb it)."""

    def __init__(self) -> None:
        super().__init__(LIMIT_MESSAGE)


class CostTracker:
    __slots__ = ("limit", "spent")

    def __init__(self, limit: int = MAX_COST) -> None:
        self.limit = limit
        self.spent = 0

    def charge(self, amount: int) -> None:
        self.spent += amount
        if self.spent > self.limit:
            raise CostLimitExceeded


_current: ContextVar[CostTracker | None] = ContextVar("berth_cel_cost", default=None)


@contextmanager
def tracking(limit: int = MAX_COST) -> Iterator[CostTracker]:
    """Count the cost of everything evaluated inside the block against `limit`."""
    tracker = CostTracker(limit)
    token = _current.set(tracker)
    try:
        yield tracker
    finally:
        _current.reset(token)


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
