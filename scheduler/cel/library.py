"""Every function a DRA selector may call: its declared overloads (for the checker) and, where cel-python's
own builtin does not already behave as Kubernetes does, its implementation (for the evaluator).

One table serves both so a function cannot be declared without being implemented, or the reverse. The
declarations follow cel-go's standard library, its strings extension (version 2, as Kubernetes' base environment
enables it: `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`, `replace`, `split`, `substring`,
`trim`, `join`, `format`, `strings.quote`; see strings.py), plus the two Kubernetes libraries the DRA environment adds:
quantity (`quantity`, `isQuantity`, `sign`, `isGreaterThan`, `isLessThan`, `compareTo`, `add`, `sub`,
`asInteger`, `asApproximateFloat`, `isInteger`) and semver (`semver`, `isSemver`, `isGreaterThan`,
`isLessThan`, `compareTo`, `major`, `minor`, `patch`). As in Kubernetes, `sign` is a global function:
`sign(q)`, not `q.sign()`.

Implementations return a value, return a `CELEvalError` for a domain error (a malformed quantity), or raise
TypeError when no overload fits the run-time types (cel-python reports that as "no such overload").
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import re2
from celpy import celtypes
from celpy.evaluation import CELEvalError, base_functions

from scheduler.cel import strings
from scheduler.cel.cost import charge, charge_regex, charge_text
from scheduler.cel.quantity import Quantity, QuantityError, parse_quantity
from scheduler.cel.semver import Semver, SemverError, parse_semver, parse_semver_normalized
from scheduler.cel.types import (
    ANY_LIST,
    ANY_MAP,
    BOOL,
    BYTES,
    DOUBLE,
    DURATION,
    DYN,
    INT,
    NUMERIC,
    QUANTITY,
    SEMVER,
    STRING,
    TIMESTAMP,
    TYPE,
    UINT,
    CelType,
    list_of,
)
from scheduler.cel.values import type_name

LIST_OF_STRING = list_of(STRING)


@dataclass(frozen=True)
class Overload:
    """One signature. For a member function (`x.f(y)`) `args` starts with the receiver's type."""

    args: tuple[CelType, ...]
    result: CelType
    member: bool = False


def _global(result: CelType, *args: CelType) -> Overload:
    return Overload(args, result)


def _member(result: CelType, *args: CelType) -> Overload:
    return Overload(args, result, member=True)


# ---------------------------------------------------------------------------------------------------------
# Run-time helpers

_NUMERIC_NAMES = frozenset({"int", "uint", "double"})


def _no_overload(function: str, *values: Any) -> TypeError:
    return TypeError(f"no such overload: {function}({', '.join(type_name(value) for value in values)})")


def cel_equal(left: Any, right: Any) -> bool:
    """Heterogeneous equality as cel-go has it: values of different types are unequal, never an error;
    numbers compare by value across int, uint and double."""
    left_type, right_type = type_name(left), type_name(right)
    if left_type != right_type:
        return left_type in _NUMERIC_NAMES and right_type in _NUMERIC_NAMES and _number(left) == _number(right)
    if isinstance(left, celtypes.ListType):
        if len(left) != len(right):
            return False
        charge(len(left))  # every element compared (Berth's charge: cel-python walks them one by one)
        return all(cel_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, celtypes.MapType):
        missing = object()
        if len(left) == len(right):
            charge(len(left))
        return len(left) == len(right) and all(
            cel_equal(value, dict.get(right, key, missing)) for key, value in left.items()
        )
    return bool(left == right)


_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "_<_": operator.lt,
    "_<=_": operator.le,
    "_>_": operator.gt,
    "_>=_": operator.ge,
}


def _relation(name: str) -> Callable[[Any, Any], Any]:
    """cel-python's ordering operator, widened to compare int, uint and double with each other exactly."""
    builtin, ordering = base_functions[name], _ORDERINGS[name]

    def compare(left: Any, right: Any) -> Any:
        left_type, right_type = type_name(left), type_name(right)
        if left_type != right_type and left_type in _NUMERIC_NAMES and right_type in _NUMERIC_NAMES:
            return celtypes.BoolType(ordering(_number(left), _number(right)))
        try:
            return builtin(left, right)
        except TypeError:
            return CELEvalError(f"no such overload: {name}({left_type}, {right_type})")

    return compare


def _number(value: Any) -> int | float:
    return float(value) if isinstance(value, celtypes.DoubleType) else int(value)


def _erring(function: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """An operator that passes an error operand through, as cel-python's own operators do."""

    @functools.wraps(function)
    def guarded(left: Any, right: Any) -> Any:
        if isinstance(left, CELEvalError):
            return left
        if isinstance(right, CELEvalError):
            return right
        return function(left, right)

    return guarded


@_erring
def _equal(left: Any, right: Any) -> Any:
    """Kubernetes' semver and quantity values refuse `==` with anything but their own kind (their Equal answers "no
    such overload"), so `version == "1.2.3"` is an error, not false. cel-go asks the left operand, so the reverse,
    `"1.2.3" == version`, is false, and `!=` (true unless Equal says true) is true: both as in Kubernetes."""
    if isinstance(left, Quantity | Semver) and right is not None and type_name(left) != type_name(right):
        return CELEvalError(f"no such overload: _==_({type_name(left)}, {type_name(right)})")
    return celtypes.BoolType(cel_equal(left, right))


@_erring
def _not_equal(left: Any, right: Any) -> celtypes.BoolType:
    return celtypes.BoolType(not cel_equal(left, right))


def _traversing(name: str) -> Callable[..., Any]:
    """cel-python's builtin string predicate, charged its traversal of the strings it reads."""
    builtin = base_functions[name]

    def run(*args: Any) -> Any:
        charge_text(*(str(arg) for arg in args if isinstance(arg, celtypes.StringType)))
        return builtin(*args)

    return run


# RE2 compiles `\pL{1000}` (five characters) into a program of megabytes, ~100 ms of CPU each time: a regex may use
# this much memory (normal patterns use a few KB; a larger one is an error, as an oversized regex is to RE2), and
# besides cel-go's charge it costs its compiled program's size (Berth's charges).
REGEX_MAX_MEMORY = 256 << 10
REGEX_PROGRAM_FACTOR = 0.01  # units per instruction of the compiled program (~20 units per ms of compiling)
REGEX_REFUSED_COST = 60  # a pattern over the memory bound: what finding that out costs (1 to 3 ms)
_REGEX_OPTIONS = re2.Options()
_REGEX_OPTIONS.max_mem = REGEX_MAX_MEMORY


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> Any:
    return re2.compile(pattern, _REGEX_OPTIONS)


def _matches(text: Any, pattern: Any) -> Any:
    """cel-python's `matches` (RE2 search) with a bounded regex; charged the same whether its compiled pattern was
    cached or not, so a request's cost never depends on what ran before it."""
    if not (isinstance(text, celtypes.StringType) and isinstance(pattern, celtypes.StringType)):
        return base_functions["matches"](text, pattern)
    charge_regex(str(text), str(pattern))
    try:
        compiled = _regex(str(pattern))
    except re2.error as error:
        charge(REGEX_REFUSED_COST)
        return CELEvalError("match error", error.__class__, error.args)
    charge(math.ceil(REGEX_PROGRAM_FACTOR * compiled.programsize))
    return celtypes.BoolType(compiled.search(str(text)) is not None)


def _concatenated(left: Any, right: Any) -> Any:
    """`+`, charged the copy when it joins strings, and (Berth's charge: cel-go concatenates lists lazily, cel-python
    copies them) the elements copied when it joins lists."""
    if isinstance(left, celtypes.StringType) and isinstance(right, celtypes.StringType):
        charge_text(str(left), str(right))
    elif isinstance(left, celtypes.ListType) and isinstance(right, celtypes.ListType):
        charge(len(left) + len(right))
        return celtypes.ListType([*left, *right])  # cel-python's `+` would give a plain Python list
    return base_functions["_+_"](left, right)


@_erring
def _in(item: Any, container: Any) -> celtypes.BoolType:
    """Charged the elements scanned (cel-go charges a list's size; cel-python scans a map's keys too)."""
    if isinstance(container, celtypes.ListType | celtypes.MapType):
        charge(len(container))
    if isinstance(container, celtypes.ListType):
        return celtypes.BoolType(any(cel_equal(item, element) for element in container))
    if isinstance(container, celtypes.MapType):
        return celtypes.BoolType(any(cel_equal(item, key) for key in container))
    raise _no_overload("_in_", item, container)


def _type_of(value: Any) -> Any:
    """`type(x)`; a device's domain maps are map subclasses but still have type `map`."""
    if isinstance(value, celtypes.MapType):
        return celtypes.MapType
    return celtypes.TypeType(value)


def _string(value: Any, function: str, *others: Any) -> str:
    if not isinstance(value, celtypes.StringType):
        raise _no_overload(function, value, *others)
    return str(value)


def _normalize_flag(flag: Any, function: str, text: Any) -> bool:
    if not isinstance(flag, celtypes.BoolType):
        raise _no_overload(function, text, flag)
    return bool(flag)


def _quantity(text: Any) -> Any:
    try:
        return parse_quantity(_string(text, "quantity"))
    except QuantityError as error:
        return CELEvalError(str(error))


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        parse_quantity(_string(text, "isQuantity"))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


_STRICT = celtypes.BoolType(False)


def _parse_semver(text: Any, normalize: Any, function: str) -> Semver:
    source = _string(text, function, normalize)
    if _normalize_flag(normalize, function, text):
        return parse_semver_normalized(source)
    return parse_semver(source)


def _semver(text: Any, normalize: Any = _STRICT) -> Any:
    try:
        return _parse_semver(text, normalize, "semver")
    except SemverError as error:
        return CELEvalError(str(error))


def _is_semver(text: Any, normalize: Any = _STRICT) -> celtypes.BoolType:
    try:
        _parse_semver(text, normalize, "isSemver")
    except SemverError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _ordered(function: str, receiver: Any, other: Any) -> int:
    """compare() of two quantities or two semvers: the libraries share these method names."""
    if isinstance(receiver, Quantity) and isinstance(other, Quantity):
        return receiver.compare(other)
    if isinstance(receiver, Semver) and isinstance(other, Semver):
        return receiver.compare(other)
    raise _no_overload(function, receiver, other)


def _quantity_operand(function: str, receiver: Any, operand: Any) -> tuple[Quantity, Quantity]:
    if isinstance(receiver, Quantity):
        if isinstance(operand, Quantity):
            return receiver, operand
        if isinstance(operand, celtypes.IntType):
            return receiver, Quantity.from_int(int(operand))
    raise _no_overload(function, receiver, operand)


def _quantity_receiver(function: str, receiver: Any) -> Quantity:
    if not isinstance(receiver, Quantity):
        raise _no_overload(function, receiver)
    return receiver


def _semver_receiver(function: str, receiver: Any) -> Semver:
    if not isinstance(receiver, Semver):
        raise _no_overload(function, receiver)
    return receiver


def _add(receiver: Any, operand: Any) -> Quantity:
    augend, addend = _quantity_operand("add", receiver, operand)
    return augend.add(addend)


def _sub(receiver: Any, operand: Any) -> Quantity:
    minuend, subtrahend = _quantity_operand("sub", receiver, operand)
    return minuend.sub(subtrahend)


def _as_integer(receiver: Any) -> Any:
    value = _quantity_receiver("asInteger", receiver).as_int64()
    if value is None:
        return CELEvalError("cannot convert value to integer")
    return celtypes.IntType(value)


# ---------------------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Function:
    """A callable name: what the checker may accept, and what the evaluator runs."""

    overloads: tuple[Overload, ...]
    # None: cel-python's builtin of the same name already behaves as Kubernetes does.
    implementation: Callable[..., Any] | None = None


def _closed(*types: CelType) -> tuple[Overload, ...]:
    """Binary overloads taking two values of a type and giving one back (`int + int -> int`)."""
    return tuple(_global(each, each, each) for each in types)


_RELATIONS = tuple(_global(BOOL, each, each) for each in (BOOL, STRING, BYTES, TIMESTAMP, DURATION)) + tuple(
    _global(BOOL, left, right) for left in NUMERIC for right in NUMERIC
)
_TIMESTAMP_PARTS = (_member(INT, TIMESTAMP), _member(INT, TIMESTAMP, STRING))
_CLOCK_PARTS = _TIMESTAMP_PARTS + (_member(INT, DURATION),)

FUNCTIONS: dict[str, Function] = {
    # Operators. `_==_`, `_!=_`, `_in_`, `_[_]` and `_?_:_` are typed by the checker itself.
    "_&&_": Function((_global(BOOL, BOOL, BOOL),)),
    "_||_": Function((_global(BOOL, BOOL, BOOL),)),
    "!_": Function((_global(BOOL, BOOL),)),
    "-_": Function((_global(INT, INT), _global(DOUBLE, DOUBLE), _global(DURATION, DURATION))),
    "_+_": Function(
        _closed(*NUMERIC, STRING, BYTES, ANY_LIST)
        + (
            _global(TIMESTAMP, TIMESTAMP, DURATION),
            _global(TIMESTAMP, DURATION, TIMESTAMP),
            _global(DURATION, DURATION, DURATION),
        ),
        _concatenated,
    ),
    "_-_": Function(
        _closed(*NUMERIC)
        + (
            _global(DURATION, TIMESTAMP, TIMESTAMP),
            _global(TIMESTAMP, TIMESTAMP, DURATION),
            _global(DURATION, DURATION, DURATION),
        )
    ),
    "_*_": Function(_closed(*NUMERIC)),
    "_/_": Function(_closed(*NUMERIC)),
    "_%_": Function(_closed(INT, UINT)),
    "_<_": Function(_RELATIONS, _relation("_<_")),
    "_<=_": Function(_RELATIONS, _relation("_<=_")),
    "_>_": Function(_RELATIONS, _relation("_>_")),
    "_>=_": Function(_RELATIONS, _relation("_>=_")),
    "_==_": Function((), _equal),
    "_!=_": Function((), _not_equal),
    "_in_": Function((), _in),
    # cel-go's standard library, as far as cel-python provides it.
    "size": Function(
        tuple(_global(INT, each) for each in (STRING, BYTES, ANY_LIST, ANY_MAP))
        + tuple(_member(INT, each) for each in (STRING, BYTES, ANY_LIST, ANY_MAP))
    ),
    "contains": Function((_member(BOOL, STRING, STRING),), _traversing("contains")),
    "startsWith": Function((_member(BOOL, STRING, STRING),), _traversing("startsWith")),
    "endsWith": Function((_member(BOOL, STRING, STRING),), _traversing("endsWith")),
    "matches": Function((_member(BOOL, STRING, STRING), _global(BOOL, STRING, STRING)), _matches),
    "int": Function(tuple(_global(INT, each) for each in (INT, UINT, DOUBLE, STRING, TIMESTAMP))),
    "uint": Function(tuple(_global(UINT, each) for each in (INT, UINT, DOUBLE, STRING))),
    "double": Function(tuple(_global(DOUBLE, each) for each in (INT, UINT, DOUBLE, STRING))),
    "string": Function(
        tuple(_global(STRING, each) for each in (INT, UINT, DOUBLE, STRING, BOOL, BYTES, TIMESTAMP, DURATION))
    ),
    "bool": Function((_global(BOOL, BOOL), _global(BOOL, STRING))),
    "bytes": Function((_global(BYTES, BYTES), _global(BYTES, STRING))),
    "duration": Function((_global(DURATION, STRING), _global(DURATION, DURATION))),
    "timestamp": Function((_global(TIMESTAMP, STRING), _global(TIMESTAMP, TIMESTAMP))),
    "type": Function((_global(TYPE, DYN),), _type_of),
    "getFullYear": Function(_TIMESTAMP_PARTS),
    "getMonth": Function(_TIMESTAMP_PARTS),
    "getDayOfYear": Function(_TIMESTAMP_PARTS),
    "getDayOfMonth": Function(_TIMESTAMP_PARTS),
    "getDate": Function(_TIMESTAMP_PARTS),
    "getDayOfWeek": Function(_TIMESTAMP_PARTS),
    "getHours": Function(_CLOCK_PARTS),
    "getMinutes": Function(_CLOCK_PARTS),
    "getSeconds": Function(_CLOCK_PARTS),
    "getMilliseconds": Function(_CLOCK_PARTS),
    # cel-go's strings extension, version 2 (scheduler/cel/strings.py).
    "charAt": Function((_member(STRING, STRING, INT),), strings.char_at),
    "indexOf": Function((_member(INT, STRING, STRING), _member(INT, STRING, STRING, INT)), strings.index_of),
    "lastIndexOf": Function((_member(INT, STRING, STRING), _member(INT, STRING, STRING, INT)), strings.last_index_of),
    "lowerAscii": Function((_member(STRING, STRING),), strings.lower_ascii),
    "upperAscii": Function((_member(STRING, STRING),), strings.upper_ascii),
    "replace": Function(
        (_member(STRING, STRING, STRING, STRING), _member(STRING, STRING, STRING, STRING, INT)), strings.replace
    ),
    "split": Function(
        (_member(LIST_OF_STRING, STRING, STRING), _member(LIST_OF_STRING, STRING, STRING, INT)), strings.split
    ),
    "substring": Function((_member(STRING, STRING, INT), _member(STRING, STRING, INT, INT)), strings.substring),
    "trim": Function((_member(STRING, STRING),), strings.trim),
    "join": Function((_member(STRING, LIST_OF_STRING), _member(STRING, LIST_OF_STRING, STRING)), strings.join),
    "format": Function((_member(STRING, STRING, ANY_LIST),), strings.format_string),
    "strings.quote": Function((_global(STRING, STRING),), strings.quote),
    # Kubernetes quantity library.
    "quantity": Function((_global(QUANTITY, STRING),), _quantity),
    "isQuantity": Function((_global(BOOL, STRING),), _is_quantity),
    "sign": Function(
        (_global(INT, QUANTITY),), lambda value: celtypes.IntType(_quantity_receiver("sign", value).sign())
    ),
    "add": Function((_member(QUANTITY, QUANTITY, QUANTITY), _member(QUANTITY, QUANTITY, INT)), _add),
    "sub": Function((_member(QUANTITY, QUANTITY, QUANTITY), _member(QUANTITY, QUANTITY, INT)), _sub),
    "asInteger": Function((_member(INT, QUANTITY),), _as_integer),
    "asApproximateFloat": Function(
        (_member(DOUBLE, QUANTITY),),
        lambda value: celtypes.DoubleType(_quantity_receiver("asApproximateFloat", value).as_approximate_float()),
    ),
    "isInteger": Function(
        (_member(BOOL, QUANTITY),),
        lambda value: celtypes.BoolType(_quantity_receiver("isInteger", value).as_int64() is not None),
    ),
    # Shared by the quantity and semver libraries.
    "isGreaterThan": Function(
        (_member(BOOL, QUANTITY, QUANTITY), _member(BOOL, SEMVER, SEMVER)),
        lambda receiver, other: celtypes.BoolType(_ordered("isGreaterThan", receiver, other) == 1),
    ),
    "isLessThan": Function(
        (_member(BOOL, QUANTITY, QUANTITY), _member(BOOL, SEMVER, SEMVER)),
        lambda receiver, other: celtypes.BoolType(_ordered("isLessThan", receiver, other) == -1),
    ),
    "compareTo": Function(
        (_member(INT, QUANTITY, QUANTITY), _member(INT, SEMVER, SEMVER)),
        lambda receiver, other: celtypes.IntType(_ordered("compareTo", receiver, other)),
    ),
    # Kubernetes semver library.
    "semver": Function((_global(SEMVER, STRING), _global(SEMVER, STRING, BOOL)), _semver),
    "isSemver": Function((_global(BOOL, STRING), _global(BOOL, STRING, BOOL)), _is_semver),
    "major": Function((_member(INT, SEMVER),), lambda value: celtypes.IntType(_semver_receiver("major", value).major)),
    "minor": Function((_member(INT, SEMVER),), lambda value: celtypes.IntType(_semver_receiver("minor", value).minor)),
    "patch": Function((_member(INT, SEMVER),), lambda value: celtypes.IntType(_semver_receiver("patch", value).patch)),
}

# What the evaluator runs: cel-python's builtins, overridden where Kubernetes differs. Only declared
# functions are reachable; the checker rejects calls to anything else before evaluation.
RUNTIME_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **base_functions,
    **{name: function.implementation for name, function in FUNCTIONS.items() if function.implementation},
}
# Conversions and parsers of a string, charged its traversal by the evaluator (`int("9" * 4000)`, `isQuantity` or
# `semver` of a long literal took milliseconds for one unit; Berth's charge, as cel-go charges its string functions).
# Several are also type names (`type(1) == int`), so they are charged where they are called, not wrapped here.
PARSERS = frozenset(
    {"int", "uint", "double", "bool", "bytes", "duration", "timestamp", "quantity", "isQuantity", "semver", "isSemver"}
)

# Functions Kubernetes' CEL environment has and Berth's does not, so the checker can say so rather than
# calling them undeclared.
# fmt: off
KUBERNETES_ONLY = frozenset(
    {
        # strings extension beyond version 2 (Kubernetes enables version 2)
        "reverse",
        # lists, sets and regex libraries
        "isSorted", "sum", "min", "max", "slice", "flatten", "distinct", "sort", "sortBy", "find", "findAll",
        # URL, IP and CIDR libraries
        "url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath", "getQuery",
        "ip", "isIP", "cidr", "isCIDR", "containsIP", "containsCIDR", "prefixLength", "masked", "family",
        "isCanonical", "isLoopback", "isUnspecified", "isGlobalUnicast", "isLinkLocalMulticast",
        "isLinkLocalUnicast",
        # newer quantity functions, list-valued attributes, two-variable comprehensions
        "mul", "div", "divInt", "includes", "transformList", "transformMap", "transformMapEntry",
    }
)
# fmt: on
