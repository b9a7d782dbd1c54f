"""A pool's per-state deadlines (a Berth addition to the pool spec): how long an allocation may stay in each
non-final state on this pool's hosts before it gives back what it did and fails.

Durations are written as Go and Kubernetes write them (`90s`, `15m`, `1h30m`) or, in a fleet file, as a number of
seconds. Only the states given here change; the others keep the control plane's defaults
(`workflows.allocation.messages.Timing`).

A duration a person types (a `berth` flag, a field of an API body) must carry its unit: `typed_duration` refuses a
bare `5`, which is as likely meant as five hours as five seconds, and says what it accepts. A fleet file keeps its
documented numbers of seconds (`parse_duration`), since a reviewed file reads them next to their field's name.

    nodePools:
    - name: h200-slice
      ...
      deadlines: {provisioning: 15m, waitingReady: 20m}
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field

from contracts.durations import NUMBER, typed_duration
from contracts.manifest import Spec

# The states an allocation can sit in before it is active, then `releasing`; `placing` covers `pending`.
DEADLINE_STATES = ("placing", "planning", "claiming", "provisioning", "waiting_ready", "releasing")


def parse_duration(value: object) -> object:
    """A fleet file's duration: `"1h30m"` -> 5400.0, and a number (or a string of one) is seconds already.
    Anything else is left for pydantic to refuse."""
    if isinstance(value, bool):  # JSON's true is no number of seconds, though Python counts it as 1
        raise ValueError(f"{str(value).lower()} is not a duration (for example 90s, 15m or 1h30m)")
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(NUMBER, text):
            return float(text)
        try:
            return typed_duration(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a duration (for example 90s, 15m or 1h30m)") from None
    return value


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
