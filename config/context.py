"""`context.json`: what `berth up` started and where, so every later command finds it without flags.

Explicit settings (BERTH_* variables, CLI options) always win over the context file. A command looks for the file
where kubectl users look for a kubeconfig, and uses the first that exists (`find_context`):

    BERTH_CONTEXT                      the file named, and no other
    BERTH_STATE_DIR/context.json       when that variable is set: the state dir `berth up` was given
    ./.berth/context.json, then ../.berth/context.json and so on up to the root: a shell anywhere in the project
    $XDG_CONFIG_HOME/berth/context.json (~/.config/berth/context.json): a context kept for the user

`berth up` writes its own state dir's file and reads only that one (`read_context`).
"""

from __future__ import annotations

import json
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from config.settings import Settings


class StackContext(BaseModel):
    api_url: str | None = None
    temporal_address: str
    temporal_namespace: str = "default"
    temporal_ui_url: str | None = None
    gateway_address: str | None = None  # the node gateway, the only way node agents reach Temporal
    database_url: str
    admin_token: str | None = None
    tenant_tokens: dict[str, str] = Field(default_factory=dict)
    pid: int | None = None  # the `berth up` process that owns the stack
    processes: dict[str, int] = Field(default_factory=dict)  # each supervised part's pid (postgres, api, ...)

    def workflow_link(self, workflow_id: str) -> str | None:
        """The workflow's page in the Temporal UI: its current run, which tells the allocation's whole story."""
        if self.temporal_ui_url is None:
            return None
        quoted = urllib.parse.quote(workflow_id, safe="")
        return f"{self.temporal_ui_url}/namespaces/{self.temporal_namespace}/workflows/{quoted}"


class NotConfigured(RuntimeError):
    """Nothing says where a service is: neither a BERTH_* variable nor a running `berth up`."""


def read_context(settings: Settings) -> StackContext | None:
    """The context file of `settings`' own state dir (what `berth up` wrote there), or None."""
    try:
        return StackContext.model_validate_json(settings.context_file.read_text())
    except (FileNotFoundError, ValidationError, json.JSONDecodeError):
        return None


def user_config_dir() -> Path:
    """Berth's directory among the user's configuration: `$XDG_CONFIG_HOME/berth`, by default `~/.config/berth`."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "berth"


@dataclass(frozen=True)
class ContextLookup:
    """Where the context came from: `path` the file used (None when none exists), `source` why that one, `searched`
    every place looked at in order with why, `context` its content (None for no file or one that does not parse,
    `problem` then says why)."""

    path: Path | None
    source: str | None
    searched: tuple[tuple[Path, str], ...]
    context: StackContext | None
    problem: str | None = None

    def places(self) -> str:
        """The places looked at, in a few words, for an error that found nothing."""
        said: list[str] = []
        for path, source in self.searched:
            if source == "this directory":
                said.append(f".berth/context.json in {path.parent.parent} and its parents")
            elif source in ("BERTH_CONTEXT", "BERTH_STATE_DIR"):
                said.append(f"{path} ({source})")
            elif source != "a parent":
                said.append(str(path))
        return ", ".join(said)


def context_places(settings: Settings) -> list[tuple[Path, str]]:
    """Every file a command would read as its context, in order, each with why it is looked at."""
    named = os.environ.get("BERTH_CONTEXT")
    if named:
        return [(Path(named).expanduser(), "BERTH_CONTEXT")]
    places: list[tuple[Path, str]] = []
    if "state_dir" in settings.model_fields_set:  # BERTH_STATE_DIR, or a state dir given in code
        places.append((settings.context_file, "BERTH_STATE_DIR"))
    here = Path.cwd()
    for directory in (here, *here.parents):
        places.append((directory / ".berth" / "context.json", "this directory" if directory == here else "a parent"))
    places.append((user_config_dir() / "context.json", "the user's config directory"))
    return places


def find_context(settings: Settings) -> ContextLookup:
    """The context a command uses: the first of `context_places` that exists."""
    searched = tuple(context_places(settings))
    for path, source in searched:
        try:
            text = path.read_text()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
        except OSError as error:
            return ContextLookup(path, source, searched, None, f"cannot be read: {error.strerror}")
        try:
            return ContextLookup(path, source, searched, StackContext.model_validate_json(text))
        except (ValidationError, json.JSONDecodeError) as error:
            return ContextLookup(path, source, searched, None, f"is not a context file: {str(error).splitlines()[0]}")
    return ContextLookup(None, None, searched, None)


def discovered_context(settings: Settings) -> StackContext | None:
    return find_context(settings).context


def where_looked(settings: Settings) -> str:
    """For an error that needed the context: the file found and what is wrong with it, or where it was looked for."""
    lookup = find_context(settings)
    if lookup.path is not None and lookup.problem is not None:
        return f"{lookup.path} {lookup.problem}"
    return f"looked for {lookup.places()}"


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all, readable by its owner only from its first byte.

    The file is created with mode 0600 by the `open` that makes it (never created wider and narrowed afterwards,
    which leaves a window in which another user can open it and keep reading), beside `path`, then renamed over it.
    A partial file a crash left behind is removed first: it may have any mode, and `O_EXCL` then guarantees that the
    file written is the one just created with ours."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as written:
        written.write(text)
    os.replace(partial, path)
    return path


def write_context(settings: Settings, context: StackContext) -> Path:
    """Written atomically and readable only by its owner: it holds tokens and the database password."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return write_private(settings.context_file, context.model_dump_json(indent=2))


def database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    context = discovered_context(settings)
    if context is None:
        raise NotConfigured(
            f"no database configured: set BERTH_DATABASE_URL, or start the dev stack with `berth up` "
            f"({where_looked(settings)})"
        )
    return context.database_url


def temporal_target(settings: Settings) -> tuple[str, str]:
    """(address, namespace) of the Temporal frontend."""
    if settings.temporal_address:
        return settings.temporal_address, settings.temporal_namespace
    context = discovered_context(settings)
    if context is None:
        raise NotConfigured(
            f"no Temporal server configured: set BERTH_TEMPORAL_ADDRESS, or start the dev stack with `berth up` "
            f"({where_looked(settings)})"
        )
    return context.temporal_address, context.temporal_namespace
