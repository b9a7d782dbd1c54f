"""CPU seconds the processes of a stack spent: where a benchmark's work went, and steadier on a busy machine than
wall-clock rates are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psutil


def process_tree(pid: int | None) -> list[psutil.Process]:
    """The process and every process below it, now (none when it is gone)."""
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def cpu_seconds(processes: Iterable[psutil.Process], *, reaped_by: Iterable[int] = ()) -> float:
    """User and system CPU of `processes`; a process in `reaped_by` (a server: PostgreSQL's postmaster, Temporal's)
    also counts the children it has reaped, so a backend whose connection closed takes its CPU with it into its
    server's figure rather than out of every figure. A process that ended meanwhile counts nothing."""
    servers = set(reaped_by)
    seconds = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            seconds += times.user + times.system
            if process.pid in servers:
                seconds += times.children_user + times.children_system
    return seconds
