"""Which API a client calls and which bearer it sends: one resolution for the library and the `berth` CLI.

    url    explicit, else BERTH_API_URL, else the context file's `api_url`
    token  explicit, else BERTH_TOKEN, else the login `berth login` kept for that URL (refreshed),
           else the context file's admin token (or `tenant`'s token), only when the URL is the context's own

The context file is found as every `berth` command finds it (config/context.py: BERTH_CONTEXT, BERTH_STATE_DIR,
`.berth/context.json` here or in a parent, the user's config directory). A token from the context file is never
sent to another API than the context's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from berth.credentials import logged_in_token
from berth.errors import NotConfigured
from config.context import ContextLookup, StackContext, find_context, where_looked
from config.settings import Settings


@dataclass(frozen=True)
class Target:
    url: str
    token: str = ""

    def __repr__(self) -> str:  # never the token
        return f"Target(url={self.url!r})"


def api_url(api: str | None, context: StackContext | None = None) -> str:
    """The API: `api`, else the context's; `NotConfigured` when neither says."""
    url = (api or (context.api_url if context else None) or "").rstrip("/")
    if not url:
        hint = f"or start the dev stack with `berth up` ({where_looked(Settings())})"
        raise NotConfigured(f"no Berth API configured: pass --api, set BERTH_API_URL, {hint}", code="not_configured")
    return url


def resolve_url(api: str | None = None, *, environment: bool = False) -> str:
    """The API alone, for a call that needs no token: `api`, else BERTH_API_URL (`environment`), else the context
    file's."""
    if environment:
        api = api or os.environ.get("BERTH_API_URL") or None
    lookup = find_context(Settings()) if api is None else None
    return api_url(api, lookup.context if lookup is not None else None)


def resolve_target(
    api: str | None = None, token: str | None = None, tenant: str | None = None, *, environment: bool = False
) -> Target:
    """Where to send requests and with which token. `environment`: read BERTH_API_URL and BERTH_TOKEN for what
    is not given (the CLI's options read them themselves, the library asks for it)."""
    if environment:
        api = api or os.environ.get("BERTH_API_URL") or None
        token = token or os.environ.get("BERTH_TOKEN") or None
    lookup: ContextLookup | None = find_context(Settings()) if api is None or token is None else None
    context = lookup.context if lookup is not None else None
    url = api_url(api, context)
    if token is None and tenant is None:
        token = logged_in_token(url)  # the person who ran `berth login` for this API acts as themselves
    if token is None and context is not None and url == (context.api_url or "").rstrip("/"):
        if tenant is None:
            token = context.admin_token
        elif tenant in context.tenant_tokens:
            token = context.tenant_tokens[tenant]
        else:
            known = ", ".join(sorted(context.tenant_tokens)) or "none"
            where = lookup.path if lookup is not None else "the context file"
            raise NotConfigured(f"{where} has no token for tenant {tenant!r} (it has: {known})", code="not_configured")
    if not token:
        hint = f"or start the dev stack with `berth up` ({where_looked(Settings())})"
        raise NotConfigured(
            f"no API token: pass --token, set BERTH_TOKEN, log in (`berth login`) {hint}", code="not_configured"
        )
    return Target(url, token)
