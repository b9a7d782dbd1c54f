"""Durations as people type them and as Go and Kubernetes write them (`90s`, `15m`, `1h30m`): one parser for every
`berth` flag, every field of an API body and the fleet file's deadlines, and one printer.

A typed duration must carry its unit: `typed_duration` refuses a bare `5`, which is as likely meant as five hours as
five seconds, and says what it accepts. The API publishes `DURATION_PATTERN` as its fields' JSON Schema pattern, so
a client checks exactly what the server will take.
"""

from __future__ import annotations

import re

NUMBER = r"[0-9]+(?:\.[0-9]+)?"  # ASCII digits only: `\d` would take other scripts' digits too
_PART = re.compile(f"({NUMBER})(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
# What `typed_duration` accepts, exactly: `0`, or numbers each with its unit. The API publishes it as the fields'
# JSON Schema pattern, so what the schema calls well formed and what the parser takes are the same strings.
DURATION_PATTERN = f"^(0|({NUMBER}(h|m|s|ms))+)$"
DURATION_FORMS = "a number and its unit (h, m, s or ms), parts added: 90s, 15m, 2h, 1h30m; 0 needs none"


def typed_duration(text: str) -> float:
    """A duration a person typed, in seconds: `"1h30m"` -> 5400.0. A bare number other than 0 is refused with the
    forms that would be taken; so is anything else that is not a duration."""
    if text == "0":
        return 0.0
    if re.fullmatch(DURATION_PATTERN, text):
        return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text))
    if re.fullmatch(NUMBER, text.strip()):
        n = text.strip()
        raise ValueError(f"{text!r} has no unit: write {n}s, {n}m or {n}h (a duration is {DURATION_FORMS})")
    raise ValueError(f"{text!r} is not a duration: write {DURATION_FORMS}")


def format_duration(seconds: float) -> str:
    """Go's `time.Duration` text, which operators already read in Kubernetes and Temporal: 900 -> "15m0s"."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes:
        return f"{int(minutes)}m{text}"
    return text
