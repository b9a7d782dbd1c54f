"""Modelplane's XRD schemas (fleet/xrd/*.json) and a small structural check against them.

Berth models what it reads with pydantic; the blocks it only carries (an InferenceClass's `provisioning`, an
InferenceCluster's `cluster`, a member's pod `template`, ...) are checked against the XRD's own openAPIV3Schema, so
a field Modelplane defines loads and a typo in one is still an error with its path, without restating hundreds of
fields by hand. `jsonschema` does the checking (types, required fields, enums, patterns, lengths, counts, bounds);
the one thing added is the API server's structural rule that an object listing its properties takes no others.
The XRDs' CEL rules (`x-kubernetes-validations`) are not run.

The JSON files are copies of each XRD's `spec.versions[v1alpha1].schema.openAPIV3Schema` (descriptions dropped);
each names the commit it was taken from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # jsonschema is imported when a manifest is checked; node agents never check one
    from jsonschema import Draft202012Validator, ValidationError


XRD_DIR = Path(__file__).with_name("xrd")

FILES: dict[str, str] = {
    "InferenceClass": "inferenceclasses.json",
    "InferenceCluster": "inferenceclusters.json",
    "ModelDeployment": "modeldeployments.json",
    "ModelReplica": "modelreplicas.json",
    "ModelCache": "modelcaches.json",
    "ModelService": "modelservices.json",
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


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as the API server applies it: an object that lists its properties takes no others unless it says
    so (`additionalProperties`, `x-kubernetes-preserve-unknown-fields`). JSON Schema would accept them silently."""
    if isinstance(schema, list):
        return [_structural(item) for item in schema]  # type: ignore[return-value]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _structural(value) for key, value in schema.items()}
    if "properties" in closed and "additionalProperties" not in closed:
        if not closed.get("x-kubernetes-preserve-unknown-fields", False):
            closed["additionalProperties"] = False
    return closed


def published_schema(kind: str, path: str) -> dict[str, Any]:
    """The schema `check_block` applies at `path`, to publish (the API's OpenAPI document states a carried block's
    real shape): the structural rule written out, the XRD's `x-kubernetes-*` extensions (its CEL rules, which are not
    run) left out, so that exactly what the block's check accepts is valid."""
    return _without_extensions(_structural(sub_schema(kind, path)))


def _without_extensions(schema: Any, names: bool = False) -> Any:
    """`names`: a `properties` mapping, whose keys are field names rather than keywords."""
    if isinstance(schema, list):
        return [_without_extensions(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: _without_extensions(value, names=key == "properties" and not names)
        for key, value in schema.items()
        if names or not key.startswith("x-kubernetes-")
    }


@cache
def _validator(kind: str, path: str) -> Draft202012Validator:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(_structural(sub_schema(kind, path)))


def _where(parts: Iterable[str | int]) -> str:
    where = ""
    for part in parts:
        where = f"{where}[{part}]" if isinstance(part, int) else f"{where}.{part}" if where else str(part)
    return where


def _messages(error: ValidationError) -> list[str]:
    """One `<path>: <what is wrong>` per problem, unknown and missing fields named by their own path."""
    where = _where(error.absolute_path)
    value = error.instance
    if error.validator == "additionalProperties" and isinstance(value, dict):
        known = error.schema.get("properties", {})
        return [
            f"{_where([*error.absolute_path, key])}: is not a known field (check its spelling and indentation)"
            for key in value
            if key not in known
        ]
    if error.validator == "required" and isinstance(value, dict):
        return [
            f"{_where([*error.absolute_path, key])}: is required but missing"
            for key in error.validator_value
            if key not in value
        ]
    if error.validator == "type":
        return [f"{where or '(the block)'}: must be of type {error.validator_value} (got {type(value).__name__})"]
    return [f"{where or '(the block)'}: {error.message}"]


def schema_problems(kind: str, path: str, value: Any) -> list[str]:
    """Every way `value` breaks the XRD schema at `path`, each as `<path>: <what is wrong>` (relative to the block)."""
    errors = sorted(_validator(kind, path).iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    return [message for error in errors for message in _messages(error)]


def check_block(kind: str, path: str, value: Any) -> Any:
    """A pydantic validator body: return the carried block unchanged, or raise ValueError naming every problem."""
    problems = schema_problems(kind, path, value)
    if problems:
        raise ValueError("; ".join(problems))
    return value
