"""The types that cross a process boundary: activity inputs and results, their declarations (steps.py), audit and
deployment messages, the scheduler's requests and answers, the fleet plan, cluster connections and observations,
task-queue names. Data only (pydantic, and temporalio's activity declarations), importing nothing of Berth: every
wing imports them downward, so both sides of each call agree on its shape."""
