"""What the allocation's first control step answers: the region and the ranked candidates, decided together.

Its own small module (pydantic only) because the workflow imports it, and a workflow module must not pull in the
database layer that `activities.control.placement` needs."""

from __future__ import annotations

from activities.contracts import CandidateList, Model, RegionChoice


class PlacementChoice(Model):
    """Both decisions of one `choose_placement` step. `candidates` is None when the region level refused: the
    cluster level never ran, and the workflow records only the region's step."""

    region: RegionChoice
    candidates: CandidateList | None = None
    # The step refused and recorded the allocation's final step itself (the input's `final`): the workflow ends
    # failed without writing it again. Replay reads it from the step's recorded result.
    final_recorded: bool = False

    def refusal(self) -> RegionChoice | CandidateList | None:
        """The level that refused, if one did."""
        if self.region.region is None:
            return self.region
        if self.candidates is not None and self.candidates.refusal_code is not None:
            return self.candidates
        return None
