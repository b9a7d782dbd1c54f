"""docs/identity.md lists every code the API can refuse a caller with at authentication, read from the code itself:
the verifier's `OidcRefused`, the bearer check's `ApiError` and the Berth tokens' `TokenRefused`. A code added to the
code and not to the table fails here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _codes(path: str, call: str) -> set[str]:
    """The string codes `path` passes to `call`: its first string argument, or its `code=` keyword."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((REPO / path).read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == call:
            arguments = [*node.args, *(keyword.value for keyword in node.keywords if keyword.arg == "code")]
            strings = [a.value for a in arguments if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            statuses = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, int)]
            if strings and (call != "ApiError" or set(statuses) & {401, 503}):
                found.add(strings[0])
    return found


def test_every_refusal_code_at_authentication_is_documented() -> None:
    codes = _codes("api/oidc.py", "OidcRefused") | _codes("api/auth.py", "ApiError")
    codes |= _codes("store/tokens.py", "TokenRefused")
    assert {"invalid_token", "email_not_verified", "identity_provider_unavailable", "token_revoked"} <= codes
    documented = (REPO / "docs/identity.md").read_text()
    assert sorted(code for code in codes if f"`{code}`" not in documented) == []
