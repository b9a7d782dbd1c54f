"""The parts of the dev stack as supervised child processes: what each runs, where it logs, when it is ready.

    postgres        the embedded PostgreSQL server        ready: pg_isready answers
    temporal        the Temporal dev server and its UI     ready: both ports accept connections
    control-worker  `berth worker control`                 ready: its workers started (ready file)
    api             uvicorn serving api.app:create_app     ready: its port accepts connections
    gateway         `berth gateway` (the node gateway)     ready: serving (ready file)
    agents[-k]      `berth worker agents --node ...`       ready: workers started and every host's first report answered

Settings reach the Python children as BERTH_* variables (config/settings.py reads them), never as arguments; node
tokens reach the agents as files of mode 0600 under the state directory. The agents are given the API's and the node
gateway's addresses and nothing else of the control plane: no Temporal address, no database URL (`agent_env`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from config.settings import Settings
from devstack.ports import port_open
from devstack.postgres import EmbeddedPostgres
from devstack.ready import is_marked_ready
from devstack.supervisor import Part
from devstack.temporal import DevTemporal

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTROL_WORKER = "control-worker"
API = "api"
GATEWAY = "gateway"
# What only the control plane may know; agents reach Temporal through the gateway and PostgreSQL not at all.
CONTROL_PLANE_ONLY = (
    "BERTH_DATABASE_URL",
    "BERTH_TEMPORAL_ADDRESS",
    "BERTH_TEMPORAL_TLS",
    "BERTH_TEMPORAL_TLS_CERT",
    "BERTH_TEMPORAL_TLS_KEY",
    "BERTH_TEMPORAL_TLS_CA",
    "BERTH_GATEWAY_KEY_FILE",
    "BERTH_GATEWAY_TLS_KEY",
)


def child_env(settings: Settings, **values: str) -> dict[str, str]:
    """This environment with every setting written as the BERTH_* variable Settings reads back, then `values`."""
    env = dict(os.environ)
    for name in Settings.model_fields:
        env.pop(f"BERTH_{name.upper()}", None)
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"BERTH_{name.upper()}"] = json.dumps(value) if isinstance(value, dict | list) else str(value)
    env.update(values)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return env


def agent_env(env: Mapping[str, str]) -> dict[str, str]:
    """The control plane's child environment without what only the control plane may know."""
    return {name: value for name, value in env.items() if name not in CONTROL_PLANE_ONLY}


def postgres_part(server: EmbeddedPostgres, user: str | None) -> Part:
    return Part(
        "postgres",
        server.command(),
        server.log_file,
        user=user,
        stop_signal=signal.SIGINT,  # fast shutdown: roll back open transactions, then exit cleanly
        ready=lambda _pid: server.is_ready(),
        before_start=server.clear_stale_pid_file,
    )


def temporal_part(server: DevTemporal) -> Part:
    return Part("temporal", server.command(), server.log_file, ready=lambda _pid: server.is_ready())


def _berth_part(name: str, arguments: list[str], state: Path, env: Mapping[str, str]) -> Part:
    """A `berth ...` command that writes its pid to a ready file once it serves."""
    ready_file = state / "run" / f"{name}.ready"
    return Part(
        name,
        [sys.executable, "-m", "cli.main", *arguments, "--ready-file", str(ready_file)],
        state / "logs" / f"{name}.log",
        env=env,
        ready=lambda pid: is_marked_ready(ready_file, pid),
        before_start=lambda: ready_file.unlink(missing_ok=True),
    )


def control_worker_parts(count: int, state: Path, env: Mapping[str, str]) -> list[Part]:
    """`count` control workers on the one control task queue (Temporal shares the work out): `control-worker`,
    then `control-worker-2`, `control-worker-3`, ...; each touches `run/<name>.alive` while it runs, as a pod does
    for its probes (deploy/kubernetes)."""
    names = [CONTROL_WORKER, *(f"{CONTROL_WORKER}-{n}" for n in range(2, count + 1))]
    return [
        _berth_part(name, ["worker", "control"], state, {**env, "BERTH_LIVENESS_FILE": str(alive_file(state, name))})
        for name in names
    ]


def alive_file(state: Path, part: str) -> Path:
    return state / "run" / f"{part}.alive"


def gateway_part(state: Path, env: Mapping[str, str]) -> Part:
    return _berth_part(GATEWAY, ["gateway"], state, env)


def agents_part(
    name: str,
    nodes: list[str],
    fleet_file: Path,
    token_dir: Path,
    state: Path,
    env: Mapping[str, str],
    libvirt_config: Path | None = None,
) -> Part:
    """The simulated hosts' agents; with `libvirt_config`, their VMs are real ones on this machine's libvirt."""
    node_options = [option for node in nodes for option in ("--node", node)]
    arguments = ["worker", "agents", "--fleet", str(fleet_file), "--token-dir", str(token_dir), *node_options]
    if libvirt_config is not None:
        arguments += ["--libvirt-config", str(libvirt_config)]
    return _berth_part(name, arguments, state, agent_env(env))


def api_command(port: int) -> list[str]:
    """The HTTP API on loopback, as the dev stack, the benchmarks and the tests run it (the manifests run the same
    app factory)."""
    factory = ["-m", "uvicorn", "--factory", "api.app:create_app", "--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, *factory, "--log-level", "warning"]


def api_part(port: int, state: Path, env: Mapping[str, str], name: str = API) -> Part:
    return Part(
        name,
        [*api_command(port), "--timeout-graceful-shutdown", "5"],
        state / "logs" / f"{name}.log",
        env=env,
        ready=lambda _pid: port_open("127.0.0.1", port),
    )


def agent_groups(nodes: list[str], processes: int) -> dict[str, list[str]]:
    """Part name -> the hosts it serves: `agents` for one process, `agents-0` .. `agents-<n-1>` for several, the
    hosts dealt out in turn (never more processes than hosts)."""
    processes = max(1, min(processes, len(nodes)))
    if processes == 1:
        return {"agents": list(nodes)} if nodes else {}
    return {f"agents-{k}": nodes[k::processes] for k in range(processes)}
