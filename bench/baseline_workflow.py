"""The baseline for the allocation throughput benchmark: the same Temporal work as an allocation's happy path, doing
nothing. Its own module, importing nothing heavy, because the workflow sandbox re-imports a workflow's module."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

# The happy path of one allocation, in order: R an activity (select_region, find_candidates, plan_bundles,
# record_claims, create_vm, wait_ready), L a local activity (the audit trail written before the readiness wait and
# before holding the active allocation; the other steps' trail rides with the control activities).
SHAPE = "RRRRRLRL"


@activity.defn(name="noop")
async def noop(step: int) -> int:
    return step


@workflow.defn(name="Baseline")
class BaselineWorkflow:
    @workflow.run
    async def run(self, queue: str) -> int:
        done = 0
        for step, kind in enumerate(SHAPE):
            if kind == "L":
                done += await workflow.execute_local_activity(noop, step, start_to_close_timeout=timedelta(seconds=10))
            else:
                done += await workflow.execute_activity(
                    noop, step, task_queue=queue, start_to_close_timeout=timedelta(seconds=10)
                )
        return done
