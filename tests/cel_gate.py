"""Holding a CEL evaluation where it runs, to show deterministically that it does not run on the event loop.

`gated_evaluation` holds the first evaluation of a selector until the test releases it and notes the thread it runs
in. If evaluation ran on the event loop, holding it would hold the loop: the test could not go on (answer `/healthz`,
run another step) before the release, and `timed_out` would say so once the hold's bound passed (the bound only ends
a failing test; nothing is timed)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.cel.selector import Selector

HOLD_BOUND_SECONDS = 60


@dataclass
class Gate:
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    timed_out: bool = False

    def held_on_the_loop(self) -> bool:
        """Whether an evaluation ran on the main thread (where the tests' event loop runs) or had to be let go."""
        return self.timed_out or threading.main_thread() in self.threads


@pytest.fixture
def gated_evaluation(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    original = Selector._evaluate

    def held(self: Selector, device: Any, request: Any) -> Any:
        gate.threads.append(threading.current_thread())
        gate.entered.set()
        if not gate.release.wait(timeout=HOLD_BOUND_SECONDS):
            gate.timed_out = True
        return original(self, device, request)

    monkeypatch.setattr(Selector, "_evaluate", held)
    return gate


def unique_selector(base: str) -> str:
    """`base` and a clause no other test wrote, so the selector is compiled and evaluated afresh."""
    return f'{base} && device.driver != "{threading.get_ident()}-{id(object())}.example.com"'
