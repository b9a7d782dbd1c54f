"""`berth worker control`, `berth worker node --node-id N` and `berth worker agents`: run a Temporal worker in the
foreground.

The node commands are what a GPU host runs, so this module imports at its top only what they need; the control
worker's stack (worker.py: SQLAlchemy, the workflows, the cluster drivers) is imported inside `control`, and the
agents' (agent/serve.py) inside `node` and `agents`, libvirt's only with `--runtime libvirt`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.output import fail
from config import tracing
from config.context import NotConfigured, database_url
from config.settings import Settings
from config.temporal import NoGateway, connect, connect_node
from devstack.ready import mark_ready
from fleet.errors import FleetError

if TYPE_CHECKING:
    from agent.credential import NodeCredential
    from agent.libvirt.driver import LibvirtSettings

app = typer.Typer(help="Run Berth's Temporal workers.", no_args_is_help=True, add_completion=False)


ReadyFileOption = Annotated[
    Path | None,
    typer.Option("--ready-file", hidden=True, help="Write this process's pid here once serving (berth up's cue)."),
]


@app.command("control")
def control(ready_file: ReadyFileOption = None) -> None:
    """The control-plane worker: allocation workflows and control activities on `berth.control`."""
    import worker
    from store.db import create_engine, session_factory

    settings = Settings()

    async def main() -> None:
        tracing.configure("berth-control")
        engine = create_engine(database_url(settings))
        try:
            await worker.run_control(
                await connect(settings, patiently=True),
                session_factory(engine),
                settings.control_task_queue,
                ready=(lambda: mark_ready(ready_file)) if ready_file else None,
            )
        finally:
            await engine.dispose()

    try:
        asyncio.run(main())
    except (NotConfigured, worker.MissingSearchAttributes) as exc:
        fail(str(exc))
    except RuntimeError as exc:
        fail(f"cannot run the control worker: {exc}")


class Topology(StrEnum):
    HOST = "host"
    SIMULATED = "simulated"


class Runtime(StrEnum):
    LIBVIRT = "libvirt"
    SIMULATED = "simulated"


@app.command("node")
def node(
    node_id: Annotated[str, typer.Option("--node-id", help="The host's node name in the fleet.")],
    topology: Annotated[
        Topology, typer.Option("--topology", help="host: discover this machine from sysfs; simulated: the fleet entry.")
    ] = Topology.SIMULATED,
    fleet: Annotated[
        Path | None, typer.Option("--fleet", "-f", help="Fleet file describing the simulated host.")
    ] = None,
    host_root: Annotated[
        Path | None, typer.Option("--host-root", help="Read sysfs under this directory instead of / (host topology).")
    ] = None,
    api: Annotated[str | None, typer.Option("--api", help="The API to report to [env BERTH_API_URL].")] = None,
    gateway: Annotated[
        str | None, typer.Option("--gateway", help="host:port of the node gateway [env BERTH_NODE_GATEWAY].")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="This node's token, reread every 2 s [env BERTH_NODE_TOKEN_FILE; or the token in BERTH_NODE_TOKEN].",
        ),
    ] = None,
    runtime: Annotated[
        Runtime,
        typer.Option(
            "--runtime",
            help="libvirt: VMs on this host's libvirt (with --topology simulated: real VMs, the fleet entry's GPUs "
            "as bookkeeping only).",
        ),
    ] = Runtime.SIMULATED,
    libvirt_config: Annotated[
        Path | None,
        typer.Option(
            "--libvirt-config",
            help="YAML of the libvirt runtime's settings (uri, storage_pool, images, network, accelerator, ...); "
            "the options below override it.",
        ),
    ] = None,
    libvirt_uri: Annotated[str | None, typer.Option("--libvirt-uri", help="[env BERTH_LIBVIRT_URI]")] = None,
    storage_pool: Annotated[str | None, typer.Option("--storage-pool", help="[env BERTH_LIBVIRT_POOL]")] = None,
    network: Annotated[
        str | None, typer.Option("--network", help="libvirt network [env BERTH_LIBVIRT_NETWORK]")
    ] = None,
    bridge: Annotated[str | None, typer.Option("--bridge", help="host bridge [env BERTH_LIBVIRT_BRIDGE]")] = None,
    image_catalogue: Annotated[
        Path | None, typer.Option("--image-catalogue", help="YAML image catalogue [env BERTH_IMAGE_CATALOGUE]")
    ] = None,
) -> None:
    """A node agent on `berth.node.<node-id>`: reports its host to the API with its node token, plans, runs VMs.
    It reaches Temporal only through the node gateway, with the same token (never an argument: see --token-file)."""
    from agent import serve
    from agent.credential import CredentialError
    from agent.reporter import HttpReportSink, NodeReporter

    settings = Settings()
    if gateway is not None:
        settings.node_gateway = gateway
    try:
        libvirt = None
        if runtime is Runtime.LIBVIRT:
            libvirt = _libvirt_settings(
                settings, libvirt_config, libvirt_uri, storage_pool, network, bridge, image_catalogue
            )
        if topology is Topology.HOST:
            agent = serve.host_agent(node_id, settings.state_dir, host_root or settings.host_root, libvirt=libvirt)
        else:
            fleet_file = fleet or _default_fleet(settings)
            agent = serve.simulated_agent(fleet_file, node_id, settings.state_dir, libvirt=libvirt)
    except typer.Exit:
        raise
    except (FleetError, ValueError, OSError) as exc:
        fail(str(exc))
    except ImportError as exc:
        fail(f"--runtime libvirt needs libvirt-python: pip install -e '.[host]' (Debian: libvirt-dev first): {exc}")
    except Exception as exc:  # noqa: BLE001 - libvirt.libvirtError (a host without libvirtd): one line, no traceback
        fail(f"cannot open libvirt: {exc}")
    api_url = api or settings.api_url
    try:
        credential = _credential(token_file or settings.node_token_file, settings.node_token)
    except CredentialError as exc:
        fail(str(exc))
    if topology is Topology.HOST and not api_url:
        fail(
            "a host agent reports to the control plane and learns its approved slots from it: give --api URL "
            "(or BERTH_API_URL)"
        )
    reporter = (
        NodeReporter(agent, HttpReportSink(api_url, credential.current()), settings.report_interval_seconds)
        if api_url
        else None
    )

    async def main() -> None:
        tracing.configure("berth-agent")
        client = await connect_node(settings, credential.current())
        queue = f"{settings.node_task_queue_prefix}{node_id}"
        await serve.run_node(client, agent, queue, reporter, credential, alive=settings.liveness_file)

    _serve(main, "the node agent")


@app.command("agents")
def agents(
    token_dir: Annotated[
        Path,
        typer.Option(
            "--token-dir",
            help="Each node's token in DIR/<node> (`berth tokens create --node N --to-dir`), reread every 2 s.",
        ),
    ],
    fleet: Annotated[
        Path | None, typer.Option("--fleet", "-f", help="Fleet file describing the simulated hosts.")
    ] = None,
    nodes: Annotated[
        list[str] | None,
        typer.Option("--node", help="A host to serve (repeat); default every host whose agent is not agentDown."),
    ] = None,
    api: Annotated[str | None, typer.Option("--api", help="The API to report to (env BERTH_API_URL).")] = None,
    libvirt_config: Annotated[
        Path | None,
        typer.Option(
            "--libvirt-config",
            help="Run these hosts' VMs for real on this machine's libvirt, with the settings in this YAML file "
            "(`berth up --real-vms` writes it); their GPUs stay the fleet's bookkeeping.",
        ),
    ] = None,
    ready_file: ReadyFileOption = None,
) -> None:
    """Simulated node agents for several hosts of a fleet in one process, each on `berth.node.<node>` with its own
    leases and reports (what `berth up` runs; a real host runs `berth worker node`)."""
    from agent import serve
    from agent.credential import CredentialError, NodeCredential
    from agent.reporter import HttpReportSink, NodeReporter
    from devstack.agents import reporting
    from fleet.loader import load_fleet

    settings = Settings()
    fleet_file = fleet or _default_fleet(settings)
    try:
        if not nodes:
            nodes = [
                n.name for p in load_fleet([fleet_file]).host_pools() for n in p.nodes if not n.simulation.agent_down
            ]
        libvirt = _libvirt_settings(settings, libvirt_config) if libvirt_config is not None else None
        served = [serve.simulated_agent(fleet_file, node, settings.state_dir, libvirt=libvirt) for node in nodes]
    except typer.Exit:
        raise
    except (FleetError, ValueError, OSError) as exc:
        fail(str(exc))
    except ImportError as exc:
        fail(f"--libvirt-config needs libvirt-python: pip install -e '.[host]' (Debian: libvirt-dev first): {exc}")
    except Exception as exc:  # noqa: BLE001 - libvirt.libvirtError (no libvirtd): one line, no traceback
        fail(f"cannot open libvirt: {exc}")
    api_url = api or settings.api_url
    try:
        credentials = {agent.node: NodeCredential(path=token_dir / agent.node) for agent in served}
    except CredentialError as exc:
        fail(str(exc))
    reporters = {
        agent.node: NodeReporter(
            agent, HttpReportSink(api_url, credentials[agent.node].current()), settings.report_interval_seconds
        )
        for agent in served
        if api_url
    }
    ready = reporting(list(reporters.values()), ready_file)

    async def main() -> None:
        hosted = [
            serve.HostedNode(
                agent,
                await connect_node(settings, credentials[agent.node].current()),
                reporters.get(agent.node),
                credentials[agent.node],
            )
            for agent in served
        ]
        await serve.run_nodes(hosted, settings.node_task_queue_prefix, ready=ready)

    _serve(main, "the node agents")


def _default_fleet(settings: Settings) -> Path:
    """BERTH_FLEET_FILE, else the repository's example fleet. The example's path comes from the dev stack's module,
    which imports the control plane: only a developer's agent without a fleet file pays for it, never a host's
    (`berth up` passes --fleet)."""
    if settings.fleet_file is not None:
        return settings.fleet_file
    from devstack.stack import default_fleet_file

    return default_fleet_file()


def _credential(path: Path | None, token: str | None) -> NodeCredential:
    """The node's token from its file, else from BERTH_NODE_TOKEN: never from an argument, which every user of the
    host could read in /proc."""
    from agent.credential import CredentialError, NodeCredential

    if path is not None:
        return NodeCredential(path=path)
    if token:
        return NodeCredential(token=token)
    raise CredentialError(
        "a node agent needs its node token: --token-file FILE (or BERTH_NODE_TOKEN_FILE, or the token in "
        "BERTH_NODE_TOKEN); `berth tokens create --node NODE --to-dir DIR` makes it"
    )


def _serve(main: Callable[[], Coroutine[Any, Any, None]], what: str) -> None:
    """Run an agent until it is signalled; a missing setting or a refused start is one line, not a traceback."""
    try:
        asyncio.run(main())
    except (NotConfigured, NoGateway) as exc:
        fail(str(exc))
    except RuntimeError as exc:
        fail(f"cannot run {what}: {exc}")


def _libvirt_settings(
    settings: Settings,
    config_file: Path | None,
    uri: str | None = None,
    pool: str | None = None,
    network: str | None = None,
    bridge: str | None = None,
    catalogue_file: Path | None = None,
) -> LibvirtSettings:
    from agent.libvirt.driver import ImageCatalogue, LibvirtSettings

    catalogue_file = catalogue_file or settings.image_catalogue
    if config_file is not None:
        catalogue = ImageCatalogue.load(catalogue_file) if catalogue_file is not None else None
        return LibvirtSettings.load(
            config_file,
            uri=uri,
            storage_pool=pool,
            network=network,
            bridge=bridge,
            images=catalogue.images if catalogue else None,
            default_image=catalogue.default if catalogue else None,
        )
    if catalogue_file is None:
        fail(
            "--runtime libvirt needs an image catalogue: --image-catalogue FILE (images: {name: base.qcow2}) "
            "or a --libvirt-config that lists its images"
        )
    catalogue = ImageCatalogue.load(catalogue_file)
    return LibvirtSettings(
        uri=uri or settings.libvirt_uri,
        storage_pool=pool or settings.libvirt_pool,
        images=catalogue.images,
        default_image=catalogue.default,
        network=network or (None if bridge or settings.libvirt_bridge else settings.libvirt_network),
        bridge=bridge or settings.libvirt_bridge,
        seed_dir=settings.state_dir / "seeds",
    )
