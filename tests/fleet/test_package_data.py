"""Modelplane's XRD schemas ship with the package: a non-editable install (a wheel, the Docker image) carries only
the package data pyproject.toml declares, and without fleet/xrd/*.json every ModelCache, InferenceCluster or
ModelReplica that carries an XRD-checked block fails to load."""

from __future__ import annotations

import fnmatch
import tomllib
from importlib import resources
from pathlib import Path

from fleet.openapi import xrd_schema

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("InferenceClass", "InferenceCluster", "ModelDeployment", "ModelReplica", "ModelCache", "ModelService")


def test_every_schema_file_is_declared_package_data() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = resources.files("fleet")
    shipped = sorted(entry.name for entry in package.joinpath("xrd").iterdir() if entry.name.endswith(".json"))
    assert len(shipped) == len(KINDS)
    undeclared = [
        name
        for name in shipped
        if not any(fnmatch.fnmatch(f"xrd/{name}", pattern) for pattern in declared.get("fleet", []))
    ]
    assert undeclared == [], f"not in [tool.setuptools.package-data] fleet: {undeclared}"


def test_each_kinds_schema_loads_from_the_package() -> None:
    for kind in KINDS:
        schema = xrd_schema(kind)
        assert schema.get("type") == "object" and "spec" in schema.get("properties", {}), kind
