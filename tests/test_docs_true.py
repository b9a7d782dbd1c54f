"""The documentation names only what exists.

Every README (the root one and each package's) and every page under docs/ is read, and what it names in code
spans is checked against the repository as it is:

- a path (`store/allocations.py`, `agent/serve.py`, `activities/control/`): a span without blanks or placeholders
  (`<`, `*`, `{`) that ends in `.py` or `/`, or whose first part is a directory or file beside the document or at the
  root, exists beside the document or from the root (a bare `name.py` anywhere under the document's directory; for
  README.md and docs/, anywhere); a first part with a dot is a domain (`modelplane.ai/pool`), not a path;
- a Python name (`scheduler.cel.compile_selector`, `store.snapshot`, `api.app:create_app`, `python -m bench.memory`)
  whose first part is one of Berth's packages: the module exists and defines the first name after it;
- an environment variable (`BERTH_...`, anywhere in the text, in code or not): a setting a `BaseSettings` class
  reads (its `env_prefix` plus the field's name, as pydantic-settings maps them) or a variable the code reads by
  name (`os.environ`, `os.getenv`, a Click `envvar`); `BERTH_FOO_*` stands for every variable of that prefix and
  must match at least one;
- a `berth ...` command (a code span, or a line of a code block, that starts with `berth`): every sub-command
  resolves in the Click tree of `cli.main.app` (alternatives such as `alloc create|list|get` each), and every
  `--option` it shows is an option of a command it names.

Code blocks are checked for commands and for paths that start at one of the repository's top-level directories;
prose in code spans for all four. docs/benchmarks.md is history, but it is checked like the rest: a figure measured
on something since retired keeps its name only through `EXCEPTIONS`, which holds every name a document may keep
without the repository having it, each with its reason (another project's files, a field that looks like a module).
docs/settings.md's table must also list every variable Berth reads. Nothing is imported but the CLI.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", ".pytest_cache", ".ruff_cache", "berth.egg-info", ".berth"}
PACKAGES = {
    "activities",
    "agent",
    "api",
    "bench",
    "cli",
    "config",
    "contracts",
    "devstack",
    "fleet",
    "gateway",
    "scheduler",
    "store",
    "workflows",
    "worker",
    "tests",
}

# (document, name) -> why the document may name it although the repository does not have it. `*` as the document:
# any document.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("fleet/README.md", "fn.py"): "Modelplane's composition function, in modelplaneai/modelplane, not here",
    ("fleet/README.md", "worker.nodes"): "a ModelDeployment member's field (Modelplane), not the module worker.py",
    ("scheduler/deployment/README.md", "worker.nodes"): "a ModelDeployment member's field (Modelplane), not worker.py",
}


def documents() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for readme in sorted(REPO.rglob("README.md")):
        relative = readme.relative_to(REPO)
        if readme not in found and not (set(relative.parts[:-1]) & SKIP_DIRS):
            found.append(readme)
    return found


def _name(document: Path) -> str:
    return document.relative_to(REPO).as_posix()


# ---- what a document names ----------------------------------------------------------------------------------------

FENCE = re.compile(r"^([ \t]*)(```|~~~)[^\n]*\n.*?^\1\2[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")  # a code span may wrap onto the next line
INDENTED = re.compile(r"(?:^(?: {4}|\t)\S.*\n?)+", re.M)  # an indented code block (after a blank line)


def split(text: str) -> tuple[list[str], list[str]]:
    """The document's code spans, and the lines of its code blocks (fenced and indented)."""
    blocks: list[str] = []

    def keep_block(match: re.Match[str]) -> str:
        blocks.extend(match.group(0).splitlines()[1:-1])
        return "\n"

    prose = FENCE.sub(keep_block, text)
    for match in INDENTED.finditer(prose):
        start = prose.rfind("\n", 0, max(match.start() - 1, 0))
        if prose[start + 1 : match.start()].strip() == "":  # preceded by a blank line: a code block, not a list
            blocks.extend(match.group(0).splitlines())
    spans = [" ".join(span.split()) for span in SPAN.findall(prose.replace("\\|", "|"))]
    return spans, blocks


# ---- paths --------------------------------------------------------------------------------------------------------

PATHLIKE = re.compile(r"^[\w.\-]+(?:/[\w.\-]+)*/?$")
BLOCK_PATH = re.compile(r"(?<![\w./<\-])((?:[a-z_]+/)+(?:[\w\-]+\.(?:py|md|yaml|yml|toml|sh|json|xml))?)(?![\w/])")


def _exists(document: Path, path: str) -> bool:
    here = document.parent
    if (here / path).exists() or (REPO / path).exists():
        return True
    if "/" not in path.rstrip("/"):  # a bare file name: anywhere under the package (a page of docs/: the repository)
        scope = REPO if here in (REPO, REPO / "docs") else here
        return any(not (set(p.relative_to(REPO).parts) & SKIP_DIRS) for p in scope.rglob(path.rstrip("/")))
    return False


def is_path(document: Path, span: str) -> bool:
    if not PATHLIKE.match(span) or span.startswith(".") or span.startswith("/"):
        return False
    first = span.split("/")[0]
    if span.endswith(".py"):
        return True
    if "/" not in span:
        return False
    if "." in first:  # a domain: modelplane.ai/pool, berth.dev/v1alpha1, resource.k8s.io/v1
        return False
    if span.endswith("/"):  # a directory: `activities/control/`, `xrd/`
        return True
    return (document.parent / first).exists() or (REPO / first).exists()


def stale_paths(document: Path, spans: list[str], blocks: list[str]) -> Iterator[str]:
    for span in spans:
        if is_path(document, span) and not _exists(document, span):
            yield span
    for line in blocks:
        for path in BLOCK_PATH.findall(line):
            first = path.split("/")[0]
            if (REPO / first).is_dir() and first in PACKAGES | {"docs", "deploy", "examples", "scripts"}:
                if not (REPO / path).exists():
                    yield path


# ---- Python names -------------------------------------------------------------------------------------------------

DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?::([A-Za-z_]\w*))?(?:\(.*\))?$")
FILE_SUFFIX = re.compile(r"\.(?:py|md|yaml|yml|json|toml|txt|sh|xml|service)$")
PYTHON_M = re.compile(r"python(?:3)? -m ([\w.]+)")


@functools.cache
def _defined(module_file: Path) -> frozenset[str]:
    """Every name a module binds anywhere: functions, classes, assignments, imports."""
    tree = ast.parse(module_file.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return frozenset(names)


def _module_file(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def python_name_exists(dotted: str, attribute: str | None = None) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is None:
            continue
        rest = parts[cut:] + ([attribute] if attribute else [])
        return not rest or rest[0] in _defined(module)
    return False


def stale_python(spans: list[str], blocks: list[str]) -> Iterator[str]:
    for span in spans:
        match = DOTTED.match(span)
        if match and match.group(1).split(".")[0] in PACKAGES and not FILE_SUFFIX.search(span):
            if not python_name_exists(match.group(1), match.group(2)):
                yield span
    for line in [*spans, *blocks]:
        for module in PYTHON_M.findall(line):
            if module.split(".")[0] in PACKAGES and _module_file(module.split(".")) is None:
                yield f"python -m {module}"


# ---- environment variables ----------------------------------------------------------------------------------------

VARIABLE = re.compile(r"\bBERTH_[A-Z0-9_]*[A-Z0-9_*]")  # ending in `_` or `*`: every variable of that prefix
READ_BY_NAME = re.compile(r"""(?:environ\.get\(|environ\[|getenv\(|envvar=)\s*["'](BERTH_[A-Z0-9_]+)["']""")


def _code_files() -> Iterator[Path]:
    for path in REPO.rglob("*.py"):
        parts = path.relative_to(REPO).parts
        if not (set(parts) & SKIP_DIRS) and parts[0] != "tests":
            yield path


@functools.cache
def known_variables() -> frozenset[str]:
    """What Berth reads: each BaseSettings field as its env_prefix + name, and the variables read by name."""
    names: set[str] = set()
    for path in _code_files():
        text = path.read_text()
        names.update(READ_BY_NAME.findall(text))
        if "BaseSettings" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef) or not any(
                isinstance(base, ast.Name) and base.id == "BaseSettings" for base in node.bases
            ):
                continue
            prefix = ""
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "model_config" for t in statement.targets)
                    and isinstance(statement.value, ast.Call)
                ):
                    for keyword in statement.value.keywords:
                        if keyword.arg == "env_prefix" and isinstance(keyword.value, ast.Constant):
                            prefix = str(keyword.value.value)
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    if "ClassVar" not in ast.unparse(statement.annotation):
                        names.add(f"{prefix}{statement.target.id}".upper())
    return frozenset(names)


@functools.cache
def read_by_tests_only() -> frozenset[str]:
    """Variables only the tests read (re-recording replay histories, say): a document may name them, the Settings
    table need not list them."""
    names: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        names.update(READ_BY_NAME.findall(path.read_text()))
    return frozenset(names)


def stale_variables(text: str) -> Iterator[str]:
    known = known_variables() | read_by_tests_only()
    for name in dict.fromkeys(VARIABLE.findall(text)):
        if name.endswith(("*", "_")):
            if not any(k.startswith(name.rstrip("*")) for k in known):
                yield name
        elif name not in known:
            yield name


# ---- berth commands -----------------------------------------------------------------------------------------------

COMMAND_WORD = re.compile(r"^[a-z][a-z0-9-]*$")
OPTION = re.compile(r"^\[?(--[a-z][a-z0-9-]*)")


# Typer carries its own copy of Click, so its commands are told apart by what they have: a group has `commands`.
Command = Any


@functools.cache
def berth() -> Command:
    from cli.main import app

    return typer.main.get_command(app)


def _is_group(command: Command) -> bool:
    return hasattr(command, "commands")


def _sub(group: Command | None, name: str) -> Command | None:
    if group is None or not _is_group(group):
        return None
    try:
        return group.commands[name]
    except KeyError:
        return None


def _options(command: Command) -> set[str]:
    return {option for param in command.params for option in (*param.opts, *param.secondary_opts)} | {"--help"}


def command_problems(line: str) -> Iterator[str]:
    """What of `berth ...` does not resolve: an unknown sub-command, or an option none of the named commands has."""
    words = line.split()[1:]
    root = berth()
    level: list[Command] = [root]  # the commands the next word may be a sub-command of
    named: list[Command] = []
    for word in words:
        if word.startswith("#") or word in {"&&", ";", ">", "|", "2>&1"} or word.startswith(">"):
            break
        option = OPTION.match(word)
        if option:
            if named and not any(option.group(1) in _options(c) for c in named):
                yield f"{option.group(1)} (not an option of {', '.join(sorted({c.name or '' for c in named}))})"
            continue
        alternatives = [w.strip("[]()") for w in word.split("|")]
        if word.startswith("]") or word.startswith("-"):
            continue
        if not all(COMMAND_WORD.match(a) for a in alternatives if a):
            if not named:
                return  # not a command line after all: `berth up:` in a diagram
            level = []  # an argument (FLEET, NODE, N, a file name): no sub-command comes after it
            continue
        groups = [c for c in level if _is_group(c)]
        if not groups:
            # a leaf was reached: a bare word after it is an argument, unless it is one of its siblings
            # (`deploy apply -f FILE|get|list`): those words were split above and are handled with the leaf's parent
            continue
        found = [(g, _sub(g, a)) for a in alternatives if a for g in groups]
        resolved = [c for _, c in found if c is not None]
        missing = [a for a in alternatives if a and not any(_sub(g, a) for g in groups)]
        if missing and not (resolved and len(alternatives) == 1):
            for name in missing:
                yield f"{name} (no such command under {', '.join(sorted(g.name or 'berth' for g in groups))})"
        if not resolved:
            return
        named = resolved
        level = resolved
    return


def _siblings_after_options(line: str) -> list[tuple[str, str]]:
    """`berth deploy apply -f FILE [--wait]|get|list|delete`: the alternatives glued after a leaf's options."""
    words = line.split()
    pairs = []
    for index, word in enumerate(words):
        if "|" in word and (word.startswith("[") or word.startswith("-") or not COMMAND_WORD.match(word.split("|")[0])):
            group_words = [w for w in words[1:index] if COMMAND_WORD.match(w)][:-1]
            for alternative in word.split("|")[1:]:
                alternative = alternative.strip("[]")
                if COMMAND_WORD.match(alternative):
                    pairs.append((" ".join(["berth", *group_words]), alternative))
    return pairs


def commands_in(spans: list[str], blocks: list[str]) -> list[str]:
    lines = [span for span in spans if span.startswith("berth ")]
    for line in blocks:
        stripped = line.strip().removeprefix("$ ")
        stripped = re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", stripped)  # VAR=value berth ...
        if stripped.startswith("berth "):
            lines.append(stripped)
    return lines


def stale_commands(spans: list[str], blocks: list[str]) -> Iterator[str]:
    for line in commands_in(spans, blocks):
        for problem in command_problems(line):
            yield f"`{line}`: {problem}"
        for group_line, sibling in _siblings_after_options(line):
            group: Command | None = berth()
            for word in group_line.split()[1:]:
                group = _sub(group, word) if group is not None else None
            if group is None or _sub(group, sibling) is None:
                yield f"`{line}`: {sibling} (no such command under {group_line})"


# ---- the test -----------------------------------------------------------------------------------------------------


def stale_names(document: Path) -> list[str]:
    text = document.read_text()
    spans, blocks = split(text)
    found = [
        *stale_paths(document, spans, blocks),
        *stale_python(spans, blocks),
        *stale_variables(text),
        *stale_commands(spans, blocks),
    ]
    name = _name(document)
    return [item for item in dict.fromkeys(found) if (name, item) not in EXCEPTIONS and ("*", item) not in EXCEPTIONS]


def test_documents_name_only_what_exists() -> None:
    problems = {_name(document): stale_names(document) for document in documents()}
    problems = {name: items for name, items in problems.items() if items}
    report = "\n".join(f"  {name}: {item}" for name, items in problems.items() for item in items)
    assert not problems, f"documents name {sum(map(len, problems.values()))} things the repository lacks:\n{report}"


def test_the_settings_page_lists_every_setting() -> None:
    """docs/settings.md's table names every variable Berth reads (the table is where operators look)."""
    text = (REPO / "docs" / "settings.md").read_text()
    table = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    missing = sorted(name for name in known_variables() if f"`{name}`" not in table)
    assert not missing, f"docs/settings.md's table lacks {', '.join(missing)}"


def test_the_checks_catch_what_is_gone() -> None:
    """Each rule refuses a name that does not exist (so that a passing run means something)."""
    document = REPO / "README.md"
    spans = ["activities/node/agent.py", "node/libvirt/", "agent/serve.py", "activities/control/", "modelplane.ai/pool"]
    assert list(stale_paths(document, spans, [])) == ["activities/node/agent.py", "node/libvirt/"]
    assert list(stale_paths(document, [], ["  gone/x.py  see store/no_such.py and agent/serve.py"])) == [
        "store/no_such.py"
    ]
    assert list(stale_python(["scheduler.cel.compile_selector", "scheduler.cel.no_such_name"], [])) == [
        "scheduler.cel.no_such_name"
    ]
    assert list(stale_variables("BERTH_DATABASE_URL BERTH_NO_SUCH BERTH_BREAKER_* BERTH_GONE_*")) == [
        "BERTH_NO_SUCH",
        "BERTH_GONE_*",
    ]
    assert not list(command_problems("berth alloc create|list --wait"))
    assert list(command_problems("berth alloc fly")) == ["fly (no such command under alloc)"]
    assert list(command_problems("berth worker node --token SECRET")) == ["--token (not an option of node)"]
