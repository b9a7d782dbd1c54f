"""Where a process's Python time goes, by what Berth was doing: a sampling profiler for the benchmarks.

Every `interval` seconds a thread of its own looks at every other thread's stack (`sys._current_frames`) and files
the sample under the first frame, from the innermost out, that names what the thread is doing for Berth:

    activity:<name>   a control-plane activity (activities/control/*), whatever it calls (the store, SQLAlchemy)
    admission pass    the admission pass a release or an enqueue runs (activities/control/admission.py)
    workflow          workflow code (workflows/*), run by the SDK in its workflow threads
    bench client      the benchmark's own client: starting workflows, waiting for rows (its coroutines; not the
                      module frame that started the event loop, which is under every callback)
    sdk               the Temporal SDK's own Python (activations, payload conversion) outside the above
    database driver   asyncpg and SQLAlchemy called back by the event loop, no Berth frame above them
    other             anything else that was running (the event loop's own callbacks)

A thread whose innermost frame is a wait (the event loop's selector, a lock, a queue, a condition) is idle and not
counted. Threads waiting for the GIL look busy, so the counts are shares, not milliseconds: `split` scales them to
the CPU the process really used (psutil), which is what the allocation benchmark reports per allocation.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from types import FrameType

IDLE = frozenset(
    {
        "select",
        "poll",
        "epoll",
        "wait",
        "acquire",
        "get",
        "_worker",
        "sleep",
        "_wait_for_tstate_lock",
        "run_forever",
        "_run_once",
        "accept",
        "recv",
        "recv_into",
        "readline",
    }
)


def _label(frame: FrameType | None) -> str | None:
    """What the stack from `frame` outwards is doing for Berth; None when the thread is idle."""
    if frame is None:
        return None
    innermost = frame.f_code
    if innermost.co_filename.endswith("selectors.py") or (
        innermost.co_name in IDLE and "/asyncpg/" not in innermost.co_filename
    ):
        return None
    activity: str | None = None
    seen: set[str] = set()
    while frame is not None:
        path = frame.f_code.co_filename
        if "/site-packages/" not in path:
            if "/activities/control/admission.py" in path:
                seen.add("admission pass")
            elif "/activities/" in path:
                activity = frame.f_code.co_name  # the outermost one is the activity itself
            elif "/workflows/" in path:
                seen.add("workflow")
            elif "/bench/" in path and not path.endswith("sampler.py") and frame.f_code.co_name != "<module>":
                # Not the benchmark's module frame: it is under every callback of the event loop it started.
                seen.add("bench client")
        elif "/temporalio/" in path:
            seen.add("sdk")
        elif "/asyncpg/" in path or "/sqlalchemy/" in path:
            seen.add("database driver")
        frame = frame.f_back
    if "admission pass" in seen:
        return "admission pass"
    if activity is not None:
        return f"activity:{activity}"
    for label in ("workflow", "bench client", "sdk", "database driver"):
        if label in seen:
            return label
    return "other"


class Sampler:
    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            for ident, frame in sys._current_frames().items():
                if ident != me and (label := _label(frame)) is not None:
                    self.counts[label] += 1
            time.sleep(self.interval)

    def split(self, cpu_ms: float) -> dict[str, float]:
        """`cpu_ms` (the process's CPU over the sampled span) shared out by the samples, largest first."""
        total = sum(self.counts.values())
        if total == 0:
            return {}
        return {label: round(cpu_ms * n / total, 2) for label, n in self.counts.most_common()}
