"""A pool's per-state deadlines (a Berth addition to the pool spec): how long an allocation may stay in each
non-final state on this pool's hosts before it gives back what it did and fails.

Durations are written as Go and Kubernetes write them (`90s`, `15m`, `1h30m`) or as a number of seconds. Only the
states given here change; the others keep the control plane's defaults (`workflows.allocation_messages.Timing`).

    nodePools:
    - name: h200-slice
      ...
      deadlines: {provisioning: 15m, waitingReady: 20m}
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field

from fleet.meta import Spec

# The states an allocation can sit in before it is active, then `releasing`; `placing` covers `pending`.
DEADLINE_STATES = ("placing", "planning", "claiming", "provisioning", "waiting_ready", "releasing")

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(value: object) -> object:
    """`"1h30m"` -> 5400.0; a number is seconds already. Anything else is left for pydantic to refuse."""
    if isinstance(value, bool):  # JSON's true is no number of seconds, though Python counts it as 1
        raise ValueError(f"{str(value).lower()} is not a duration (for example 90s, 15m or 1h30m)")
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return float(text)
        if text and _PART.sub("", text) == "":
            return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text))
        raise ValueError(f"{value!r} is not a duration (for example 90s, 15m or 1h30m)")
    return value


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


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


class PoolDeadlines(Spec):
    """Overall deadline per state for allocations placed on this pool; unset states keep the defaults."""

    placing: Duration | None = Field(
        default=None, description="Finding a region and candidates (also between attempts); applies once retried."
    )
    planning: Duration | None = Field(default=None, description="The node agent planning and leasing bundles.")
    claiming: Duration | None = Field(default=None, description="Recording the claims in PostgreSQL.")
    provisioning: Duration | None = Field(default=None, description="Creating the VM on the host.")
    waiting_ready: Duration | None = Field(default=None, description="The VM passing its readiness gates.")
    releasing: Duration | None = Field(
        default=None,
        description="Destroying and wiping on the host; past it the slots are quarantined and the release completes.",
    )

    def seconds(self) -> dict[str, float]:
        """The states this pool sets, in seconds: what PostgreSQL keeps and the workflow receives."""
        return {state: value for state in DEADLINE_STATES if (value := getattr(self, state)) is not None}
