"""Task tokens sealed to the node they were handed to.

Temporal's task token names a workflow, a run and an activity; anyone holding one can complete, fail or heartbeat
that activity. The gateway hands a node only tokens it sealed: `version | len(node) | node | HMAC | token`, the HMAC
(SHA-256, keyed with the gateway's secret) over the node's name and the token. A node can answer only a task whose
token it was given, and only as the node it was given to: a token copied from another node, or one built by hand
from guessed ids, is refused. The seal needs no state, so a gateway that is killed and restarted (with the same key)
still accepts the answers to the tasks it handed out before: an agent mid-activity loses nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from config.context import write_private

VERSION = b"\x01"
DIGEST = hashlib.sha256


class SealError(ValueError):
    """The token was not sealed by this gateway's key for this node."""


class TaskTokenSeal:
    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("the node gateway's key must be at least 32 bytes")
        self._key = key

    def _mac(self, node: bytes, token: bytes) -> bytes:
        return hmac.new(self._key, len(node).to_bytes(1, "big") + node + token, DIGEST).digest()

    def seal(self, node: str, token: bytes) -> bytes:
        name = node.encode()
        if not 0 < len(name) < 256:
            raise ValueError(f"node name of {len(name)} bytes cannot be sealed")
        return VERSION + len(name).to_bytes(1, "big") + name + self._mac(name, token) + token

    def open(self, node: str, sealed: bytes) -> bytes:
        """The token inside `sealed`, when this gateway sealed it for `node`; else SealError."""
        size = DIGEST().digest_size
        if len(sealed) < 2 or sealed[:1] != VERSION:
            raise SealError("the task token was not issued by the node gateway")
        length = sealed[1]
        name, mac, token = sealed[2 : 2 + length], sealed[2 + length : 2 + length + size], sealed[2 + length + size :]
        if len(mac) != size or not hmac.compare_digest(mac, self._mac(name, token)):
            raise SealError("the task token was not issued by the node gateway")
        if name != node.encode():
            raise SealError("the task was issued to another node")
        return token


def ensure_key_file(path: Path) -> bool:
    """Give `path` a new random key (mode 0600) unless it holds one already; True when one was written. Every
    gateway replica reads the same file, and a restarted gateway must keep the key its tasks were sealed with."""
    if path.is_file() and len(path.read_bytes().strip()) >= 32:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, secrets.token_urlsafe(48) + "\n")
    return True
