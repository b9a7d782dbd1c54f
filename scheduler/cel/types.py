"""The static types the checker reasons with, and the declared type of the `device` variable.

cel-python has no type checker; Kubernetes compiles selectors with cel-go's, which rejects undeclared
names, unknown fields, calls with no matching overload and non-bool results before anything runs. These
types are just enough to reproduce those verdicts. `dyn` is the unknown type: anything goes at compile
time and the check happens at run time, exactly as for Kubernetes' attribute values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CelType:
    name: str
    params: tuple[CelType, ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(str(param) for param in self.params)})"


DYN = CelType("dyn")
BOOL = CelType("bool")
INT = CelType("int")
UINT = CelType("uint")
DOUBLE = CelType("double")
STRING = CelType("string")
BYTES = CelType("bytes")
NULL = CelType("null_type")
TYPE = CelType("type")
DURATION = CelType("google.protobuf.Duration")
TIMESTAMP = CelType("google.protobuf.Timestamp")
QUANTITY = CelType("kubernetes.Quantity")
SEMVER = CelType("kubernetes.Semver")
DEVICE = CelType("kubernetes.DRADevice")

NUMERIC = (INT, UINT, DOUBLE)


def list_of(element: CelType) -> CelType:
    return CelType("list", (element,))


def map_of(key: CelType, value: CelType) -> CelType:
    return CelType("map", (key, value))


ANY_LIST = list_of(DYN)
ANY_MAP = map_of(DYN, DYN)

# Kubernetes declares `device` as an object with exactly these fields. Attribute values are `dyn` (an
# attribute may hold a string, int, bool or version); capacities are always quantities.
DEVICE_FIELDS: dict[str, CelType] = {
    "driver": STRING,
    "attributes": map_of(STRING, map_of(STRING, DYN)),
    "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
}

# Names that denote types, usable as values in `type(x) == int`.
TYPE_NAMES = frozenset({"bool", "int", "uint", "double", "string", "bytes", "list", "map", "null_type", "type"})


def is_assignable(declared: CelType, actual: CelType) -> bool:
    """Whether a value of type `actual` may be passed where `declared` is expected."""
    if declared == DYN or actual == DYN:
        return True
    if declared.name != actual.name or len(declared.params) != len(actual.params):
        return False
    return all(is_assignable(d, a) for d, a in zip(declared.params, actual.params, strict=True))


def join(first: CelType, second: CelType) -> CelType | None:
    """The common type of two branches or elements: the type itself, dyn if either is dyn, else None."""
    if first == second:
        return first
    if first == DYN or second == DYN:
        return DYN
    if first.name == second.name and len(first.params) == len(second.params):
        joined = [join(a, b) for a, b in zip(first.params, second.params, strict=True)]
        if all(param is not None for param in joined):
            return CelType(first.name, tuple(param for param in joined if param is not None))
    return None


def element_type(container: CelType) -> CelType:
    """What a comprehension variable ranges over: list elements, map keys, or dyn."""
    if container.name in ("list", "map") and container.params:
        return container.params[0]
    return DYN
