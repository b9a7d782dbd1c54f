"""Durations and times as a person types them on the command line, read the same way by every flag and refused
before anything is sent, with the flag's name and what would have been taken.

A duration needs its unit (`contracts.durations.typed_duration`, the API's own parser): `--duration 5` is refused
rather than read as five seconds. A time is ISO 8601, or relative to now as `date -d` users write it:

    2026-12-01T09:00:00Z, 2026-12-01 09:00+02:00    ISO 8601; without an offset UTC, a date alone its midnight UTC
    now, today                                      now
    tomorrow, yesterday                             24 hours after / before now (as `date -d` reads them)
    now+30m, +2h, now-1h, -1h                       now plus or minus a duration

Python's `datetime.fromisoformat` reads the ISO forms; no date library is among Berth's dependencies, and the
relative forms are these few, so they are read here and said exactly in every refusal.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from cli.output import fail
from contracts.durations import DURATION_FORMS, typed_duration

TIME_FORMS = (
    "an ISO 8601 time (2026-12-01T09:00:00Z, 2026-12-01 09:00+02:00; UTC without an offset, a date alone its "
    "midnight UTC), now, today, tomorrow or yesterday (24 hours after or before now, as `date -d` reads them), or "
    "now+DURATION, +DURATION, now-DURATION, -DURATION (now+30m, +2h)"
)
_DAYS = {"now": 0, "today": 0, "tomorrow": 1, "yesterday": -1}
_RELATIVE = re.compile(r"(?:now)?\s*([+-])\s*(\S+)")
_DAY_COUNT = re.compile(r"([0-9]+)d")


def seconds(value: str, flag: str, *, days: bool = False) -> float:
    """A duration flag's value in seconds; `days` also takes whole days (`90d`), for lifetimes measured in them."""
    text = value.strip()
    if days and (whole := _DAY_COUNT.fullmatch(text)):
        return int(whole.group(1)) * 86400.0
    try:
        return typed_duration(text)
    except ValueError as error:
        more = "; or whole days, as in 90d" if days else ""
        fail(f"{flag} {error}{more}", reason="invalid_argument")


def duration(value: str | None, flag: str) -> str | None:
    """A duration flag checked here and sent on as typed: the API reads it with the same parser."""
    if value is not None:
        seconds(value, flag)
        return value.strip()
    return None


def instant(value: str, flag: str, now: datetime | None = None) -> datetime:
    """A time flag's value as an aware datetime (see the module's forms); anything else ends the command."""
    text = value.strip()
    now = now or datetime.now(UTC)
    lowered = text.lower()
    if lowered in _DAYS:
        return now + timedelta(days=_DAYS[lowered])
    relative = _RELATIVE.fullmatch(lowered)
    if relative is not None:
        sign, amount = relative.groups()
        try:
            offset = typed_duration(amount)
        except ValueError:
            fail(f"{flag} {value!r}: {amount!r} is not a duration: write {DURATION_FORMS}", reason="invalid_argument")
        return now + timedelta(seconds=offset if sign == "+" else -offset)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{flag} {value!r} is not a time: write {TIME_FORMS}", reason="invalid_argument")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def rfc3339(value: str | None, flag: str) -> str | None:
    """A time flag as the API takes it (RFC 3339 with its offset), or None when the flag was not given."""
    return instant(value, flag).isoformat() if value is not None else None
