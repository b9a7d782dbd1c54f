"""`berth tokens gateway-key --to FILE`: write the node gateway's task-token sealing key. It sets up a part of the
control plane (the gateway), so it lives here; cli/main.py adds it to the `tokens` group, where it always was."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.output import console, fail


def gateway_key(
    to: Annotated[Path, typer.Option("--to", help="The key file the node gateway reads (BERTH_GATEWAY_KEY_FILE).")],
) -> None:
    """Write a new task-token sealing key for the node gateway (mode 0600), unless the file already holds one: every
    gateway replica shares it, and it must survive their restarts."""
    from gateway.seal import ensure_key_file

    try:
        written = ensure_key_file(to)
    except OSError as error:
        fail(f"cannot write {to}: {error.strerror}")
    console.print(
        f"node gateway key written to {to}" if written else f"{to} already holds a key; kept", highlight=False
    )
