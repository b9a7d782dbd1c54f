"""The node agent stays lean: `berth worker node` (and `berth worker agents`) run on every GPU host, and each module of
the control plane they pull in is resident memory on each host. What is asserted is what
matters and does not drift with the machine: which modules the process imports, not how many megabytes it holds
(`python -m bench.memory` measures those).

Each command runs for real up to its connection to Temporal, which no setting names here, so it leaves with one
line and exit 1 after having built its agent; `python -X importtime` lists every module it imported on the way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.loader import load_fleet
from tests.hosts.sysfs_tree import hgx_h200

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_FLEET = REPO / "examples" / "fleet.yaml"

# The control plane: its database, its API, its workflows and their activities, the cluster drivers, the other
# sub-commands of `berth` (and with them their dependencies).
CONTROL_PLANE = (
    "sqlalchemy",
    "asyncpg",
    "alembic",
    "fastapi",
    "starlette",
    "uvicorn",
    "kubernetes",
    "lightkube",
    "worker",
    "store",
    "api",
    "devstack.stack",
    "devstack.supervisor",
    "activities",
    "workflows",
    "scheduler.deployment",
    # the placement side's CEL stack and the manifest checker: about 13 MB an agent never uses
    "scheduler.cel",
    "celpy",
    "lark",
    "jsonschema",
    # an HTTP client with its command-line extras (the report is posted with the standard library): about 5 MB
    "httpx",
    "click",
    "pygments",
)
# The fleet's documents beyond a node's own: only an agent that reads a fleet file (a simulated host's) loads them;
# a real host's agent plans on views made of contracts.vocabulary's enumerations (about 2 MB).
FLEET_DOCUMENTS = ("fleet.fleet", "fleet.inference_cluster", "fleet.inference_class", "fleet.openapi", "fleet.loader")
ALLOWED_WORKFLOWS = {"workflows", "contracts.task_queues"}  # the queue names are all an agent needs of workflows/
ALLOWED_CLI = {"cli", "cli.main", "cli.output", "cli.control_plane", "cli.control_plane.worker"}
LIBVIRT = ("libvirt", "agent.libvirt")


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def heavy_modules(modules: set[str], libvirt_asked: bool = False, fleet_file: bool = False) -> list[str]:
    """What of `modules` an agent must not import (`fleet_file`: it reads one, for a simulated host)."""
    return sorted(
        module
        for module in modules
        if _under(module, CONTROL_PLANE)
        or (_under(module, ("cli",)) and module not in ALLOWED_CLI)
        or (not libvirt_asked and _under(module, LIBVIRT))
        or (not fleet_file and _under(module, FLEET_DOCUMENTS))
    )


def assert_lean(modules: set[str], fleet_file: bool = False) -> None:
    heavy = heavy_modules(modules, fleet_file=fleet_file)
    packages = sorted({".".join(module.split(".")[:2]) for module in heavy})
    assert not heavy, f"the agent imports {len(heavy)} modules of the control plane, from {', '.join(packages)}"


def imported_by(command: list[str], state_dir: Path) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Run `python -X importtime <command>` with no BERTH_* setting but a state dir without a dev stack, and return
    the modules it imported."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("BERTH_")}
    environment["BERTH_STATE_DIR"] = str(state_dir)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *command],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:") and "[us]" not in line]
    return {line.rsplit("|", 1)[1].strip() for line in lines}, done


def _example_node() -> str:
    return next(n.name for pool in load_fleet([EXAMPLE_FLEET]).host_pools() for n in pool.nodes)


def test_the_agent_module_imports_nothing_of_the_control_plane() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, agent.serve; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    modules = set(done.stdout.split())
    assert "agent.serve" in modules
    assert_lean(modules)


@pytest.mark.parametrize("topology", ["simulated", "host"])
def test_berth_worker_node_builds_its_agent_without_the_control_plane(tmp_path: Path, topology: str) -> None:
    node = _example_node()
    token = tmp_path / "token"
    token.write_text("berth_node_token\n")
    if topology == "simulated":
        arguments = ["--node-id", node, "--fleet", str(EXAMPLE_FLEET), "--token-file", str(token)]
    else:
        root = hgx_h200().write(tmp_path / "host")
        arguments = [
            "--node-id",
            node,
            "--topology",
            "host",
            "--host-root",
            str(root),
            "--api",
            "http://127.0.0.1:9",
            "--token-file",
            str(token),
        ]
    modules, done = imported_by(["-m", "cli.main", "worker", "node", *arguments], tmp_path / "state")
    assert done.returncode == 1 and "only through the node gateway" in done.stderr, done.stderr[-2000:]
    assert {"agent.activities", "temporalio.worker"} <= modules  # it got as far as its agent and worker
    assert_lean(modules, fleet_file=topology == "simulated")


def test_berth_worker_agents_builds_its_agents_without_the_control_plane(tmp_path: Path) -> None:
    node = _example_node()
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / node).write_text("berth_node_token\n")
    command = [
        "-m",
        "cli.main",
        "worker",
        "agents",
        "--fleet",
        str(EXAMPLE_FLEET),
        "--node",
        node,
        "--token-dir",
        str(tmp_path / "tokens"),
    ]
    modules, done = imported_by(command, tmp_path / "state")
    assert done.returncode == 1 and "only through the node gateway" in done.stderr, done.stderr[-2000:]
    assert {"agent.activities", "temporalio.worker"} <= modules
    assert_lean(modules, fleet_file=True)


def test_the_control_plane_would_be_caught() -> None:
    """The check itself: what the agent used to import through worker.py is found."""
    modules, _ = imported_by(["-c", "import worker"], Path("/nonexistent"))
    assert {"sqlalchemy", "worker", "workflows.allocation", "activities.control"} <= set(heavy_modules(modules))
