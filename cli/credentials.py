"""What `berth login` keeps, now in the library (berth/credentials.py) so that `berth.Client` and the CLI read the
same login: this module gives the CLI its functions, with the library's errors as the CLI's `ApiFailure` (one line).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from berth import credentials as kept
from berth.credentials import REFRESH_AHEAD_SECONDS, Credentials, client_auth, credentials_file, load_all, save
from berth.errors import BerthError
from cli.api_failure import ApiFailure

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "REFRESH_AHEAD_SECONDS",
    "Credentials",
    "client_auth",
    "credentials_file",
    "from_token_answer",
    "id_token_claims",
    "load_all",
    "logged_in_token",
    "save",
]


def as_api_failure(error: BerthError) -> ApiFailure:
    """A library error as the CLI reports it: one line, with the API's code and status when it answered."""
    if error.status is None:
        return ApiFailure(error.message)
    line = f"{error.message} ({error.code}, HTTP {error.status})"
    return ApiFailure(line, message=error.message, code=error.code, status=error.status, details=error.details)


def _one_line(function: F) -> F:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BerthError as error:
            raise as_api_failure(error) from error

    return call  # type: ignore[return-value]


id_token_claims = _one_line(kept.id_token_claims)
from_token_answer = _one_line(kept.from_token_answer)
logged_in_token = _one_line(kept.logged_in_token)
