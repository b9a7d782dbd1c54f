"""The fleet scheduler for ModelDeployments (docs/seeds.md, seeds 000 to 003). See README.md in this folder. What it
returns, the plan, is `contracts/fleet_plan.py`."""

from scheduler.deployment.manifests import manifest_dict, replica_manifest
from scheduler.deployment.schedule import schedule_deployment

__all__ = ["manifest_dict", "replica_manifest", "schedule_deployment"]
