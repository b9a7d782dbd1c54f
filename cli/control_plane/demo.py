"""`berth demo`: start the dev stack (or use the running one) and walk through Berth's main cases."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import httpx
import typer

from cli.control_plane.demo_steps import Demo
from cli.control_plane.up import console_url, sign_in_hint
from cli.output import console, fail, styled
from config.context import StackContext, read_context
from config.settings import Settings
from devstack.postgres import PostgresStartError
from devstack.stack import AlreadyRunning, DevStack, default_fleet_file
from devstack.supervisor import PartFailed
from devstack.temporal import TemporalStartError


def _running(settings: Settings) -> StackContext | None:
    context = read_context(settings)
    if context is None or not context.api_url:
        return None
    try:
        httpx.get(f"{context.api_url}/healthz", timeout=3).raise_for_status()
    except httpx.HTTPError:
        return None
    return context


def demo(
    state_dir: Annotated[Path | None, typer.Option(help="Where data and logs live (default ./.berth).")] = None,
) -> None:
    """Narrated walk through the main cases on the local stack; exits 0 only if every step behaved as narrated.

    A slice allocation, an agent that is down, a cancellation, bare metal, a refusal explained, capacity before
    and after."""
    started = time.monotonic()
    settings = Settings(**({"state_dir": state_dir} if state_dir else {}))
    stack: DevStack | None = None
    context = _running(settings)
    if context is not None:
        console.print(f"using the Berth stack already running at {context.api_url}")
    else:
        stack = DevStack(settings, default_fleet_file(), say=lambda line: console.print(line, style="dim"))
        try:
            context = stack.start()
        except AlreadyRunning:
            fail("another `berth up` is starting in this state directory; wait for it, then run `berth demo` again")
        except (PostgresStartError, TemporalStartError, PartFailed, OSError) as exc:
            fail(str(exc))
        console.print(f"Temporal UI: {context.temporal_ui_url}   API: {context.api_url}")
    try:
        passed = Demo(context, console).run()
    finally:
        if stack is not None:
            stack.stop()
    elapsed = time.monotonic() - started
    if not passed:
        fail(f"the demo did not go as narrated ({elapsed:.0f}s)")
    console.print(styled("[bold green]Every step behaved as narrated[/] ({:.0f}s).", elapsed))
    if stack is None and context.api_url:
        console.print(f"See it all in the console: {console_url(context.api_url)} ({sign_in_hint(settings)}).")
    else:
        console.print("See it all in the console: run `berth up`, then open the Console address it prints.")
