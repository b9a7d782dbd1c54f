"""Host-local leases: the node scheduler's same-host race guard (docs/seeds.md, "A host-local lease before a plan").

A lease says "these slots are being placed for this allocation until this time". It is one JSON file per
allocation in the lease directory, written atomically (temp file, fsync, rename) while holding an exclusive lock on
the directory, so two plans on one host can never pick the same slot. A lease is not the durable record: the
claim in PostgreSQL is. It lives from plan to VM creation and then goes; one that is never confirmed expires, and
the reaper deletes it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from contracts.placement import Bundle


class Lease(BaseModel):
    allocation_id: str
    task_id: str
    node: str
    slot_ids: list[str]
    devices: list[Bundle]
    expires_at: datetime

    def live(self, now: datetime) -> bool:
        return self.expires_at > now


class LeaseStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, allocation_id: str) -> Path:
        safe = allocation_id.replace("/", "_")
        return self.directory / f"{safe}.json"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock over the whole lease directory, across processes on this host."""
        with open(self.directory / ".lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read_all(self) -> list[Lease]:
        leases = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                leases.append(Lease.model_validate_json(path.read_text()))
            except (FileNotFoundError, ValidationError, json.JSONDecodeError):
                continue  # a lease being replaced right now, or garbage: never counts as held
        return leases

    def get(self, allocation_id: str) -> Lease | None:
        try:
            return Lease.model_validate_json(self._path(allocation_id).read_text())
        except (FileNotFoundError, ValidationError, json.JSONDecodeError):
            return None

    def write(self, lease: Lease) -> None:
        """Atomic: readers see the old lease or the new one, never half of one. Call under `locked()`."""
        target = self._path(lease.allocation_id)
        partial = target.with_suffix(".partial")
        with open(partial, "w") as handle:
            handle.write(lease.model_dump_json(indent=2))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def release(self, allocation_id: str) -> bool:
        """Idempotent: releasing a lease that is gone is not an error."""
        with self.locked():
            try:
                self._path(allocation_id).unlink()
                return True
            except FileNotFoundError:
                return False

    def reap(self, now: datetime | None = None) -> list[str]:
        """Delete expired leases; returns the allocations whose leases went."""
        now = now or datetime.now(UTC)
        reaped = []
        with self.locked():
            for lease in self.read_all():
                if not lease.live(now):
                    self._path(lease.allocation_id).unlink(missing_ok=True)
                    reaped.append(lease.allocation_id)
        return reaped
