"""`context.json`: what `berth up` started and where, so every later command finds it without flags.

Explicit settings (BERTH_* variables, CLI options) always win over the context file.
"""

from __future__ import annotations

import json
import os
import urllib.parse
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
    try:
        return StackContext.model_validate_json(settings.context_file.read_text())
    except (FileNotFoundError, ValidationError, json.JSONDecodeError):
        return None


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
    context = read_context(settings)
    if context is None:
        raise NotConfigured(
            f"no database configured: set BERTH_DATABASE_URL, or start the dev stack with `berth up` "
            f"(looked for {settings.context_file})"
        )
    return context.database_url


def temporal_target(settings: Settings) -> tuple[str, str]:
    """(address, namespace) of the Temporal frontend."""
    if settings.temporal_address:
        return settings.temporal_address, settings.temporal_namespace
    context = read_context(settings)
    if context is None:
        raise NotConfigured(
            f"no Temporal server configured: set BERTH_TEMPORAL_ADDRESS, or start the dev stack with `berth up` "
            f"(looked for {settings.context_file})"
        )
    return context.temporal_address, context.temporal_namespace
