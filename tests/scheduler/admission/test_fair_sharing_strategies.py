"""Fair-sharing preemption by its tree's strategies, checked against Kueue's fair_strategy.go and its documented
rules (concepts/preemption, "Fair Sharing"):

- the first strategy a root lists judges each candidate, the largest share's tenant first; a candidate that does
  not pass is kept for the second phase;
- a second strategy (Kueue allows only LessThanInitialShare there) takes at most one allocation per tenant, and
  only its own victims limit it: a tenant that lost an allocation to the first phase may lose one more there;
- where the shares decided, the rule is named InCohortFairSharing (a preemptor within its nominal quota reclaims
  whatever the shares, named InCohortReclamation: test_preemption_trees.py).
"""

from __future__ import annotations

import dataclasses

from contracts.vocabulary import FairSharingStrategy
from scheduler.admission.preemption import Running, plan_preemption
from scheduler.snapshot import Snapshot
from tests.scheduler.admission.test_preemption_trees import FAIR, preemptor, reclaiming, running, victims
from tests.scheduler.admission.test_queueing import ONE_H100_NODE, Tenant, world

FINAL = FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE
INITIAL = FairSharingStrategy.LESS_THAN_INITIAL_SHARE


def _b_borrows_everything(*strategies: FairSharingStrategy) -> tuple[Snapshot, list[Running]]:
    """a and b have no quota of their own and share the cohort's 8 fairly; b holds all of it as 2, 2 and 4 GPUs
    (held-2, the 4, the newest). `strategies`: the root's, where given."""
    tenants: dict[str, Tenant] = {"a": (0, 1, "lab"), "b": (0, 1, "lab")}
    fleet = reclaiming(
        world(ONE_H100_NODE, ("b", "a01", 2), ("b", "a01", 2), ("b", "a01", 4), tenants=tenants, cohorts=FAIR), "a"
    )
    if strategies:
        lab = dataclasses.replace(fleet.cohorts["lab"], preemption_strategies=strategies)
        fleet = Snapshot(
            regions=fleet.regions.values(),
            pools=fleet.pools,
            nodes=fleet.nodes.values(),
            tenants=fleet.tenants.values(),
            cohorts=[lab],
        )
    sizes = (2, 2, 4)
    return fleet, [running(f"held-{i}", "b", "a01", gpus, 10.0 + i) for i, gpus in enumerate(sizes)]


def test_the_second_strategy_may_take_from_a_tenant_the_first_already_took_from() -> None:
    # a asks for 5: with it, a's share is 5/8. First phase (LessThanOrEqualToFinalShare), newest first: held-2 (4)
    # would leave b at 4/8 < 5/8, kept for later; held-1 leaves b at 6/8: taken; then held-0 would leave b at 4/8:
    # kept. Not enough (8 - 2 + 5 > 8). Second phase (LessThanInitialShare): b, now at 6/8 > 5/8, gives held-2, the
    # first it kept; 8 - 6 + 5 fits.
    fleet, b_running = _b_borrows_everything()
    outcome = plan_preemption(fleet, "r1", preemptor("a", 5), b_running, "quota_exceeded")
    assert victims(outcome) == ["held-1", "held-2"]
    assert {outcome.reasons[v] for v in ("held-1", "held-2")} == {
        "reclaimWithinCohort Any: its tenant borrows in cohort lab (Kueue: InCohortFairSharing)"
    }


def test_a_root_that_lists_only_the_first_strategy_stops_after_it() -> None:
    fleet, b_running = _b_borrows_everything(FINAL)
    outcome = plan_preemption(fleet, "r1", preemptor("a", 5), b_running, "quota_exceeded")
    assert outcome == "displacing every allocation its policy allows would still not fit its quota"


def test_a_root_that_lists_only_less_than_initial_share_judges_the_first_phase_by_it() -> None:
    # LessThanInitialShare alone: held-2 goes (5/8 < b's 8/8); then b is at 4/8, below a's 5/8: nothing more.
    fleet, b_running = _b_borrows_everything(INITIAL)
    assert isinstance(plan_preemption(fleet, "r1", preemptor("a", 5), b_running, "quota_exceeded"), str)
    # A request of 3 fits once held-2 has gone: 8 - 4 + 3.
    assert victims(plan_preemption(fleet, "r1", preemptor("a", 3), b_running, "quota_exceeded")) == ["held-2"]
