"""What a database error means to the rest of Berth, which never names SQLAlchemy's or asyncpg's exceptions itself.

Above all, telling "PostgreSQL is down or going away" apart from "Berth sent a bad statement". The first is a
dependency outage: the caller should hear 503 `database_unavailable` and retry. The second is a bug and must stay
loud. SQLAlchemy wraps asyncpg's errors several ways (`OperationalError`, `InterfaceError`, and `InternalError` for
asyncpg's own `InternalClientError`, which a connection cut mid-protocol raises), so the class SQLAlchemy picked says
little; the cause chain does. An outage is any of:

- a connection that could not be made or was lost (`OSError`, asyncpg's `InterfaceError`, `InternalClientError`,
  a pool checkout timeout);
- a server answer whose SQLSTATE class means the server, not the statement, is the problem (PostgreSQL appendix A):
  08 connection exception, 53 insufficient resources, 57 operator intervention (admin or crash shutdown, "the
  database system is starting up"), 58 system error, and 40 transaction rollback (a serialization failure or
  deadlock: nothing was written, and the same request a moment later succeeds).

Besides: which errors a handler should sort so (`DATABASE_ERRORS`), those a one-shot command stops on
(`UNREACHABLE_OR_REFUSED`) or a caller that answers all alike catches (`ANY_DATABASE_ERROR`), and PostgreSQL's own
words when it refused a statement (`refused_statement`) or a value (`refused_value`).
"""

from __future__ import annotations

import asyncpg
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)
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

# Every error the database stack raises, outage or not, for a handler that then asks `is_database_outage` which it
# is (the API's: 503 for an outage, 500 for a bug); `ConnectionError`: a connection refused or reset that reached
# the caller unwrapped.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    DBAPIError,
    PoolTimeout,
    DisconnectionError,
    ConnectionError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)

# What a command that talks to PostgreSQL itself (`berth apply`, `berth migrate`, `berth tokens`, `berth gateway`)
# stops on, saying it cannot reach the database: a connection that failed, or anything the driver raised. It makes
# one attempt and nobody retries it, so an outage and a refused statement both end it; only the message differs.
UNREACHABLE_OR_REFUSED: tuple[type[Exception], ...] = (OSError, DBAPIError)

# Anything the database layer raises, SQLAlchemy's own errors included (its pool exhausted), and a connection that
# failed outright: for a caller that answers every one alike (the node gateway checking a token: UNAVAILABLE, and the
# node agent retries).
ANY_DATABASE_ERROR: tuple[type[Exception], ...] = (OSError, SQLAlchemyError)


def refused_statement(error: BaseException) -> str | None:
    """What PostgreSQL said when it refused a statement as written (a table that does not exist, a missing
    privilege), or None when `error` is something else."""
    return str(error.orig) if isinstance(error, ProgrammingError) else None


def refused_value(error: BaseException) -> str | None:
    """What PostgreSQL said when it refused a value that the caller's own validation let through (too long for its
    column, out of range, against a constraint), or None when `error` is something else."""
    return str(error.orig) if isinstance(error, DataError | IntegrityError) else None


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
