"""The approved slots a node agent plans with: the operator's inventory for this node, as the control plane holds it.

The agent gets them in the reply to its report (or, for a simulated host, from the node's fleet entry at start), and
keeps the hash the control plane gave, so a report says which approval the agent is working from and the reply
carries the slots again only when they changed. Thread-safe: activities run in a thread pool.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from fleet.node import Slot
from scheduler.host.report import approved_hash


class ApprovedSlots:
    def __init__(self, slots: Iterable[Slot] = ()) -> None:
        self._lock = threading.Lock()
        self._slots = sorted(slots, key=lambda s: s.index)
        self._hash: str | None = approved_hash(self._slots) if self._slots else None

    @property
    def slots(self) -> list[Slot]:
        with self._lock:
            return list(self._slots)

    @property
    def hash(self) -> str | None:
        with self._lock:
            return self._hash

    def replace(self, documents: list[dict[str, Any]], digest: str) -> None:
        slots = sorted((Slot.model_validate(document) for document in documents), key=lambda s: s.index)
        with self._lock:
            self._slots, self._hash = slots, digest
