"""A workflow whose code reaches the host's clock, randomness and files in the ways Temporal's sandbox refuses: each
of these would make a history that replays differently (or not at all) on another worker."""

from __future__ import annotations

import datetime
import random
import time
import uuid

from temporalio import workflow

from tests.workflows.sandbox_probe import host_clock

REACHES = {
    "time.time": lambda: time.time(),
    "datetime.now": lambda: datetime.datetime.now(),
    "random.random": lambda: random.random(),
    "uuid.uuid4": lambda: uuid.uuid4(),
    "open": lambda: open("/etc/hostname").read(),  # noqa: SIM115 - the read is what is refused
    "a helper's time.time": lambda: host_clock.seconds_now(),
    "workflow.now": lambda: workflow.now(),  # the deterministic way: runs
}


@workflow.defn
class ReachesOut:
    @workflow.run
    async def run(self, reach: str) -> str:
        return str(REACHES[reach]())
