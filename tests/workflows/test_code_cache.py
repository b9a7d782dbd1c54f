"""The control worker compiles each workflow module once per process although the sandbox re-imports it per run."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from workflows import code_cache


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "cachedpkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "flow.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    yield root
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "cachedpkg" or m.startswith("cachedpkg.")]:
        del sys.modules[name]


def _fresh_import(name: str) -> object:
    """What the sandbox does for every workflow run: a new module object from the module's file."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_a_reimport_reuses_the_code_and_a_changed_file_is_compiled_again(package: Path) -> None:
    finder = code_cache._CompiledOnceFinder(["cachedpkg"])
    sys.meta_path.insert(0, finder)
    try:
        first = _fresh_import("cachedpkg.flow")
        second = _fresh_import("cachedpkg.flow")
        assert first is not second  # each run still gets its own module
        assert isinstance(second.__spec__.loader, code_cache._CachingSourceLoader)
        code = second.__spec__.loader.get_code("cachedpkg.flow")
        assert code is first.__spec__.loader.get_code("cachedpkg.flow")  # compiled once

        (package / "flow.py").write_text("VALUE = 22\n")
        stat = (package / "flow.py").stat()
        os.utime(package / "flow.py", (stat.st_atime, stat.st_mtime + 5))
        third = _fresh_import("cachedpkg.flow")
        assert third.VALUE == 22  # an edited module is compiled again, not served stale
        assert third.__spec__.loader.get_code("cachedpkg.flow") is not code
    finally:
        sys.meta_path.remove(finder)


def test_other_packages_are_left_to_the_normal_finders(package: Path) -> None:
    finder = code_cache._CompiledOnceFinder(["workflows"])
    assert finder.find_spec("cachedpkg.flow", None) is None
    assert finder.find_spec("json", None) is None
