"""A workflow module that reads the host's clock when it is imported: every run would start from another value."""

from __future__ import annotations

import datetime

from temporalio import workflow

LOADED_AT = datetime.datetime.now()


@workflow.defn
class ClockAtImport:
    @workflow.run
    async def run(self) -> str:
        return LOADED_AT.isoformat()
