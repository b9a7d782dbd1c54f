"""Sync classes generated from the async resources: each public method of the async class becomes a method of the
same name, signature and docstring that drives the async one's coroutine to its end (`berth._http.drive`), so
`dir()` and `help()` show real methods and no method is written twice.

What the async method gives back decides what the sync one does: a coroutine is run to its result, an async
iterator becomes an iterator, an async context manager a context manager."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any

from berth._http import drive


def iterate(items: AsyncIterator[Any]) -> Iterator[Any]:
    while True:
        try:
            item = drive(items.__anext__())
        except StopAsyncIteration:
            return
        yield item


class Context:
    """An async context manager used with `with`."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def __enter__(self) -> Any:
        return drive(self._manager.__aenter__())

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> Any:
        return drive(self._manager.__aexit__(kind, error, tb))


SKIPPED = frozenset({"aclose"})  # the sync class has close()


def _run(result: Any) -> Any:
    if inspect.iscoroutine(result):
        return drive(result)
    if inspect.isasyncgen(result):
        return iterate(result)
    if hasattr(result, "__aenter__"):
        return Context(result)
    return result


def _sync_signature(method: Callable[..., Any]) -> inspect.Signature:
    signature = inspect.signature(method)
    annotation = signature.return_annotation
    if isinstance(annotation, str):
        annotation = annotation.replace("AsyncIterator[", "Iterator[")
        annotation = annotation.replace("AbstractAsyncContextManager[", "AbstractContextManager[")
    return signature.replace(return_annotation=annotation)


def _method(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _run(getattr(self._async, name)(*args, **kwargs))

    call.__signature__ = _sync_signature(method)  # type: ignore[attr-defined]
    del call.__wrapped__  # type: ignore[attr-defined]  # help() shows the sync signature, not the async one
    return call


def synced(async_class: type, doc: str | None = None) -> type:
    """The sync class of `async_class`: its instances wrap an instance of it (`_async`) built over a blocking
    transport."""
    namespace: dict[str, Any] = {"__doc__": doc or async_class.__doc__, "__module__": "berth"}
    for name, member in inspect.getmembers(async_class, inspect.isfunction):
        if not name.startswith("_") and name not in SKIPPED:
            namespace[name] = _method(name, member)

    def __init__(self: Any, wrapped: Any) -> None:
        self._async = wrapped

    namespace.setdefault("__init__", __init__)
    return type(async_class.__name__, (), namespace)
