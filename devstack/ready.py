"""Ready files: how a supervised Python child tells `berth up` it is serving, without a port to probe.

The child writes its own pid to `<state>/run/<part>.ready` once its workers poll (and, for node agents, once every
host's first report was answered); the supervisor takes the part as ready only when the file names the pid it
started, so a file left by a predecessor that was killed never passes for its replacement.
"""

from __future__ import annotations

import os
from pathlib import Path


def mark_ready(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(f"{os.getpid()}\n")
    os.replace(partial, path)


def is_marked_ready(path: Path, pid: int) -> bool:
    try:
        return path.read_text().strip() == str(pid)
    except OSError:
        return False
