"""cel-go's extended strings library (ext.Strings, version 2: what Kubernetes' base environment enables since 1.29),
with Go's semantics rather than Python's where the two differ.

Indices count Unicode code points (Go's runes), not bytes. `trim` removes Go's `unicode.IsSpace` characters (not
Python's wider `str.isspace`), `lowerAscii`/`upperAscii` touch only ASCII letters, `split` with an empty separator
explodes into characters, and a negative limit in `split`/`replace` means "all". Errors are cel-go's messages
("index out of range: 5", "invalid substring range. start: 2, end: 1"). `format` supports the clauses cel-go
documents (`%s %d %f %e %b %x %X %o %%`, precision as `%.3f`), printing doubles as Go does; it ignores locales
(cel-go's default en_US output differs only in digit grouping of `%f`, which no selector relies on).

Every function here charges its traversal to the running cost tracker (`cost.charge_text`) before working, so an
expression that loops over long strings stops at the cost limit instead of running on.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from scheduler.cel.cost import charge, charge_length, charge_text
from scheduler.cel.values import type_name

# Go's unicode.IsSpace: the Latin-1 spaces plus Unicode's White_Space property.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _text(value: Any, function: str, *others: Any) -> str:
    if not isinstance(value, celtypes.StringType):
        raise TypeError(f"no such overload: {function}")
    return str(value)


def _int(value: Any, function: str) -> int:
    if not isinstance(value, celtypes.IntType):
        raise TypeError(f"no such overload: {function}")
    return int(value)


def _out_of_range(index: int) -> CELEvalError:
    return CELEvalError(f"index out of range: {index}")


def char_at(text: Any, index: Any) -> Any:
    runes, at = _text(text, "charAt"), _int(index, "charAt")
    charge_text(runes)
    if at < 0 or at > len(runes):
        return _out_of_range(at)
    return celtypes.StringType(runes[at] if at < len(runes) else "")


def index_of(text: Any, sub: Any, offset: Any = None) -> Any:
    runes, wanted = _text(text, "indexOf"), _text(sub, "indexOf")
    start = 0 if offset is None else _int(offset, "indexOf")
    charge_text(runes, wanted)
    if not wanted:
        return celtypes.IntType(start)
    if start < 0 or start >= len(runes):
        return _out_of_range(start)
    return celtypes.IntType(runes.find(wanted, start))


def last_index_of(text: Any, sub: Any, offset: Any = None) -> Any:
    runes, wanted = _text(text, "lastIndexOf"), _text(sub, "lastIndexOf")
    charge_text(runes, wanted)
    if offset is None:
        if not wanted:
            return celtypes.IntType(len(runes))
        last = len(runes) - 1
    else:
        last = _int(offset, "lastIndexOf")
        if not wanted:
            return celtypes.IntType(last)
    if last < 0 or last >= len(runes):
        return _out_of_range(last)
    return celtypes.IntType(runes.rfind(wanted, 0, last + len(wanted)))


def lower_ascii(text: Any) -> Any:
    value = _text(text, "lowerAscii")
    charge_text(value)
    return celtypes.StringType(value.translate(_LOWER))


def upper_ascii(text: Any) -> Any:
    value = _text(text, "upperAscii")
    charge_text(value)
    return celtypes.StringType(value.translate(_UPPER))


def replace(text: Any, old: Any, new: Any, limit: Any = None) -> Any:
    value, before, after = _text(text, "replace"), _text(old, "replace"), _text(new, "replace")
    count = -1 if limit is None else _int(limit, "replace")
    charge_text(value, before, after)
    replaced = value.count(before) if before else len(value) + 1  # what Python replaces: an empty `old` is everywhere
    if count >= 0:
        replaced = min(replaced, count)
    charge_length(replaced * len(after))  # Berth's charge for what it writes: one short `new` can multiply a text
    return celtypes.StringType(value.replace(before, after, count if count >= 0 else -1))


def split(text: Any, separator: Any, limit: Any = None) -> Any:
    value, sep = _text(text, "split"), _text(separator, "split")
    count = -1 if limit is None else _int(limit, "split")
    charge_text(value, sep)
    if count == 0:
        parts: list[str] = []
    elif not sep:  # Go explodes into characters; the last part keeps the rest when limited
        parts = list(value)
        if 0 < count < len(parts):
            parts = parts[: count - 1] + ["".join(parts[count - 1 :])]
    else:
        parts = value.split(sep, count - 1 if count > 0 else -1)
    return celtypes.ListType([celtypes.StringType(part) for part in parts])


def substring(text: Any, start: Any, end: Any = None) -> Any:
    runes = _text(text, "substring")
    first = _int(start, "substring")
    charge_text(runes)
    if end is None:
        if first < 0 or first > len(runes):
            return _out_of_range(first)
        return celtypes.StringType(runes[first:])
    last = _int(end, "substring")
    if first > last:
        return CELEvalError(f"invalid substring range. start: {first}, end: {last}")
    for index in (first, last):
        if index < 0 or index > len(runes):
            return _out_of_range(index)
    return celtypes.StringType(runes[first:last])


def trim(text: Any) -> Any:
    value = _text(text, "trim")
    charge_text(value)
    return celtypes.StringType(value.strip(_GO_SPACE))


def join(elements: Any, separator: Any = None) -> Any:
    if not isinstance(elements, celtypes.ListType):
        raise TypeError("no such overload: join")
    sep = "" if separator is None else _text(separator, "join")
    texts = []
    for element in elements:
        if not isinstance(element, celtypes.StringType):
            return CELEvalError(f"type conversion error from '{_kind(element)}' to 'string'")
        texts.append(str(element))
    charge_text(sep, *texts)
    charge_length(len(sep) * max(len(texts) - 1, 0))  # the separator is written between every two elements
    return celtypes.StringType(sep.join(texts))


_QUOTED = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def quote(text: Any) -> Any:
    """`strings.quote(s)`: s in double quotes with CEL's escape sequences escaped."""
    value = _text(text, "strings.quote")
    charge_text(value)
    return celtypes.StringType('"' + "".join(_QUOTED.get(char, char) for char in value) + '"')


# ---------------------------------------------------------------------------------------------------------------
# format


def _kind(value: Any) -> str:
    return type_name(value)


def go_double(value: float) -> str:
    """A double as cel-go's string() prints it (Go's %g with the shortest digits: exponent from 1e+06 on)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    point = len(text) + int(exponent)  # where the decimal point falls among the digits
    power = point - 1
    minus = "-" if sign else ""
    if power < -4 or power >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{minus}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{minus}{text}{'0' * (point - len(text))}"
    return f"{minus}{text[:point]}.{text[point:]}"


def _as_string(value: Any) -> str:
    """The `%s` clause."""
    if isinstance(value, celtypes.BoolType):
        return "true" if value else "false"
    if isinstance(value, celtypes.DoubleType):
        return go_double(float(value))
    if isinstance(value, celtypes.IntType | celtypes.UintType | celtypes.StringType):
        return str(int(value)) if not isinstance(value, celtypes.StringType) else str(value)
    if isinstance(value, celtypes.BytesType):
        return bytes(value).decode("utf-8", "replace")
    if value is None:
        return "null"
    if isinstance(value, celtypes.ListType | celtypes.MapType):
        charge(len(value))  # every element written (Berth's charge: a list nesting itself k times holds 2**k)
    if isinstance(value, celtypes.ListType):
        return "[" + ", ".join(_in_container(element) for element in value) + "]"
    if isinstance(value, celtypes.MapType):
        entries = sorted((_in_container(key), _in_container(item)) for key, item in value.items())
        return "{" + ", ".join(f"{key}:{item}" for key, item in entries) + "}"
    raise _FormatError(
        "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, "
        f"and timestamps, was given {_kind(value)}"
    )


def _in_container(value: Any) -> str:
    text = _as_string(value)
    if isinstance(value, celtypes.StringType):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class _FormatError(Exception):
    pass


def _number(value: Any, clause: str) -> int:
    if isinstance(value, celtypes.IntType | celtypes.UintType) and not isinstance(value, celtypes.BoolType):
        return int(value)
    raise _FormatError(f"{clause} clause can only be used on integers, was given {_kind(value)}")


def _double(value: Any, clause: str) -> float:
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType) and str(value) in ("NaN", "Infinity", "-Infinity"):
        return float(str(value).replace("Infinity", "inf"))
    raise _FormatError(f"{clause} clause can only be used on doubles, was given {_kind(value)}")


def _fixed(value: float, precision: int) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return f"{value:.{precision}f}"


def _clause(verb: str, precision: int | None, value: Any) -> str:
    if verb == "s":
        return _as_string(value)
    if verb == "d":
        return str(_number(value, "decimal"))
    if verb == "f":
        return _fixed(_double(value, "fixed-point"), 6 if precision is None else precision)
    if verb == "e":
        number = _double(value, "scientific")
        return _fixed(number, 0) if not math.isfinite(number) else f"{number:.{6 if precision is None else precision}e}"
    if verb == "b":
        if isinstance(value, celtypes.BoolType):
            return "1" if value else "0"
        return format(_number(value, "binary"), "b")
    if verb in "xX":
        if isinstance(value, celtypes.StringType | celtypes.BytesType):
            raw = str(value).encode() if isinstance(value, celtypes.StringType) else bytes(value)
            digits = raw.hex()
        else:
            digits = format(_number(value, "hex"), "x")
        return digits.upper() if verb == "X" else digits
    if verb == "o":
        return format(_number(value, "octal"), "o")
    raise _FormatError(f'could not parse formatting clause: unrecognized formatting clause "{verb}"')


_CLAUSE = re.compile(r"%(?:\.(\d+))?(.)?", re.S)


def format_string(template: Any, arguments: Any) -> Any:
    """`"...".format([args])`: printf-style substitution as cel-go's strings library does it."""
    text = _text(template, "format")
    if not isinstance(arguments, celtypes.ListType):
        raise TypeError("no such overload: format")
    charge_text(text, *(str(argument) for argument in arguments if isinstance(argument, celtypes.StringType)))
    pieces: list[str] = []
    used = 0
    position = 0
    try:
        for match in _CLAUSE.finditer(text):
            pieces.append(text[position : match.start()])
            position = match.end()
            precision, verb = match.group(1), match.group(2)
            if verb is None:
                raise _FormatError("could not parse formatting clause: unexpected end of string")
            if verb == "%" and precision is None:
                pieces.append("%")
                continue
            if used >= len(arguments):
                raise _FormatError(f"index {used} out of range")
            digits = int(precision) if precision is not None else None
            charge_length(digits or 0)  # Berth's charge: `%.100000f` writes that many digits from a short template
            pieces.append(_clause(verb, digits, arguments[used]))
            used += 1
    except _FormatError as error:
        return CELEvalError(f"error during formatting: {error}")
    pieces.append(text[position:])
    return celtypes.StringType("".join(pieces))
