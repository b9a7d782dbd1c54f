"""The deployment's CEL selectors, compiled once, and their verdict on each published device, decided once.

Every cluster publishing a pool of class X shows the scheduler the same devices, so a verdict is a function of
(expression, class, device) and never of the cluster. Remembering it here means a fleet of a thousand clusters
costs as many CEL evaluations as there are distinct (selector, device) pairs, not one per pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet.inference_class import Device
from scheduler.cel import SelectorRuntimeError, compile_selector


@dataclass(frozen=True)
class Verdict:
    matches: bool
    error: str | None = None  # a runtime error: the device does not match, and this says why


class DeviceSelectors:
    def __init__(self, expressions: Iterable[str]) -> None:
        """Compiles every expression in order; raises SelectorCompileError for the first that does not compile."""
        self._compiled = {}
        for expression in expressions:
            if expression not in self._compiled:
                self._compiled[expression] = compile_selector(expression)
        self._verdicts: dict[tuple[str, str, str], Verdict] = {}

    def verdict(self, expression: str, class_name: str, device: Device) -> Verdict:
        key = (expression, class_name, device.name)
        found = self._verdicts.get(key)
        if found is None:
            try:
                found = Verdict(matches=self._compiled[expression].matches(device.as_cel_device()))
            except SelectorRuntimeError as exc:
                found = Verdict(matches=False, error=str(exc))
            self._verdicts[key] = found
        return found

    @property
    def pairs_evaluated(self) -> int:
        """Distinct (selector, device) pairs this pass asked about."""
        return len(self._verdicts)
