"""The house keeps its rules: the layering contracts in pyproject.toml, the formatter's layout, the linter's checks.

Each rule is a well-kept tool's own configuration, run here as a user would run it from the repository's root, so
a change that breaks one fails the suite with the tool's own explanation (import-linter names the chain of imports
that breaks a contract; ruff names the file and the line).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    """The console script installed beside this Python (the dev extra installs both), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[dev]' installs it"
    return found


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def test_the_import_contracts_hold() -> None:
    """contracts/ imports nothing of Berth, scheduler/ no I/O, only store/ the database, the agent nothing of the
    control plane, the client's commands nothing of the server, the console nothing but the API's client, and every
    package only the layers below it."""
    result = _run(_tool("lint-imports"), "--no-cache", "--no-logo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 8 kept, 0 broken." in result.stdout, result.stdout


def test_the_formatter_has_nothing_to_change() -> None:
    result = _run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_linter_finds_nothing() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


# worker.py stands at the top of the repository (the house's layout), where import-linter, which reads packages
# only, cannot hold it to a layer. It is the control worker's registrations: it sits beside the API, importing only
# the layers below, and only the entry points above it (cli/, bench/) import it.
WORKER_IMPORTS = {"activities", "agent", "config", "contracts", "fleet", "scheduler", "store", "workflows"}
WORKER_IMPORTED_BY = {"bench", "cli", "tests"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_worker_py_imports_only_the_layers_below_it_and_only_entry_points_import_it() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    mine = _imports(REPO / "worker.py") & packages
    assert mine <= WORKER_IMPORTS, f"worker.py imports {sorted(mine - WORKER_IMPORTS)}, above or beside it"
    importers = {
        path.relative_to(REPO).parts[0]
        for path in REPO.rglob("*.py")
        if ".git" not in path.parts and path.name != "worker.py" and "worker" in _imports(path)
    }
    assert importers <= WORKER_IMPORTED_BY, f"worker.py is imported from {sorted(importers - WORKER_IMPORTED_BY)}"
