"""Write requirements.lock: every package the image installs, pinned to one version, with the hashes of its files.

The image installs from this file alone (`pip install --require-hashes --only-binary=:all:`), so two builds of one
commit get the same packages, and a file on the package index that changed under a known version fails the build
instead of entering it. The lock holds what the image runs, the control plane: Berth's dependencies
(pyproject.toml's `[project].dependencies`, the client's), its `server` extra (the API, workers, gateway and agents)
and its build backend (`[build-system].requires`: the image builds Berth's own wheel without fetching anything
else); not the `dev` or `host` extras. It is resolved for CPython 3.11, the image's Python, on every platform (uv's
universal resolution), so the same file serves an x86-64 and an arm64 build.

    python scripts/lock.py              # after changing dependencies: keeps every pin that still fits
    python scripts/lock.py --upgrade    # newest versions that fit

uv reads the existing lock as its preferences, so a run without `--upgrade` changes only what pyproject.toml's
change requires. tests/test_image.py fails when the lock and pyproject.toml disagree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

from uv import find_uv_bin

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements.lock"
PYTHON_VERSION = "3.11"  # the Dockerfile's base image
EXTRAS = ["server"]  # what the image runs beside the client


def build_requirements() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]


def compile_lock(output: Path, *, upgrade: bool = False) -> subprocess.CompletedProcess[str]:
    """Resolve pyproject.toml's dependencies, its `EXTRAS` and its build backend into `output` (its pins, if any,
    preferred)."""
    command = [
        find_uv_bin(),
        "pip",
        "compile",
        "pyproject.toml",
        "-",  # "-": the build backend, from standard input
        *(f"--extra={extra}" for extra in EXTRAS),
        "--universal",
        "--python-version",
        PYTHON_VERSION,
        "--generate-hashes",
        "--quiet",
        "--custom-compile-command",
        "python scripts/lock.py",
        "--output-file",
        str(output),
    ]
    if upgrade:
        command.append("--upgrade")
    return subprocess.run(
        command, cwd=REPO, input="\n".join(build_requirements()) + "\n", capture_output=True, text=True, check=False
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upgrade", action="store_true", help="take the newest versions that fit")
    parser.add_argument("--output", type=Path, default=LOCK, help="where to write it (default: requirements.lock)")
    options = parser.parse_args()
    done = compile_lock(options.output, upgrade=options.upgrade)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
