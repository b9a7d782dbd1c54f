"""docker-compose.yml and the Dockerfile, checked against the code they run.

No Docker engine runs here, so nothing is built or started: the files are parsed and every name they use is looked
up in the code (settings, CLI commands, node names, the uvicorn factory, search attributes, mounted files), so a
rename in the code fails here instead of in someone's `docker compose up`.

Compose `${VAR:-default}` references are read with their defaults, as a `docker compose up` with no .env would.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer.main
import yaml
from pydantic import ValidationError
from sqlalchemy.engine import make_url
from starlette.routing import Match
from temporalio.common import SearchAttributeIndexedValueType

import cli.main
from config.settings import Settings
from fleet.loader import load_fleet
from workflows.reconcile.client import ReconcilerSettings
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DEPLOY = REPO / "deploy"
EXAMPLE_FLEET = REPO / "examples" / "fleet.yaml"
NAMESPACE_SCRIPT = DEPLOY / "temporal" / "setup-namespace.sh"
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SETTING_VARIABLE = re.compile(r"\bBERTH_[A-Z0-9_]+\b")
INTERPOLATION = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)")


def interpolate(text: str) -> str:
    """Compose's `${VAR:-default}` substitution with an empty environment: every variable takes its default."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("op") in ("-", ":-"):
            return match.group("arg")
        return ""

    return INTERPOLATION.sub(substitute, text)


@dataclass(frozen=True)
class Service:
    name: str
    spec: dict[str, Any]

    @property
    def environment(self) -> dict[str, str]:
        raw = self.spec.get("environment") or {}
        if isinstance(raw, list):
            raw = dict(entry.split("=", 1) if "=" in entry else (entry, "") for entry in raw)
        return {key: interpolate(str(value)) for key, value in raw.items()}

    @property
    def argv(self) -> list[str]:
        """What the container runs: entrypoint then command (only the forms this file uses: no image defaults)."""
        return [*_words(self.spec.get("entrypoint")), *_words(self.spec.get("command"))]

    @property
    def bind_mounts(self) -> dict[PurePosixPath, Path]:
        """Container path -> host path, for the volumes that mount a file or directory of the repository."""
        mounts: dict[PurePosixPath, Path] = {}
        for volume in self.spec.get("volumes") or []:
            source, target = (volume["source"], volume["target"]) if isinstance(volume, dict) else volume.split(":")[:2]
            if source.startswith((".", "/")):
                mounts[PurePosixPath(target)] = (REPO / source).resolve()
        return mounts

    def host_path(self, container_path: str) -> Path | None:
        """The repository file a container path stands for: through a bind mount, or the image's copy of the repo."""
        path = PurePosixPath(container_path)
        for target, source in self.bind_mounts.items():
            if path == target or target in path.parents:
                return source / path.relative_to(target)
        if self.spec.get("build") and IMAGE_ROOT in path.parents:
            return REPO / path.relative_to(IMAGE_ROOT)
        return None


def _words(value: str | list[Any] | None) -> list[str]:
    if value is None:
        return []
    return [interpolate(str(word)) for word in value] if isinstance(value, list) else shlex.split(interpolate(value))


def _dockerfile(instruction: str) -> list[str]:
    """The arguments of every `instruction` line of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        name, _, argument = line.strip().partition(" ")
        if name.upper() == instruction:
            found.append(argument.strip())
    return found


IMAGE_ROOT = PurePosixPath(_dockerfile("WORKDIR")[-1])


@pytest.fixture(scope="module")
def services() -> list[Service]:
    return [Service(name, spec) for name, spec in yaml.safe_load(COMPOSE_FILE.read_text())["services"].items()]


def by_name(services: list[Service]) -> dict[str, Service]:
    return {service.name: service for service in services}


@dataclass(frozen=True)
class Invocation:
    where: str
    arguments: list[str]
    service: Service | None  # None: the Dockerfile's CMD

    def local(self, word: str) -> str:
        """A container path as the repository path it stands for, so path options that must exist still parse."""
        path = self.service.host_path(word) if self.service and word.startswith("/") else None
        return str(path) if path else word


def programs(services: list[Service], program: str) -> Iterator[Invocation]:
    """Every invocation of `program`: the services' commands and the Dockerfile's CMD."""
    for service in services:
        argv = service.argv
        if argv and PurePosixPath(argv[0]).name == program:
            yield Invocation(f"service {service.name!r}", argv[1:], service)
    for cmd in _dockerfile("CMD"):
        argv = json.loads(cmd) if cmd.startswith("[") else shlex.split(cmd)
        if argv and PurePosixPath(argv[0]).name == program:
            yield Invocation("the Dockerfile's CMD", argv[1:], None)


def option_value(arguments: list[str], *names: str) -> str | None:
    for index, word in enumerate(arguments):
        if word in names and index + 1 < len(arguments):
            return arguments[index + 1]
        for name in names:
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
    return None


def test_every_service_has_an_image_or_a_build(services: list[Service]) -> None:
    missing = [service.name for service in services if not (service.spec.get("image") or service.spec.get("build"))]
    assert not missing, f"services with neither `image` nor `build`: {missing}"


def test_every_build_points_at_an_existing_dockerfile(services: list[Service]) -> None:
    for service in services:
        build = service.spec.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context, dockerfile = build["context"], build.get("dockerfile", "Dockerfile")
        assert (REPO / context).is_dir(), f"service {service.name!r} builds from {context!r}, which is not a directory"
        assert (REPO / context / dockerfile).is_file(), (
            f"service {service.name!r} builds with {dockerfile!r}, which does not exist in {context!r}"
        )


# The image's own build (its stages, user, lock file and version label) is checked in tests/test_image.py.


def test_every_berth_variable_is_a_setting() -> None:
    settings = {
        f"{kind.model_config['env_prefix']}{name}".upper()
        for kind in (Settings, ReconcilerSettings)  # the reconciler's schedule reads its own BERTH_RECONCILER_*
        for name in kind.model_fields
    }
    files = [COMPOSE_FILE, DOCKERFILE, *sorted(path for path in DEPLOY.rglob("*") if path.is_file())]
    unknown = {
        f"{variable} ({path.relative_to(REPO)})"
        for path in files
        for variable in SETTING_VARIABLE.findall(path.read_text())
        if variable not in settings
    }
    assert not unknown, f"BERTH_* variables that no settings class reads: {sorted(unknown)}"


def test_each_berth_service_environment_is_valid_settings(
    services: list[Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    for service in services:
        if not service.spec.get("build"):
            continue
        with monkeypatch.context() as env:
            for variable in [name for name in os.environ if name.startswith("BERTH_")]:
                env.delenv(variable)
            for variable, value in service.environment.items():
                env.setenv(variable, value)
            try:
                settings = Settings()
            except ValidationError as error:
                pytest.fail(f"service {service.name!r}: its BERTH_* environment is not valid settings: {error}")
        if service.argv[:3] == ["berth", "worker", "node"]:
            # A GPU host's agent knows the API and the node gateway, nothing else of the control plane.
            assert settings.node_gateway and settings.api_url, f"agent {service.name!r} needs the gateway and the API"
            assert not (settings.database_url or settings.temporal_address), (
                f"agent {service.name!r} is given the database or Temporal: a compromised host would have them"
            )
            assert settings.node_gateway.rsplit(":", 1)[0] in by_name(services)
            continue
        assert settings.database_url and settings.temporal_address, (
            f"service {service.name!r} must set BERTH_DATABASE_URL and BERTH_TEMPORAL_ADDRESS: in a container there "
            "is no `berth up` context to fall back on"
        )
        url = make_url(settings.database_url)
        assert url.drivername == "postgresql+asyncpg", f"service {service.name!r}: the store needs asyncpg, not {url}"
        for what, host in (("BERTH_DATABASE_URL", url.host), ("BERTH_TEMPORAL_ADDRESS", settings.temporal_address)):
            host = host.rsplit(":", 1)[0]
            assert host in by_name(services), f"service {service.name!r}: {what} names host {host!r}, not a service"


def _cli_command(words: list[str], where: str) -> tuple[Any, list[str], typer.Context]:
    """Walk `berth`'s command groups along `words`: the command reached, its own arguments, and its parent's context.

    Duck-typed (a group is what has `commands`), because Typer may bring its own copy of click."""
    command = typer.main.get_command(cli.main.app)
    context = typer.Context(command, info_name="berth")
    path = ["berth"]
    rest = list(words)
    while getattr(command, "commands", None) is not None:
        assert rest and not rest[0].startswith("-"), f"{where}: `{' '.join(path)}` needs a subcommand"
        name = rest.pop(0)
        sub = command.get_command(context, name)
        assert sub is not None, (
            f"{where}: `{' '.join(path)}` has no command {name!r} (it has: {', '.join(command.list_commands(context))})"
        )
        path.append(name)
        command, context = sub, typer.Context(sub, info_name=name, parent=context)
    return command, rest, context


def test_every_berth_command_is_a_real_cli_command(services: list[Service]) -> None:
    invocations = list(programs(services, "berth"))
    assert invocations, "nothing runs `berth`: the control worker and the agents should"
    for invocation in invocations:
        command, arguments, context = _cli_command(invocation.arguments, invocation.where)
        try:
            command.make_context(
                context.info_name, [invocation.local(word) for word in arguments], parent=context.parent
            )
        except Exception as error:  # a usage error: unknown option, missing required option, bad value
            message = error.format_message() if hasattr(error, "format_message") else repr(error)
            pytest.fail(f"{invocation.where}: `berth {' '.join(invocation.arguments)}` does not parse: {message}")


def _agents(services: list[Service]) -> dict[str, Service]:
    """node id -> the service running its agent."""
    agents: dict[str, Service] = {}
    for service in services:
        words = service.argv
        if words[:3] == ["berth", "worker", "node"]:
            node = option_value(words, "--node-id")
            assert node, f"service {service.name!r} runs a node agent without --node-id"
            assert node not in agents, f"node {node!r} has two agents: {agents[node].name!r} and {service.name!r}"
            agents[node] = service
    return agents


def _fleet_file(service: Service) -> Path:
    named = option_value(service.argv, "--fleet", "-f") or service.environment.get("BERTH_FLEET_FILE")
    path = service.host_path(named) if named else EXAMPLE_FLEET
    assert path is not None, f"service {service.name!r} reads fleet file {named!r}, which is not in the image"
    return path


def test_every_agent_runs_a_host_of_its_fleet_file(services: list[Service]) -> None:
    agents = _agents(services)
    assert agents, "no service runs a node agent (`berth worker node --node-id N`)"
    for node, service in agents.items():
        fleet = load_fleet([_fleet_file(service)])
        hosts = {host.name for pool in fleet.host_pools() for host in pool.nodes}
        assert node in hosts, f"service {service.name!r} runs the agent of {node!r}, not a host of its fleet: {hosts}"


def _first_fleets(service: Service) -> list[str]:
    """The fleet files a `berth migrate --fleet FILE` service loads into a database that holds none (the API is
    not up yet, and `berth apply` goes through it)."""
    if service.argv[:2] != ["berth", "migrate"]:
        return []
    words = service.argv
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--fleet"] + [
        word.split("=", 1)[1] for word in words if word.startswith("--fleet=")
    ]


def _started_before(services: list[Service], name: str) -> set[str]:
    """Every service that `name` waits for to complete, directly or through others."""
    named = by_name(services)
    found: set[str] = set()
    waiting = [name]
    while waiting:
        depends_on = named[waiting.pop()].spec.get("depends_on") or {}
        for target, condition in depends_on.items() if isinstance(depends_on, dict) else ():
            if (condition or {}).get("condition") == "service_completed_successfully" and target not in found:
                found.add(target)
                waiting.append(target)
    return found


def test_the_agents_match_the_applied_fleet(services: list[Service]) -> None:
    """Every host gets an agent, except those the fleet simulates as down (`simulation.agentDown`): a host without
    one costs each placement tried on it the agent's schedule-to-start timeout, and an agent for a host meant to be
    down would hide the fall-through to an alternate that the fleet is there to show."""
    loaders = [service for service in services if _first_fleets(service)]
    applied = [service.host_path(path) for service in loaders for path in _first_fleets(service)]
    assert applied and None not in applied, "no service runs `berth migrate --fleet FLEET` on a fleet file of the image"
    before_api = _started_before(services, "berth-api")
    assert all(service.name in before_api for service in loaders), "the API starts before its first fleet is loaded"
    hosts = [host for pool in load_fleet([path for path in applied if path]).host_pools() for host in pool.nodes]
    agents = set(_agents(services))
    missing = sorted(host.name for host in hosts if not host.simulation.agent_down and host.name not in agents)
    assert not missing, f"hosts of the applied fleet with no agent service: {missing}"
    down = sorted(host.name for host in hosts if host.simulation.agent_down and host.name in agents)
    assert not down, f"hosts the fleet simulates as agentDown but that have an agent service: {down}"


def test_depends_on_targets_exist_with_valid_conditions(services: list[Service]) -> None:
    named = by_name(services)
    for service in services:
        depends_on = service.spec.get("depends_on") or {}
        if isinstance(depends_on, list):
            depends_on = {target: {"condition": "service_started"} for target in depends_on}
        for target, options in depends_on.items():
            assert target in named, f"service {service.name!r} depends on {target!r}, which is not a service"
            condition = (options or {}).get("condition", "service_started")
            assert condition in DEPENDS_ON_CONDITIONS, (
                f"{service.name!r} -> {target!r}: unknown condition {condition!r}"
            )
            if condition == "service_healthy":
                assert "healthcheck" in named[target].spec, (
                    f"{service.name!r} waits for {target!r} to be healthy, but {target!r} has no healthcheck"
                )
            if condition == "service_completed_successfully":
                restart = str(named[target].spec.get("restart", "no"))
                assert restart == "no" or restart.startswith("on-failure"), (
                    f"{service.name!r} waits for {target!r} to complete, but {target!r} restarts with {restart!r}"
                )


def test_depends_on_has_no_cycle(services: list[Service]) -> None:
    edges = {service.name: set(service.spec.get("depends_on") or ()) for service in services}

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, f"depends_on cycle: {' -> '.join((*trail, name))}"
        for target in edges.get(name, ()):
            visit(target, (*trail, name))

    for name in edges:
        visit(name, ())


def _served_app(invocation: Invocation) -> Any:
    """The ASGI application a uvicorn invocation serves, built the way uvicorn builds it."""
    targets = [word for word in invocation.arguments if re.fullmatch(r"[\w.]+:[\w.]+", word)]
    assert len(targets) == 1, f"{invocation.where}: uvicorn should name one module:attribute, not {targets}"
    module_name, attribute = targets[0].split(":")
    target = getattr(importlib.import_module(module_name), attribute, None)
    assert callable(target), f"{invocation.where}: {targets[0]} is not a callable in the code"
    assert "--factory" in invocation.arguments, f"{invocation.where}: {targets[0]} is a factory; pass --factory"
    app = target()
    assert callable(app), f"{invocation.where}: {targets[0]}() did not return an ASGI application"
    return app


def test_uvicorn_targets_import_and_build_an_app(services: list[Service]) -> None:
    invocations = list(programs(services, "uvicorn"))
    assert invocations, "nothing runs the API with uvicorn"
    for invocation in invocations:
        _served_app(invocation)


def test_the_api_healthcheck_probes_a_real_route_on_the_served_port(services: list[Service]) -> None:
    for invocation in programs(services, "uvicorn"):
        if invocation.service is None:
            continue
        app = _served_app(invocation)
        probe = " ".join(_words(invocation.service.spec.get("healthcheck", {}).get("test")))
        urls = re.findall(r"https?://[^\s'\"]+", probe)
        assert urls, f"{invocation.where} serves the API without an HTTP healthcheck"
        url = urlsplit(urls[0])
        request = {"type": "http", "method": "GET", "path": url.path, "root_path": "", "headers": []}
        assert any(route.matches(request)[0] is Match.FULL for route in app.routes), (
            f"{invocation.where}: the healthcheck probes {url.path}, which no route of the API serves"
        )
        port = int(option_value(invocation.arguments, "--port") or 8000)
        assert url.port == port, f"{invocation.where}: the healthcheck probes port {url.port}; uvicorn serves {port}"


def _cli_type_name(kind: SearchAttributeIndexedValueType) -> str:
    """The `temporal operator search-attribute create --type` spelling: KEYWORD_LIST -> KeywordList."""
    return "".join(
        part.capitalize() for part in kind.name.removeprefix("SEARCH_ATTRIBUTE_INDEXED_VALUE_TYPE_").split("_")
    )


def test_registered_search_attributes_match_the_code(services: list[Service]) -> None:
    registered = dict(
        re.findall(r"^\s*ensure_search_attribute\s+(\w+)\s+(\w+)\s*$", NAMESPACE_SCRIPT.read_text(), re.M)
    )
    expected = {key.name: _cli_type_name(key.indexed_value_type) for key in SEARCH_ATTRIBUTES}
    assert registered == expected, (
        f"{NAMESPACE_SCRIPT.relative_to(REPO)} registers {registered}; workflows/search_attributes.ALL is {expected}"
    )
    runners = [
        service.name
        for service in services
        for word in service.argv
        if word.startswith("/") and service.host_path(word) == NAMESPACE_SCRIPT
    ]
    assert runners, f"no service runs {NAMESPACE_SCRIPT.relative_to(REPO)}: the attributes would never be registered"


def _published_ports(service: Service) -> Iterator[tuple[str, int, str]]:
    """(host address, host port, protocol) of each port the service publishes on the host."""
    for entry in service.spec.get("ports") or []:
        if isinstance(entry, dict):
            if entry.get("published"):
                yield (
                    entry.get("host_ip", "0.0.0.0"),
                    int(interpolate(str(entry["published"]))),
                    entry.get("protocol", "tcp"),
                )
            continue
        spec, _, protocol = interpolate(str(entry)).partition("/")
        parts = spec.rsplit(":", 2)
        if len(parts) == 1:
            continue  # a container port only: Docker picks a free host port
        address, published = (parts[0], parts[1]) if len(parts) == 3 else ("0.0.0.0", parts[0])
        low, _, high = published.partition("-")
        for port in range(int(low), int(high or low) + 1):
            yield address, port, protocol or "tcp"


def test_published_ports_do_not_collide(services: list[Service]) -> None:
    owners: dict[tuple[str, int, str], list[str]] = {}
    for service in services:
        for binding in _published_ports(service):
            owners.setdefault(binding, []).append(service.name)
    wildcard = Counter((port, protocol) for address, port, protocol in owners if address == "0.0.0.0")
    clashes = {binding: names for binding, names in owners.items() if len(names) > 1}
    clashes |= {
        binding: names
        for binding, names in owners.items()
        if binding[0] != "0.0.0.0" and wildcard[(binding[1], binding[2])]
    }
    assert not clashes, f"host ports published twice: {clashes}"


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `**` crosses directories, `*` and `?` do not."""
    parts = re.split(r"(\*\*/?|\*|\?)", pattern.strip("/"))
    wildcard = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wildcard.get(part, re.escape(part)) for part in parts))


def _dockerignored(relative: Path) -> bool:
    """Docker's rule: the last pattern that matches the path, or one of its directories, decides."""
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    prefixes = [Path(*relative.parts[: index + 1]).as_posix() for index in range(len(relative.parts))]
    ignored = False
    for line in (line for line in lines if line and not line.startswith("#")):
        regex = _glob_regex(line.removeprefix("!"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not line.startswith("!")
    return ignored


def test_every_file_a_container_names_exists(services: list[Service]) -> None:
    for service in services:
        for target, source in service.bind_mounts.items():
            assert source.exists(), f"service {service.name!r} mounts {source} at {target}, which does not exist"
        named = [*service.argv, *service.environment.values()]
        for word in (w for w in named if w.startswith("/")):
            path = service.host_path(word)
            if path is None:
                continue
            assert path.exists(), f"service {service.name!r} names {word}, but {path.relative_to(REPO)} does not exist"
            if IMAGE_ROOT in PurePosixPath(word).parents and service.spec.get("build"):
                relative = path.relative_to(REPO)
                assert not _dockerignored(relative), f"service {service.name!r} needs {word}; .dockerignore drops it"


def _networks(service: Service) -> set[str]:
    networks = service.spec.get("networks") or ["default"]
    return set(networks if isinstance(networks, list) else networks.keys())


def test_temporal_and_postgresql_stay_on_the_internal_network(services: list[Service]) -> None:
    """Whoever reaches Temporal's frontend can start, signal, cancel, terminate and read every workflow; whoever
    reaches PostgreSQL has the fleet: neither is published or reachable from where GPU hosts are."""
    declared = yaml.safe_load(COMPOSE_FILE.read_text()).get("networks") or {}
    named = by_name(services)
    for name in ("temporal", "postgres"):
        assert not list(_published_ports(named[name])), f"{name} publishes a port on the host"
        for network in _networks(named[name]):
            assert (declared.get(network) or {}).get("internal") is True, f"{name} is on non-internal {network!r}"
    for address, port, _ in _published_ports(named["temporal-ui"]):
        assert address == "127.0.0.1", f"the Temporal UI (no authentication) is published on {address}:{port}"
    agents = _agents(services)
    for node, agent in agents.items():
        shared = {n for n in _networks(agent) if n in _networks(named["temporal"]) | _networks(named["postgres"])}
        assert not shared, f"the agent of {node} shares network(s) {shared} with Temporal or PostgreSQL"
        gateway = agent.environment["BERTH_NODE_GATEWAY"].rsplit(":", 1)[0]
        assert _networks(agent) & _networks(named[gateway]), f"the agent of {node} cannot reach the gateway"
        assert _networks(agent) & _networks(named["berth-api"]), f"the agent of {node} cannot reach the API"


def _volumes(service: Service) -> dict[str, str]:
    """named volume -> where the service mounts it (bind mounts left out)."""
    mounts = {}
    for entry in service.spec.get("volumes") or []:
        source, target = str(entry).split(":")[:2]
        if not source.startswith((".", "/")):
            mounts[source] = target
    return mounts


def _node_tokens(service: Service) -> dict[str, str]:
    """node -> the file `berth migrate --node-tokens-to DIR [--dir-per-node] --node N ...` writes its token to."""
    words = service.argv
    directory = option_value(words, "--node-tokens-to")
    if directory is None:
        return {}
    nodes = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--node"]
    per_node = "--dir-per-node" in words
    return {
        node: str(PurePosixPath(directory) / node / "token" if per_node else PurePosixPath(directory) / node)
        for node in nodes
    }


def test_each_agent_mounts_its_own_token_and_state_and_no_other_node_s(services: list[Service]) -> None:
    agents = _agents(services)
    owners: dict[str, str] = {}
    for node, agent in agents.items():
        for volume in _volumes(agent):
            assert volume not in owners, f"agents of {owners[volume]} and {node} share volume {volume!r}"
            owners[volume] = node
        token_file = PurePosixPath(agent.environment["BERTH_NODE_TOKEN_FILE"])
        holders = [v for v, target in _volumes(agent).items() if PurePosixPath(target) in token_file.parents]
        assert holders == [f"token-{node}"], f"the agent of {node} reads its token from {holders}"
        writers = [
            s
            for s in services
            if _volumes(s).get(f"token-{node}") and s.argv[:2] == ["berth", "migrate"] and node in _node_tokens(s)
        ]
        assert len(writers) == 1, f"token-{node} is written by {[s.name for s in writers]}, not by one service"
        [writer] = writers
        written = PurePosixPath(_node_tokens(writer)[node])
        mounted = PurePosixPath(_volumes(writer)[f"token-{node}"])
        assert written.parent == mounted and written.parent.name == node, f"{writer.name} writes {written}"
        assert writer.name in _started_before(services, agent.name), f"the agent of {node} may start before its token"
