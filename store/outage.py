"""Telling "PostgreSQL is down or going away" apart from "Berth sent a bad statement".

The first is a dependency outage: the caller should hear 503 `database_unavailable` and retry. The second is a bug
and must stay loud. SQLAlchemy wraps asyncpg's errors several ways (`OperationalError`, `InterfaceError`, and
`InternalError` for asyncpg's own `InternalClientError`, which a connection cut mid-protocol raises), so the class
SQLAlchemy picked says little; the cause chain does. An outage is any of:

- a connection that could not be made or was lost (`OSError`, asyncpg's `InterfaceError`, `InternalClientError`,
  a pool checkout timeout);
- a server answer whose SQLSTATE class means the server, not the statement, is the problem (PostgreSQL appendix A):
  08 connection exception, 53 insufficient resources, 57 operator intervention (admin or crash shutdown, "the
  database system is starting up"), 58 system error, and 40 transaction rollback (a serialization failure or
  deadlock: nothing was written, and the same request a moment later succeeds).
"""

from __future__ import annotations

import asyncpg
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

OUTAGE_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_LOST_CONNECTION = (
    OSError,  # refused, reset, unreachable (ConnectionError is one)
    TimeoutError,
    PoolTimeout,
    DisconnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


def is_database_outage(error: BaseException) -> bool:
    """True when `error`, or anything in its cause chain, says the database cannot be reached or is going away."""
    if isinstance(error, OperationalError | InterfaceError) and getattr(error, "connection_invalidated", False):
        return True
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _LOST_CONNECTION):
            return True
        sqlstate = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate[:2] in OUTAGE_SQLSTATE_CLASSES:
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False
