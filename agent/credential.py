"""The node's own token, the one credential a node agent holds: for its reports to the API and its calls through
the node gateway (gateway/), both of which accept it for this node's work only.

It is read from a file (`BERTH_NODE_TOKEN_FILE`, mode 0600, or a mounted Secret) or the environment
(`BERTH_NODE_TOKEN`), never from an argument: a command line is readable by every user of the host through /proc.
A file is reread every `REREAD_SECONDS`, so an operator rotates a token by writing the new one over it
(`berth tokens rotate --node N --to-dir DIR`): the agent uses it within seconds, without a restart, and the old one
is revoked after a grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("berth.agent")
REREAD_SECONDS = 2.0


class CredentialError(ValueError):
    """No usable token: the message says where it was looked for."""


class NodeCredential:
    def __init__(self, token: str | None = None, path: Path | None = None) -> None:
        if (token is None) == (path is None):
            raise CredentialError("a node token comes from a file or the environment, exactly one of them")
        self.path = path
        self._token = token if token is not None else self._read()
        if not self._token:
            raise CredentialError(f"{path or 'BERTH_NODE_TOKEN'} holds no token")

    def _read(self) -> str:
        assert self.path is not None
        try:
            return self.path.read_text().strip()
        except OSError as error:
            raise CredentialError(f"cannot read the node token from {self.path}: {error.strerror}") from None

    def current(self) -> str:
        return self._token

    def reread(self) -> bool:
        """Take the file's token if it changed (True); a file briefly missing or empty mid-rotation keeps the old."""
        if self.path is None:
            return False
        try:
            token = self._read()
        except CredentialError as error:
            log.warning("%s; keeping the token read before", error)
            return False
        if not token or token == self._token:
            return False
        self._token = token
        log.info("node token reread from %s", self.path)
        return True

    async def watch(self, *uses: Callable[[str], None]) -> None:
        """Reread the file every few seconds and hand a new token to each of its `uses` (a client, a report sink)."""
        if self.path is None:
            return
        while True:
            await asyncio.sleep(REREAD_SECONDS)
            if await asyncio.to_thread(self.reread):
                for use in uses:
                    use(self._token)
