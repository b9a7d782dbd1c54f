"""Opaque cursors for keyset-paged lists (`GET /v1/allocations`, `GET /v1/deployments`).

A cursor is the position of the last item of a page: base64url of a small JSON array that starts with the list's
kind, so a cursor of one list given to another, or any string a client made up, is a 422 `invalid_cursor` rather
than a wrong page. It names a position, not a snapshot: rows created after the first page (newer than it) are not
in the later pages, and a row deleted meanwhile is simply not returned; no row is returned twice.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated

from fastapi import Query

from api.errors import ApiError

MAX_CURSOR = 1024
CursorParam = Annotated[
    str | None,
    Query(max_length=MAX_CURSOR, description="`next_cursor` of the previous page; unset starts at the first page."),
]


def encode(kind: str, *position: str) -> str:
    raw = json.dumps([kind, *position], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _invalid(cursor: str, why: str) -> ApiError:
    problem = {"field": "query.cursor", "message": why, "type": "invalid_cursor"}
    return ApiError(422, "invalid_cursor", f"cursor is not one this list gave out: {why}", [problem])


def decode(cursor: str, kind: str, size: int) -> Sequence[str]:
    """The position a cursor of list `kind` names (`size` strings), or 422 `invalid_cursor`."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError) as error:
        raise _invalid(cursor, "not base64url of JSON") from error
    if not isinstance(value, list) or not value or value[0] != kind:
        raise _invalid(cursor, f"not a cursor of {kind}")
    position = value[1:]
    if len(position) != size or not all(isinstance(part, str) for part in position):
        raise _invalid(cursor, "malformed position")
    return position


def timestamp(cursor: str, value: str) -> datetime:
    """A cursor's timestamp part, or 422 `invalid_cursor`."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError as error:
        raise _invalid(cursor, "malformed position") from error
    if at.tzinfo is None:
        raise _invalid(cursor, "malformed position")
    return at
