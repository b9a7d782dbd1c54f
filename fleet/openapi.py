"""Modelplane's XRD schemas (fleet/xrd/*.json) and a small structural check against them.

Berth models what it reads with pydantic; the blocks it only carries (an InferenceClass's `provisioning`, an
InferenceCluster's `cluster`, a member's pod `template`, ...) are checked against the XRD's own openAPIV3Schema, so
a field Modelplane defines loads and a typo in one is still an error with its path, without restating hundreds of
fields by hand. The check covers what the API server's structural validation covers: types, unknown fields,
required fields, enums, patterns, lengths, counts and bounds. The XRDs' CEL rules (`x-kubernetes-validations`) are not run.

The JSON files are copies of each XRD's `spec.versions[v1alpha1].schema.openAPIV3Schema` (descriptions dropped);
each names the commit it was taken from.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

XRD_DIR = Path(__file__).with_name("xrd")

FILES: dict[str, str] = {
    "InferenceClass": "inferenceclasses.json",
    "InferenceCluster": "inferenceclusters.json",
    "ModelDeployment": "modeldeployments.json",
    "ModelReplica": "modelreplicas.json",
    "ModelCache": "modelcaches.json",
}

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


@cache
def xrd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of one of Modelplane's kinds."""
    document = json.loads((XRD_DIR / FILES[kind]).read_text(encoding="utf-8"))
    return document["openAPIV3Schema"]


def sub_schema(kind: str, path: str) -> dict[str, Any]:
    """The schema at a dotted path of a kind, `[]` stepping into array items: `spec.nodePools[].fabric`."""
    node = xrd_schema(kind)
    for part in path.split("."):
        items = part.endswith("[]")
        node = node["properties"][part.removesuffix("[]")]
        if items:
            node = node["items"]
    return node


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def schema_problems(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Every way `value` breaks `schema`, each as `<path>: <what is wrong>` (path relative to the checked block)."""
    where = path or "(the block)"
    expected = schema.get("type")
    if expected is not None:
        accepted = _TYPES[expected]
        if not isinstance(value, accepted) or (expected in ("integer", "number") and isinstance(value, bool)):
            return [f"{where}: must be of type {expected} (got {type(value).__name__})"]
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(str(c) for c in schema["enum"])
        problems.append(f"{where}: must be one of {choices} (got {value!r})")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            problems.append(f"{where}: must have at least {schema['minLength']} character(s)")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append(f"{where}: must have at most {schema['maxLength']} characters")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            problems.append(f"{where}: must match {schema['pattern']} (got {value!r})")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{where}: must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{where}: must be at most {schema['maximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            problems.append(f"{where}: must have at least {schema['minItems']} item(s)")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{where}: must have at most {schema['maxItems']} items")
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                problems.extend(schema_problems(items, item, _join(path, i)))
    if isinstance(value, dict):
        problems.extend(_object_problems(schema, value, path, where))
    return problems


def _object_problems(schema: dict[str, Any], value: dict[str, Any], path: str, where: str) -> list[str]:
    problems = [
        f"{_join(path, key)}: is required but missing" for key in schema.get("required", ()) if key not in value
    ]
    if len(value) < schema.get("minProperties", 0):
        problems.append(f"{where}: must set at least {schema['minProperties']} field(s)")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        problems.append(f"{where}: must have at most {schema['maxProperties']} entries")
    properties: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    for key, item in value.items():
        if key in properties:
            problems.extend(schema_problems(properties[key], item, _join(path, key)))
        elif isinstance(extra, dict):
            problems.extend(schema_problems(extra, item, _join(path, key)))
        elif not (extra is True or preserve or (not properties and extra is None)):
            problems.append(f"{_join(path, key)}: is not a known field (check its spelling and indentation)")
    return problems


def check_block(kind: str, path: str, value: Any) -> Any:
    """A pydantic validator body: return the carried block unchanged, or raise ValueError naming every problem."""
    problems = schema_problems(sub_schema(kind, path), value)
    if problems:
        raise ValueError("; ".join(problems))
    return value
