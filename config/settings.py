"""Berth's settings, read from `BERTH_*` environment variables.

Defaults point at the embedded development stack that `berth up` starts, whose addresses are recorded in
`<state dir>/context.json`; in production every value comes from the environment (see docker-compose.yml).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.identity import OidcSettings
from contracts.task_queues import CONTROL_QUEUE, NODE_QUEUE_PREFIX

if TYPE_CHECKING:  # httpx, which it needs, is more than a node agent should carry: imported when used
    from config.temporal_credentials import ClientCredentials


def default_state_dir() -> Path:
    return Path.cwd() / ".berth"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BERTH_", extra="ignore")

    state_dir: Path = Field(default_factory=default_state_dir, description="Where the dev stack keeps its data.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+asyncpg://berth@127.0.0.1:5432/berth. "
        "Unset: the embedded PostgreSQL recorded in the state dir's context.json.",
    )
    temporal_address: str | None = Field(default=None, description="host:port of the Temporal frontend.")
    temporal_namespace: str = "default"
    temporal_ui_url: str | None = Field(
        default=None, description="The Temporal Web UI's address, for the console's links to a workflow's page."
    )
    temporal_tls: bool = False
    temporal_tls_cert: Path | None = None
    temporal_tls_key: Path | None = None
    temporal_tls_ca: Path | None = None
    control_task_queue: str = CONTROL_QUEUE
    node_task_queue_prefix: str = NODE_QUEUE_PREFIX
    fleet_file: Path | None = Field(
        default=None, description="Fleet file `berth up` applies; default examples/fleet.yaml."
    )
    api_url: str | None = Field(default=None, description="The API node agents report to (`berth worker node`).")
    node_token: str | None = Field(default=None, description="A node agent's own token (`berth tokens create --node`).")
    node_token_file: Path | None = Field(
        default=None, description="A file holding the node agent's token, reread every 2 s (rotation without restart)."
    )
    node_gateway: str | None = Field(
        default=None,
        description="host:port of the node gateway (`berth gateway`): the only way a node agent reaches Temporal.",
    )
    node_gateway_ca: Path | None = Field(
        default=None, description="CA bundle a node agent verifies the gateway's TLS certificate with (TLS when set)."
    )
    gateway_listen: str = Field(default="127.0.0.1:7236", description="Where `berth gateway` serves node agents.")
    gateway_key_file: Path | None = Field(
        default=None,
        description="The gateway's task-token sealing key (at least 32 bytes), shared by its replicas and kept across "
        "restarts; unset, a random key per process.",
    )
    gateway_tls_cert: Path | None = Field(default=None, description="The gateway's serving certificate (PEM chain).")
    gateway_tls_key: Path | None = Field(default=None, description="The gateway's serving private key (PEM).")
    report_interval_seconds: float = Field(
        default=60.0, ge=1.0, description="How often node agents report; an agent is down after 3 missed reports."
    )
    liveness_file: Path | None = Field(
        default=None,
        description="A file the control worker or a node agent touches every 10 s while it runs (a Kubernetes "
        "liveness probe reads its age: deploy/kubernetes).",
    )
    host_root: Path = Field(default=Path("/"), description="Where a real node agent reads sysfs from (tests: a tree).")
    libvirt_uri: str = Field(default="qemu:///system", description="The libvirt connection of a libvirt runtime.")
    libvirt_pool: str = Field(default="default", description="The storage pool VM boot overlays are made in.")
    libvirt_network: str | None = Field(default="default", description="The libvirt network VMs join.")
    libvirt_bridge: str | None = Field(default=None, description="A host bridge VMs join instead of a network.")
    breaker_failures: int = Field(
        default=3, ge=0, description="Failed attempts on a node within the window that make it cool off (0: never)."
    )
    breaker_window_seconds: float = Field(default=300.0, gt=0, description="The node breaker's window.")
    breaker_cooloff_seconds: float = Field(
        default=600.0, gt=0, description="How long a tripped node is left out of ranking, from its latest failure."
    )
    api_max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="The largest request body the API reads (an allocation request is a few KiB); larger is a 413.",
    )
    api_max_manifest_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="The largest fleet file (`PUT /v1/fleet`) or deployment manifest the API reads.",
    )
    api_max_report_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="The largest node report the API reads: twice the largest host inventory it stores "
        "(scheduler/host/inventory.py MAX_HOST_BYTES), so a report between the two is refused naming the inventory.",
    )
    image_catalogue: Path | None = Field(default=None, description="YAML: images: {name: base qcow2 path}, default.")
    usage_retention_days: float = Field(
        default=90.0,
        gt=0,
        description="How long the usage ledger keeps raw intervals before the reconciler rolls "
        "them up per hour (per tenant, product, region, pool, class and shape).",
    )
    request_log_retention_days: float = Field(
        default=90.0, gt=0, description="How long the API's request log (who asked what) keeps its records."
    )
    cluster_secrets_dir: Path | None = Field(
        default=None,
        description="Where the operator mounts the kubeconfig Secrets of real InferenceClusters, one directory per "
        "Secret and one file per key (`<dir>/<secretRef.name>/<secretRef.key>`, as Kubernetes mounts a Secret).",
    )

    # People log in with the company's OIDC provider (api/oidc.py); unset, only Berth tokens are accepted.
    oidc_issuer_url: str | None = Field(
        default=None, description="The OIDC issuer people log in with, exactly as its discovery document names it."
    )
    oidc_client_id: str | None = Field(
        default=None, description="The OIDC client `berth login` uses; ID tokens must carry it as their audience."
    )
    oidc_username_claim: str = Field(default="email", description="The ID token claim that names a person.")
    oidc_groups_claim: str = Field(default="groups", description="The ID token claim that lists a person's groups.")
    oidc_roles: dict[str, list[str]] = Field(
        default_factory=dict,
        description='JSON: group -> grants, e.g. {"ml-team": ["member:acme"], "sre": ["operator"]}; a grant is '
        "viewer:<tenant>, member:<tenant>, operator or admin.",
    )
    oidc_client_secret: str | None = Field(
        default=None,
        description="`berth login`'s client secret, for a provider whose CLI client must have one (Google's).",
    )
    # How the API verifies ID tokens; the defaults, bounds and meanings are OidcSettings' own.
    oidc_leeway_seconds: int = OidcSettings.model_fields["leeway_seconds"].default
    oidc_jwks_refresh_seconds: float = OidcSettings.model_fields["jwks_refresh_seconds"].default
    oidc_jwks_max_age_seconds: float = OidcSettings.model_fields["jwks_max_age_seconds"].default
    person_creates_per_second: float | None = Field(
        default=None, gt=0, description="Each person's (and service account's) allocation creates per second."
    )
    person_create_burst: int = Field(default=20, ge=1, description="The burst of each person's create limit.")

    # The control plane's own token at Temporal, where Temporal's authorizer is on (config/temporal_credentials.py).
    temporal_oidc_token_url: str | None = Field(
        default=None, description="The token endpoint the control plane gets its Temporal token from."
    )
    temporal_oidc_client_id: str | None = Field(default=None, description="The control plane's client at it.")
    temporal_oidc_client_secret: str | None = Field(default=None, description="That client's secret.")
    temporal_oidc_scope: str | None = Field(
        default=None, description="The scope to ask for, if the provider needs one."
    )

    @property
    def temporal_credentials(self) -> ClientCredentials | None:
        """The control plane's client-credentials token source for Temporal, when one is configured."""
        wanted = (self.temporal_oidc_token_url, self.temporal_oidc_client_id, self.temporal_oidc_client_secret)
        if not any(wanted):
            return None
        if not all(wanted):
            raise ValueError(
                "BERTH_TEMPORAL_OIDC_TOKEN_URL, BERTH_TEMPORAL_OIDC_CLIENT_ID and BERTH_TEMPORAL_OIDC_CLIENT_SECRET "
                "go together: set all three, or none"
            )
        token_url, client_id, secret = wanted
        assert token_url and client_id and secret
        from config.temporal_credentials import ClientCredentials

        return ClientCredentials(token_url, client_id, secret, self.temporal_oidc_scope)

    @property
    def oidc(self) -> OidcSettings | None:
        """What api/oidc.py verifies ID tokens against, when an issuer is configured."""
        if self.oidc_issuer_url is None:
            return None
        if self.oidc_client_id is None:
            raise ValueError("BERTH_OIDC_ISSUER_URL is set without BERTH_OIDC_CLIENT_ID (the audience of ID tokens)")
        return OidcSettings(
            issuer=self.oidc_issuer_url,
            client_id=self.oidc_client_id,
            username_claim=self.oidc_username_claim,
            groups_claim=self.oidc_groups_claim,
            roles=self.oidc_roles,
            leeway_seconds=self.oidc_leeway_seconds,
            jwks_refresh_seconds=self.oidc_jwks_refresh_seconds,
            jwks_max_age_seconds=self.oidc_jwks_max_age_seconds,
        )

    @property
    def context_file(self) -> Path:
        return self.state_dir / "context.json"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
