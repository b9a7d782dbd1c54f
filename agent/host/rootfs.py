"""Read a host's files under a root directory, and never outside it.

Discovery runs against `/` on a host, and against a fixture tree (or a host image mounted somewhere) everywhere else.
Symlinks are therefore resolved by hand, the way a chroot would: an absolute target, or a `..` that climbs above the
root, stays inside the root, so a tree cannot make discovery read the machine it runs on. sysfs paths share long
prefixes (`sys/devices/pci0000:17/...`), so every resolved prefix is cached: resolution costs one `lstat` per
distinct directory, not per read.

Paths are given and reported relative to the root, without a leading slash (`sys/bus/pci/devices`). Failures are the
ordinary `OSError`s (`FileNotFoundError` for an absent entry or a dangling link) plus `ValueError` for bytes that are
not text; deciding what a failure means is the caller's business.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_LINK_HOPS = 40  # what Linux allows before ELOOP
MAX_READ = 1 << 20  # bounds what a hostile tree can make discovery hold
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class HostRoot:
    """A read-only, root-confined view of one host's files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self._resolved: dict[str, str] = {}  # prefix with resolved parents -> fully resolved path

    def real(self, path: str) -> str:
        """`path` with every symlink resolved inside the root. Raises FileNotFoundError where a component is absent."""
        return self._resolve(path, 0)

    def read_text(self, path: str) -> str:
        """A file's contents (at most MAX_READ bytes: sysfs attributes are a page at most)."""
        parent, _, name = path.rstrip("/").rpartition("/")
        try:  # the common case, a plain file in a resolved directory, without an lstat of the file itself
            fd = os.open(os.path.join(self._full(self.real(parent)), name), _READ | os.O_NOFOLLOW)
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            fd = os.open(self._full(self.real(path)), _READ)  # the file itself is a symlink: resolve it here
        try:
            chunks, size = [], 0
            while size < MAX_READ and (chunk := os.read(fd, min(1 << 16, MAX_READ - size))):
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8").replace("\x00", "")  # some attributes are NUL-padded

    def readlink(self, path: str) -> str | None:
        """The target of a symlink; None when there is no entry at all. Raises OSError(EINVAL) for a non-link."""
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            full = self._full(self._join(self.real(parent) if parent else "", name))
            mode = os.lstat(full).st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISLNK(mode):
            raise OSError(errno.EINVAL, "not a symlink")
        return os.readlink(full)

    def listdir(self, path: str) -> list[str]:
        """Sorted entry names. Raises FileNotFoundError when the directory is absent."""
        return sorted(os.listdir(self._full(self.real(path))))

    def is_dir(self, path: str) -> bool:
        try:
            return stat.S_ISDIR(os.stat(self._full(self.real(path))).st_mode)
        except (OSError, ValueError):
            return False

    def _full(self, resolved: str) -> str:
        return os.path.join(self.root, resolved) if resolved else str(self.root)

    @staticmethod
    def _join(base: str, name: str) -> str:
        return f"{base}/{name}" if base else name

    def _resolve(self, path: str, hops: int) -> str:
        current = ""
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                current = current.rpartition("/")[0]  # at the root, `..` is the root
                continue
            candidate = self._join(current, part)
            cached = self._resolved.get(candidate)
            if cached is not None:
                current = cached
                continue
            full = self._full(candidate)
            if stat.S_ISLNK(os.lstat(full).st_mode):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", "/" + candidate)
                target = os.readlink(full)
                resolved = self._resolve(target if target.startswith("/") else f"{current}/{target}", hops)
            else:
                resolved = candidate
            self._resolved[candidate] = resolved
            current = resolved
        return current
