"""Semantic versions as Kubernetes' CEL semver library sees them (blang/semver v4 under the hood).

`semver("1.2.3")` is strict SemVer 2.0.0: exactly MAJOR.MINOR.PATCH, no leading zeroes, no "v".
`semver("v1.2", true)` first normalizes (drops one leading "v", leading zeroes, fills a missing minor or
patch with 0), as Kubernetes' normalizeAndParse does. Versions compare by SemVer precedence: build
metadata is ignored, a pre-release sorts before its release, numeric identifiers before alphanumeric ones.
A `version` attribute of a device is parsed strictly.
"""

from __future__ import annotations

import functools
import string

_DIGITS = frozenset(string.digits)
_ALPHANUMERIC = frozenset(string.ascii_letters + string.digits + "-")
_MAX_UINT64 = 2**64 - 1


class SemverError(ValueError):
    """The text is not a semantic version; the message is blang/semver's."""


def _only(text: str, allowed: frozenset[str]) -> bool:
    return all(char in allowed for char in text)


def _number(text: str, what: str) -> int:
    if not _only(text, _DIGITS):
        raise SemverError(f"Invalid character(s) found in {what} number {text!r}")
    if len(text) > 1 and text[0] == "0":
        raise SemverError(f"{what.capitalize()} number must not contain leading zeroes {text!r}")
    if not text or len(text) > 20 or int(text) > _MAX_UINT64:
        raise SemverError(f"invalid {what} number {text!r}")
    return int(text)


def _prerelease_identifier(text: str) -> int | str:
    """A numeric identifier as int, an alphanumeric one as str."""
    if not text:
        raise SemverError("Prerelease is empty")
    if _only(text, _DIGITS):
        if len(text) > 1 and text[0] == "0":
            raise SemverError(f"Numeric PreRelease version must not contain leading zeroes {text!r}")
        if len(text) > 20 or int(text) > _MAX_UINT64:
            raise SemverError(f"invalid numeric prerelease identifier {text!r}")
        return int(text)
    if not _only(text, _ALPHANUMERIC):
        raise SemverError(f"Invalid character(s) found in prerelease {text!r}")
    return text


def _compare_identifiers(mine: int | str, theirs: int | str) -> int:
    if isinstance(mine, int) != isinstance(theirs, int):
        return -1 if isinstance(mine, int) else 1
    return (mine > theirs) - (mine < theirs)  # type: ignore[operator]


class Semver:
    """An immutable semantic version. Equal versions (ignoring build metadata) compare and hash equal."""

    __slots__ = ("major", "minor", "patch", "prerelease", "_text")

    def __init__(self, major: int, minor: int, patch: int, prerelease: tuple[int | str, ...], text: str) -> None:
        self.major = major
        self.minor = minor
        self.patch = patch
        self.prerelease = prerelease
        self._text = text

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by SemVer precedence, as in `compareTo`."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if not self.prerelease or not other.prerelease:
            return (not self.prerelease) - (not other.prerelease)
        for left, right in zip(self.prerelease, other.prerelease, strict=False):
            order = _compare_identifiers(left, right)
            if order:
                return order
        return (len(self.prerelease) > len(other.prerelease)) - (len(self.prerelease) < len(other.prerelease))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def __repr__(self) -> str:
        return f"Semver({self._text!r})"


@functools.lru_cache(maxsize=4096)
def parse_semver(text: str) -> Semver:
    """Parse strict SemVer 2.0.0; raises SemverError."""
    if not text:
        raise SemverError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise SemverError("No Major.Minor.Patch elements found")
    major, minor = _number(parts[0], "major"), _number(parts[1], "minor")
    patch_text, _, build = parts[2].partition("+")
    patch_text, has_prerelease, prerelease = patch_text.partition("-")
    patch = _number(patch_text, "patch")
    identifiers = tuple(_prerelease_identifier(part) for part in prerelease.split(".")) if has_prerelease else ()
    if "+" in parts[2]:
        for part in build.split("."):
            if not part:
                raise SemverError("Build meta data is empty")
            if not _only(part, _ALPHANUMERIC):
                raise SemverError(f"Invalid character(s) found in build meta data {part!r}")
    return Semver(major, minor, patch, identifiers, text)


def parse_semver_normalized(text: str) -> Semver:
    """`semver(text, true)`: tolerate a "v" prefix, leading zeroes and a missing minor or patch."""
    parts = text.removeprefix("v").split(".", 2)
    for index, part in enumerate(parts):
        if len(part) > 1:
            trimmed = part.lstrip("0")
            parts[index] = trimmed if trimmed[:1] in _DIGITS else "0" + trimmed
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            raise SemverError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return parse_semver(".".join(parts))
