"""The filter plugin contract shared by every level, in the Kubernetes scheduler framework's style.

A filter looks at one candidate (a region, a pool, a node's profile) and either lets it through (None) or names
the reason it cannot serve the request. Filters run in order and the first reason is the candidate's, so each
level lists its filters in the order a user would fix things.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from contracts.reasons import Reason

Item = TypeVar("Item", contravariant=True)


class Filter(Protocol[Item]):
    def check(self, item: Item) -> Reason | None: ...


def first_failure(item: Item, filters: Iterable[Filter[Item]]) -> Reason | None:
    for plugin in filters:
        reason = plugin.check(item)
        if reason is not None:
            return reason
    return None
