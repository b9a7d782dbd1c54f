"""What the routes work with: the database sessions, the control plane in Temporal, the workflow settings and the
metrics, built once per application and reached through the `services` dependency."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from api.admission_passes import AdmissionPasses
from api.heartbeats import Heartbeats
from api.metrics import Metrics
from api.oidc import OidcVerifier
from api.rate_limit import CreateLimits
from api.temporal import ControlPlane
from store.db import AsyncSession, async_sessionmaker
from store.inventory import InventoryCache
from store.token_cache import TokenCache
from workflows.allocation.messages import Timing
from workflows.deployment.messages import DeploymentTiming


@dataclass
class Services:
    control: ControlPlane
    timing: Timing  # what every allocation workflow the API starts is told about waits
    metrics: Metrics
    database: async_sessionmaker[AsyncSession] | None = None  # None until the app's lifespan opens it
    deployment_timing: DeploymentTiming = field(default_factory=DeploymentTiming)  # for deployment workflows
    inventory: InventoryCache = field(default_factory=InventoryCache)  # explain and capacity read through it
    heartbeats: Heartbeats = field(default_factory=Heartbeats)  # agents' steady reports, written in batches
    tokens: TokenCache = field(default_factory=TokenCache)  # verified node tokens; revocations swept within seconds
    create_limits: CreateLimits = field(default_factory=CreateLimits)  # per-tenant and per-person create buckets
    oidc: OidcVerifier | None = None  # people's ID tokens, when an issuer is configured (api/oidc.py)
    admission_passes: AdmissionPasses = field(init=False)  # asks for an admission pass when capacity may have grown

    def __post_init__(self) -> None:
        self.admission_passes = AdmissionPasses(self.control)

    @property
    def sessions(self) -> async_sessionmaker[AsyncSession]:
        if self.database is None:
            raise RuntimeError("the API's database is not open: run it through its lifespan (uvicorn) or inject one")
        return self.database


async def services(request: Request) -> Services:
    """Async on purpose: FastAPI runs a plain function dependency in a worker thread, on every request."""
    return request.app.state.services
