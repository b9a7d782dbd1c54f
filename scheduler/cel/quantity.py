"""Kubernetes resource quantities ("141Gi", "1.5", "2e3"), with apimachinery's exact semantics.

A selector such as `device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("140Gi"))` must give
the answer Kubernetes gives, so this follows `resource.ParseQuantity` and `resource.Quantity` closely:

* The grammar is the documented one: an optional sign, digits with at most one dot (at least one digit),
  then one suffix: binary `Ki Mi Gi Ti Pi Ei`, decimal `n u m "" k M G T P E`, or an exponent `e3`/`E-3`.
* Values are exact. A non-zero value finer than 1n is rounded away from zero to 1n; a binary value is
  capped at 2^63-1 in magnitude.
* apimachinery keeps a quantity either as a small scaled int64 or as an arbitrary-precision decimal, and
  `isInteger`/`asInteger` succeed only for the first kind at a non-negative scale. So `quantity("1.5Gi")`
  is not an "integer" although its value is whole. That is Kubernetes' behaviour, so it is ours; the
  `compact` flag below records which representation apimachinery would hold.

One deliberate departure: exponents beyond +-1024 and numbers of more than 1024 digits are rejected.
Kubernetes accepts exponents up to +-2^31 and would then spend unbounded memory comparing such values; no
device capacity needs them.
"""

from __future__ import annotations

import functools
import re

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
MAX_EXPONENT = 1024
_NANO_EXPONENT = -9
_MAX_INT64_DIGITS = 18
_MAX_INT32 = 2**31 - 1

FORMAT_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
SUFFIX_ERROR = "unable to parse quantity's suffix"

_SHAPE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[+-]?[0-9]*)")
_EXPONENT_SUFFIX = re.compile(r"[eE]([+-]?[0-9]+)")
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}

# Go's math.Pow10 multiplies two table entries; doing the same keeps asApproximateFloat bit-identical.
_POW10 = [float(f"1e{i}") for i in range(32)]
_POW10_POSITIVE_32 = [float(f"1e{32 * i}") for i in range(10)]
_POW10_NEGATIVE_32 = [float(f"1e-{32 * i}") for i in range(11)]


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity; the message is apimachinery's."""


def _fits_int64(value: int) -> bool:
    return MIN_INT64 <= value <= MAX_INT64


def _interpret_suffix(suffix: str) -> tuple[int, int]:
    """The (base, exponent) a suffix multiplies the number by."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix]
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix]
    match = _EXPONENT_SUFFIX.fullmatch(suffix)
    if match is None or len(match[1]) > 11 or abs(int(match[1])) > _MAX_INT32:
        raise QuantityError(SUFFIX_ERROR)
    exponent = int(match[1])
    if abs(exponent) > MAX_EXPONENT:
        raise QuantityError(f"quantity exponent {exponent} is outside the supported range +-{MAX_EXPONENT}")
    return 10, exponent


def _round_up_to_nano(magnitude: int, exponent: int) -> int:
    """A non-negative `magnitude * 10**exponent` as a count of nanos, rounded away from zero."""
    if exponent >= _NANO_EXPONENT:
        return magnitude * 10 ** (exponent - _NANO_EXPONENT)
    shift = _NANO_EXPONENT - exponent
    if shift >= len(str(magnitude)):
        return 1
    whole, rest = divmod(magnitude, 10**shift)
    return whole + (rest > 0)


def _go_pow10(exponent: int) -> float:
    if 0 <= exponent <= 308:
        return _POW10_POSITIVE_32[exponent // 32] * _POW10[exponent % 32]
    if -323 <= exponent < 0:
        return _POW10_NEGATIVE_32[-exponent // 32] / _POW10[-exponent % 32]
    return float("inf") if exponent > 0 else 0.0


def _to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


class Quantity:
    """An immutable quantity worth `mantissa * 10**exponent`.

    `compact` is True where apimachinery would hold an int64 amount (mantissa fits int64), False where it
    would hold an arbitrary-precision decimal. Equality, hashing and ordering use the exact value only.
    """

    __slots__ = ("_mantissa", "_exponent", "_compact")

    def __init__(self, mantissa: int, exponent: int, compact: bool) -> None:
        self._mantissa = mantissa
        self._exponent = exponent
        self._compact = compact

    @classmethod
    def from_int(cls, value: int) -> Quantity:
        """An integer as `quantity.add(20)` sees it: an int64 amount at scale 0."""
        return cls(value, 0, compact=True)

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1 as in `compareTo`."""
        low = min(self._exponent, other._exponent)
        mine = self._mantissa * 10 ** (self._exponent - low)
        theirs = other._mantissa * 10 ** (other._exponent - low)
        return (mine > theirs) - (mine < theirs)

    def sign(self) -> int:
        return (self._mantissa > 0) - (self._mantissa < 0)

    def add(self, other: Quantity) -> Quantity:
        return self._combine(other._mantissa, other)

    def sub(self, other: Quantity) -> Quantity:
        return self._combine(-other._mantissa, other)

    def _combine(self, other_mantissa: int, other: Quantity) -> Quantity:
        """Sum with `other_mantissa * 10**other.exponent`, keeping int64 form while apimachinery would."""
        if self._compact and other._compact:
            summed = _int64_amount_sum(self._mantissa, self._exponent, other_mantissa, other._exponent)
            if summed is not None:
                return Quantity(summed[0], summed[1], compact=True)
        low = min(self._exponent, other._exponent)
        mantissa = self._mantissa * 10 ** (self._exponent - low) + other_mantissa * 10 ** (other._exponent - low)
        return Quantity(mantissa, low, compact=False)

    def as_int64(self) -> int | None:
        """The value as int64 when apimachinery's `AsInt64` succeeds, else None."""
        if not self._compact or self._exponent < 0:
            return None
        value = self._mantissa * 10**self._exponent
        return value if _fits_int64(value) else None

    def as_approximate_float(self) -> float:
        base = _to_float(self._mantissa)
        if self._exponent == 0:
            return base
        return base * _go_pow10(self._exponent)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.compare(other) == 0

    def __hash__(self) -> int:
        mantissa, exponent = self._mantissa, self._exponent
        while mantissa and mantissa % 10 == 0:
            mantissa, exponent = mantissa // 10, exponent + 1
        return hash((mantissa, exponent if mantissa else 0))

    def __repr__(self) -> str:
        return f"Quantity({self._mantissa}e{self._exponent})" if self._exponent else f"Quantity({self._mantissa})"


def _int64_amount_sum(a: int, a_scale: int, b: int, b_scale: int) -> tuple[int, int] | None:
    """apimachinery's int64Amount.Add: the sum at the finer scale, or None on int64 overflow."""
    if b == 0:
        return a, a_scale
    if a == 0:
        return b, b_scale
    if a_scale > b_scale:
        a, a_scale = a * 10 ** (a_scale - b_scale), b_scale
    elif b_scale > a_scale:
        b = b * 10 ** (b_scale - a_scale)
    if not (_fits_int64(a) and _fits_int64(b) and _fits_int64(a + b)):
        return None
    return a + b, a_scale


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """Parse like `resource.ParseQuantity`; raises QuantityError with apimachinery's message."""
    shape = _SHAPE.fullmatch(text)
    if shape is None or not (shape[2] or shape[3]):
        raise QuantityError(FORMAT_ERROR)
    negative = shape[1] == "-"
    whole, fraction, suffix = shape[2], shape[3] or "", shape[4]
    if len(whole) + len(fraction) > MAX_EXPONENT:
        raise QuantityError(f"quantity has more than {MAX_EXPONENT} digits")
    base, exponent = _interpret_suffix(suffix)
    compact = _parse_compact(whole, fraction, base, exponent)
    if compact is not None:
        value, scale = compact
        return Quantity(-value if negative else value, scale, compact=True)
    magnitude, scale = int(whole + fraction), -len(fraction)
    if base == 10:
        scale += exponent
    else:
        magnitude <<= exponent
    if magnitude:
        magnitude, scale = _round_up_to_nano(magnitude, scale), _NANO_EXPONENT
        if base == 2 and magnitude > MAX_INT64 * 10**-_NANO_EXPONENT:
            magnitude, scale = MAX_INT64, 0
    return Quantity(-magnitude if negative else magnitude, scale, compact=False)


def _parse_compact(whole: str, fraction: str, base: int, exponent: int) -> tuple[int, int] | None:
    """ParseQuantity's fast path: (magnitude, scale) as an int64 amount, or None for the decimal path."""
    digits = whole.lstrip("0") or "0"
    if base == 10:
        scale, multiplier = exponent, 1
        precision = _MAX_INT64_DIGITS - len(digits) - len(fraction)
    elif not fraction:
        scale, multiplier = 0, 1 << exponent
        precision = 15 - len(digits) - exponent * 3 // 10 - 1
    else:
        return None
    scale -= len(fraction)
    if precision < 0 or scale < _NANO_EXPONENT:
        return None
    magnitude = int(digits + fraction) * multiplier
    return (magnitude, scale) if magnitude <= MAX_INT64 else None
