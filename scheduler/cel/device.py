"""A device as an InferenceClass publishes it, turned into the value Kubernetes gives the CEL variable `device`.

Published form (plain data, as read from the fleet file):

    {"name": "gpu-0", "driver": "gpu.nvidia.com",
     "attributes": {"productName": {"string": "H200"}, "gpu.nvidia.com/cudaMajor": {"int": 12}},
     "capacity": {"memory": {"value": "141Gi"}}}

CEL form, exactly as k8s.io/dynamic-resource-allocation/cel builds it:

    device.driver                                   "gpu.nvidia.com"
    device.attributes["gpu.nvidia.com"].productName "H200"  (a bare name belongs to the driver's domain)
    device.capacity["gpu.nvidia.com"].memory        quantity("141Gi")

`attributes` and `capacity` are maps keyed by domain, then by name. Looking up a domain the device does not
publish gives an empty map (so `device.attributes["other.com"].x` fails with "no such key: x", and
`has(device.attributes["other.com"].x)` is false); `"other.com" in device.attributes` is false.

A device's `key` is its content (driver, attributes, capacity; not its name) in canonical JSON, so two pools
whose classes publish the same device share one evaluation per selector.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from celpy import celtypes

from scheduler.cel.errors import DeviceError
from scheduler.cel.quantity import MAX_INT64, MIN_INT64, QuantityError, parse_quantity
from scheduler.cel.semver import SemverError, parse_semver


class _DomainMap(celtypes.MapType):
    """The outer attribute/capacity map: an unknown domain reads as an empty map, as in Kubernetes."""

    def __missing__(self, key: Any) -> celtypes.MapType:
        return celtypes.MapType()


class Device:
    """A published device, validated and converted once, identified by its content."""

    __slots__ = ("key", "value")

    def __init__(self, key: str, value: celtypes.MapType) -> None:
        self.key = key
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Device({self.key})"


def device_key(published: Mapping[str, Any]) -> str:
    """The canonical JSON of what CEL can see of a published device."""
    visible = {
        "driver": published.get("driver", ""),
        "attributes": published.get("attributes") or {},
        "capacity": published.get("capacity") or {},
    }
    try:
        return json.dumps(visible, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise DeviceError(f"device {published.get('name', '')!r} is not plain data: {error}") from None


def prepare_device(published: Mapping[str, Any] | Device) -> Device:
    """The CEL-ready form of a published device; raises DeviceError if a value is malformed.

    Conversion is cached by content, so preparing the same device again (say, for every pool of a class
    across a thousand clusters) costs one JSON dump.
    """
    if isinstance(published, Device):
        return published
    return _device_for_key(device_key(published))


@functools.lru_cache(maxsize=16384)
def _device_for_key(key: str) -> Device:
    published = json.loads(key)
    driver = published["driver"]
    if not isinstance(driver, str):
        raise DeviceError(f"driver must be a string, not {driver!r}")
    attributes = _by_domain(published["attributes"], driver, "attribute", _attribute_value)
    capacity = _by_domain(published["capacity"], driver, "capacity", _capacity_value)
    value = celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("attributes"): attributes,
            celtypes.StringType("capacity"): capacity,
        }
    )
    return Device(key, value)


def _by_domain(entries: Any, driver: str, what: str, convert: Callable[[str, Any], Any]) -> _DomainMap:
    """Published `{name: value}` regrouped as `{domain: {name: CEL value}}`."""
    if not isinstance(entries, dict):
        raise DeviceError(f"{what} must be a mapping of name to value, not {entries!r}")
    result = _DomainMap()
    for name, entry in entries.items():
        if "/" in name:
            domain, _, identifier = name.partition("/")
        else:
            domain, identifier = driver, name
        inner = dict.setdefault(result, celtypes.StringType(domain), celtypes.MapType())
        key = celtypes.StringType(identifier)
        if key in inner:
            raise DeviceError(f"{what} {domain}/{identifier} is published twice")
        inner[key] = convert(name, entry)
    return result


def _attribute_value(name: str, attribute: Any) -> Any:
    """One typed attribute value: exactly one of string, int, bool or version."""
    if not isinstance(attribute, dict) or len(attribute) != 1:
        raise DeviceError(f"attribute {name}: unsupported attribute value {attribute!r}")
    ((kind, value),) = attribute.items()
    if kind == "string" and isinstance(value, str):
        return celtypes.StringType(value)
    if kind == "bool" and isinstance(value, bool):
        return celtypes.BoolType(value)
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool) and MIN_INT64 <= value <= MAX_INT64:
        return celtypes.IntType(value)
    if kind == "version" and isinstance(value, str):
        try:
            return parse_semver(value)
        except SemverError as error:
            raise DeviceError(f"attribute {name}: parse semantic version: {error}") from None
    raise DeviceError(f"attribute {name}: unsupported attribute value {attribute!r}")


def _capacity_value(name: str, capacity: Any) -> Any:
    """A capacity's quantity; YAML may hand us `value: 8` as a number, which Kubernetes also accepts."""
    value = capacity.get("value") if isinstance(capacity, dict) else None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DeviceError(f"capacity {name}: expected {{'value': <quantity>}}, not {capacity!r}")
    try:
        return parse_quantity(str(value))
    except QuantityError as error:
        raise DeviceError(f"capacity {name}: {error}") from None
