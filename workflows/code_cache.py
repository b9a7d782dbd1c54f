"""Compile each workflow module once per process, not once per workflow run.

Temporal's sandbox re-imports a workflow's module (and the workflow modules it imports) for every workflow run it
starts, so that runs share no module state. Python reads that import's bytecode from `__pycache__` when it can; with
`PYTHONDONTWRITEBYTECODE=1` (Berth's container image, most others, and this project's CI) there is none, and every
run compiled `workflows/allocation/workflow.py` from source: about 5 ms of the control worker's CPU per allocation,
an eighth of it in a burst of a thousand requests (docs/benchmarks.md, "Throughput and CPU against the baselines").

`install` puts a finder in front of `sys.meta_path` that hands out the normal source loader with one change: the code
object it compiles is kept, keyed by the file and its modification time and size, and reused by the next import of
the same module. The sandbox still executes the module afresh for each run (new module objects, new classes, no
shared state); only the compiling is shared, and a code object is immutable.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from types import CodeType, ModuleType

_CODE: dict[tuple[str, float, int], CodeType] = {}
_LOCK = threading.Lock()  # the sandbox imports on the workflow task threads


class _CachingSourceLoader(importlib.machinery.SourceFileLoader):
    """The standard source loader, reusing the code object it compiled for an unchanged file."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        stats = self.path_stats(path)
        key = (path, float(stats["mtime"]), int(stats.get("size", -1)))
        with _LOCK:
            code = _CODE.get(key)
        if code is None:
            code = super().get_code(fullname)
            assert code is not None  # a source file always has code
            with _LOCK:
                _CODE[key] = code
        return code


class _CompiledOnceFinder(MetaPathFinder):
    """Finds the modules of the given packages as the rest of `sys.meta_path` would, with a caching loader."""

    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = tuple(packages)

    def _ours(self, fullname: str) -> bool:
        return any(fullname == p or fullname.startswith(p + ".") for p in self.packages)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not self._ours(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            loader = spec.loader
            if type(loader) is importlib.machinery.SourceFileLoader and spec.origin:
                spec.loader = _CachingSourceLoader(loader.name, loader.path)
            return spec
        return None


def install(packages: Sequence[str] = ("workflows",)) -> None:
    """Compile these packages' modules once per process (idempotent)."""
    if not any(isinstance(f, _CompiledOnceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CompiledOnceFinder(packages))
