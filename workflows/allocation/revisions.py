"""The allocation workflow's revisions: what each one changed, and which runs this code runs.

A run keeps the revision it was started with (`AllocationInput.revision`, stamped from `REVISION` by client.py), so
a history replays the way it was made: where a change must not reach runs already open, the code branches on the
run's revision instead of on a `workflow.patched` marker, which would cost a history event and a search-attribute
upsert per run. The code keeps the branches of `REVISION` and of the revision before it, no older: an upgrade that
retires a revision first hands over or ends the open runs that need it (docs/design.md, "Upgrading the allocation
workflow"; `python -m workflows.allocation.retire` lists them).

  1  retired: the control steps became local activities, and a refusal is recorded by the placement step itself.
  2  retired: the run that reached `active` continued as new into a hold run (`AllocationInput.held`).
  3  retired: a request that may wait (`AllocationInput.queue`) waits in its region's queue (`queued`).
  4  retired: the run that places the allocation holds it too; it hands over to a fresh run of its own only when
     its history grows long or an operator sends `hand_over`, unsetting the search attributes of the run it leaves.
  5  retired: a release writes `releasing` to the allocation's row before the host's teardown, and its final state
     with the release of the claims, in that step's transaction.
  6  the run starts in `placing` (its search attribute set by the start itself), so the placement decision costs no
     upsert of its own; an allocation with an end publishes the end with `active`, in the same upsert.
  7  the lease's release is registered before the node's plan, not after its answer: a plan whose answer is lost
     (its deadline passed while the agent still planned) may have leased, and the attempt's undo gives that lease
     back at once instead of leaving it to its expiry. A refusal leases nothing, so it drops that undo.
"""

from __future__ import annotations

from workflows.allocation.messages import AllocationInput

REVISION = 7  # what runs started now get
OLDEST = REVISION - 1  # the oldest revision whose runs this code runs
LEASE_UNDONE_BEFORE_PLAN = 7  # the first revision that registers the lease's release before the plan

# A hold begun by a hand-over has in its history only the hold's own commands (its trail written, an extension's or a
# warning's upsert, a timer), and no revision from this one to REVISION changed them while it holds. Until revision
# 7 a hand-over kept the run's revision, so such a run of revision 4 or 5 runs here. A revision that changes what a
# hold does while it holds moves this to itself.
HOLD_UNCHANGED_SINCE = 4


def retired(input: AllocationInput) -> str | None:
    """Why this code cannot run the run started with `input`, or None when it can: a run of a revision older than
    `OLDEST` has commands in its history that no branch here makes any more, unless it is a hold begun by a hand-over
    of a revision since `HOLD_UNCHANGED_SINCE`."""
    if input.revision >= OLDEST:
        return None
    held = input.held
    if held is not None and held.previous_run_id is not None and input.revision >= HOLD_UNCHANGED_SINCE:
        return None
    kind = "a hold run continued at `active`" if held is not None else "a run whose history holds its placement"
    return (
        f"revision {input.revision} is retired (this code runs revisions {OLDEST} and {REVISION}): {kind} of it "
        "must be handed over or end before this code runs it (docs/design.md, 'Upgrading the allocation workflow')"
    )
