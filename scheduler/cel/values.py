"""The CEL name of a run-time value's type, as error messages name it (`no such overload: size(int)`).

Its own module because both the library and its string extensions name types in their errors, and the library
imports the string extensions.
"""

from __future__ import annotations

from typing import Any

from celpy import celtypes

from scheduler.cel.quantity import Quantity
from scheduler.cel.semver import Semver


def type_name(value: Any) -> str:
    """The CEL name of a run-time value's type, for messages."""
    for cel_class, name in _TYPE_NAMES:
        if isinstance(value, cel_class):
            return name
    return "null_type" if value is None else type(value).__name__


_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (celtypes.BoolType, "bool"),
    (celtypes.IntType, "int"),
    (celtypes.UintType, "uint"),
    (celtypes.DoubleType, "double"),
    (celtypes.StringType, "string"),
    (celtypes.BytesType, "bytes"),
    (celtypes.ListType, "list"),
    (celtypes.MapType, "map"),
    (celtypes.TimestampType, "google.protobuf.Timestamp"),
    (celtypes.DurationType, "google.protobuf.Duration"),
    (Quantity, "kubernetes.Quantity"),
    (Semver, "kubernetes.Semver"),
    (type, "type"),
)
