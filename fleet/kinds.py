"""The object kinds a fleet file may hold, and the model each one is validated with."""

from __future__ import annotations

from pydantic import BaseModel

from fleet.cohort import Cohort
from fleet.deployment import ModelDeployment
from fleet.inference_class import InferenceClass
from fleet.inference_cluster import InferenceCluster
from fleet.model_cache import ModelCache
from fleet.model_service import ModelService
from fleet.priority_class import PriorityClass
from fleet.region import Region
from fleet.replica import ModelReplica
from fleet.slot_state import SlotStateDocument
from fleet.tenant import Tenant

KINDS: dict[str, type[BaseModel]] = {
    "Region": Region,
    "Tenant": Tenant,
    "Cohort": Cohort,
    "PriorityClass": PriorityClass,
    "InferenceClass": InferenceClass,
    "InferenceCluster": InferenceCluster,
    "ModelDeployment": ModelDeployment,
    "ModelReplica": ModelReplica,
    "ModelCache": ModelCache,
    "ModelService": ModelService,
    "SlotState": SlotStateDocument,
}

# What a ModelDeployment's placement reads (NodePool: a pool of an InferenceCluster, as an apply reports it): a
# change to one of these makes running deployments re-plan at once rather than at their resync.
PLACEMENT_INPUTS = frozenset({"InferenceCluster", "NodePool", "InferenceClass", "ModelCache"})
