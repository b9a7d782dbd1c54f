"""Pure placement functions: the allocation scheduler (region, cluster, node levels), the fleet scheduler for
ModelDeployments (`scheduler.deployment`) and DRA CEL selectors (`scheduler.cel`). See README.md in this folder."""
