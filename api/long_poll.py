"""Long polls: a GET of one object that waits, inside the request, until the object is in a state the caller named.

    GET /v1/allocations/{id}?wait_for=active&timeout=60s     (also `wait_for=active,failed` or the parameter repeated)

The answer comes as soon as the object is in one of the `wait_for` states or in a final one (it will never reach
another), or when `timeout` has passed (a typed duration, at most 60s, 30s by default): 200 with the object as it is
then, either way; the caller reads its state. A state the resource does not have is a 422 naming the valid ones, and
an object the caller may not see is the GET's own 404, at once. `timeout` alone, without `wait_for`, waits for nothing.

Each route gives its own way of reading the state (`Wait.until`), read again every `INTERVAL` seconds: an
allocation's from its row and, while it runs, its workflow's status query (what the GET answers); a reservation's
from its row; a deployment's from its workflow. No database session is held between reads, so a thousand waiting
clients hold no connection while they wait; a client that goes away ends its wait at the next read. The API sets no
request timeout of its own (api/app.py's middleware bounds bodies, not time), so a proxy in front of it must allow
at least `WAIT_MOST_SECONDS`.
"""

# No `from __future__ import annotations`: FastAPI reads the dependency's annotations, which name its closure's states.
import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Query, Request
from pydantic import WithJsonSchema

from api.request_checks import invalid_request
from contracts.http import WAIT_DEFAULT_SECONDS, WAIT_MOST_SECONDS, WaitTimeout

T = TypeVar("T")
INTERVAL = 0.3  # seconds between two reads of a waiting object's state


@dataclass(frozen=True)
class Wait:
    """What one request waits for: until the state is in `states` or `final`, at most `seconds`."""

    states: frozenset[str]
    final: frozenset[str]
    seconds: float
    request: Request | None = None
    interval: float = INTERVAL

    async def until(self, read: Callable[[], Awaitable[T]], state_of: Callable[[T], str]) -> T:
        """Read until the state read is wanted or final, or the time is up; the last thing read."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        while True:
            found = await read()
            state = state_of(found)
            remaining = deadline - loop.time()
            if state in self.states or state in self.final or remaining <= 0:
                return found
            if self.request is not None and await self.request.is_disconnected():
                return found  # no one is waiting for the answer any more
            await asyncio.sleep(min(self.interval, remaining))


def states_asked(values: list[str] | None, known: Collection[str]) -> frozenset[str]:
    """`wait_for` as given, repeated or comma-separated: each a state of `known`, or a 422 naming them."""
    asked = {state.strip() for value in values or () for state in value.split(",") if state.strip()}
    unknown = sorted(asked - set(known))
    if unknown:
        raise invalid_request(
            "query.wait_for", f"{', '.join(map(repr, unknown))}: the states are {', '.join(known)}", "unknown_state"
        )
    if values and not asked:
        raise invalid_request("query.wait_for", f"names no state: give one or more of {', '.join(known)}", "no_state")
    return frozenset(asked)


def waiting(what: str, known: tuple[str, ...], final: tuple[str, ...]) -> Callable[..., Awaitable[Wait | None]]:
    """The dependency of a GET that may wait: None when it names no `wait_for`, else what it waits for."""

    one = f"({'|'.join(known)})"
    listed = WithJsonSchema({"type": "array", "items": {"type": "string", "pattern": f"^{one}(,{one})*$"}})

    async def wait(
        request: Request,
        wait_for: Annotated[
            Annotated[list[str], listed] | None,
            Query(
                description=f"Wait until the {what} is in one of these states ({', '.join(known)}; repeated or "
                f"comma-separated) or a final one ({', '.join(final)}), or until `timeout`; then answer as usual.",
            ),
        ] = None,
        timeout_: Annotated[
            WaitTimeout | None,
            Query(
                alias="timeout",
                description=f"How long `wait_for` may wait: `30s`, `1m` (at most {WAIT_MOST_SECONDS:g}s; default "
                f"{WAIT_DEFAULT_SECONDS:g}s).",
            ),
        ] = None,
    ) -> Wait | None:
        if not wait_for:
            return None
        seconds = WAIT_DEFAULT_SECONDS if timeout_ is None else timeout_
        return Wait(states_asked(wait_for, known), frozenset(final), seconds, request)

    return wait
