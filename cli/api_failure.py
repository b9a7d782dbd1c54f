"""`ApiFailure`: what reaches a person when the Berth API (or the identity provider behind `berth login`) cannot
answer a command, as one line. Its own module because both the client (cli/client.py) and the login store
(cli/credentials.py) raise it, and the client builds on the login store."""

from __future__ import annotations

from typing import Any


class ApiFailure(Exception):
    """The API could not be reached, or answered with an error; `str()` is the one line to show. An answer in the
    API's error envelope keeps its parts (`message` without the code, `code`, `status`, `details`) for `-o json`."""

    def __init__(
        self,
        line: str,
        *,
        message: str | None = None,
        code: str = "failed",
        status: int | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(line)
        self.message = message or line
        self.code, self.status, self.details = code, status, details
