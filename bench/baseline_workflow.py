"""The baselines for the allocation throughput benchmark: the Temporal work of an allocation's happy path, doing
nothing else. Its own module, importing nothing heavy, because the workflow sandbox re-imports a workflow's module.

Two shapes, both measured in the same run as the allocations:

- `strict`: the same activities and local activities, as no-ops (the baseline the throughput target is set against).
- `visibility`: the same, plus the search-attribute upserts an allocation makes (one per change of state, and the
  one `workflow.patched` makes). Those are Temporal's work, demanded of every allocation so the UI can list and
  filter them, and on the dev server's SQLite each is a visibility write costing more than an activity.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import SearchAttributeKey

# The happy path of one allocation to `active`, in order, as the design's flow first named its steps. R an activity
# (select_region, find_candidates, plan_bundles, record_claims, create_vm, wait_ready); L a local activity (the
# audit trail written before the readiness wait and before holding the active allocation); U a search-attribute
# upsert (placing, planning, claiming, provisioning, waiting_ready, active); P the patch marker with its own upsert.
# The shapes stay as they were defined, a fixed yardstick, while the allocation itself came to do less Temporal
# work than they (control steps as local activities, the create taking the first readiness look): so its ratios
# compare across changes (docs/benchmarks.md).
SHAPES = {
    "strict": "RRRRRLRL",
    "visibility": "PURRURURURULRUL",
}

STATE = SearchAttributeKey.for_keyword("BerthState")


class BaselineInput(BaseModel):
    queue: str
    shape: str


@activity.defn(name="noop")
async def noop(step: int) -> int:
    return step


@workflow.defn(name="Baseline")
class BaselineWorkflow:
    @workflow.run
    async def run(self, input: BaselineInput) -> int:
        done = 0
        for step, kind in enumerate(SHAPES[input.shape]):
            if kind == "L":
                done += await workflow.execute_local_activity(noop, step, start_to_close_timeout=timedelta(seconds=10))
            elif kind == "R":
                done += await workflow.execute_activity(
                    noop, step, task_queue=input.queue, start_to_close_timeout=timedelta(seconds=10)
                )
            elif kind == "U":
                workflow.upsert_search_attributes([STATE.value_set(f"step-{step}")])
            elif kind == "P":
                workflow.patched("baseline")
        return done
