"""Checking a ModelDeployment manifest completely before anything acts on it: the same check for the HTTP API
(422 with each field path) and for the workflow's update validator (a rejected update changes nothing).

Two layers: the schema (`fleet.deployment.ModelDeployment`, every problem with its path) and every CEL selector
compiled (a selector that does not compile would otherwise only surface as ScheduleFailed after the fact).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from contracts.manifest import DEFAULT_NAMESPACE
from fleet.deployment import ModelDeployment
from fleet.loader import field_path
from scheduler.cel import SelectorCompileError, compile_selector


class SpecProblem(BaseModel):
    field: str
    message: str
    type: str


class InvalidSpec(ValueError):
    def __init__(self, problems: list[SpecProblem]) -> None:
        self.problems = problems
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"invalid ModelDeployment: {first.field}: {first.message}{more}")


def _schema_problems(error: ValidationError) -> list[SpecProblem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = [p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            message = "is required but missing"
        elif item["type"] == "extra_forbidden":
            message = "is not a known field (check its spelling and indentation)"
        problems.append(SpecProblem(field=field_path(loc) or "body", message=message, type=item["type"]))
    return problems


def _selector_problems(deployment: ModelDeployment) -> list[SpecProblem]:
    problems = []
    for e, engine in enumerate(deployment.spec.template.spec.engines):
        for m, member in enumerate(engine.members):
            if member.node_selector is None:
                continue
            for d, device in enumerate(member.node_selector.devices):
                for s, selector in enumerate(device.selectors):
                    try:
                        compile_selector(selector.cel)
                    except SelectorCompileError as error:
                        path = (
                            f"spec.template.spec.engines[{e}].members[{m}].nodeSelector.devices[{d}].selectors[{s}].cel"
                        )
                        message = f"does not compile: {error.line}:{error.column}: {error.reason}"
                        problems.append(SpecProblem(field=path, message=message, type="cel_compile_error"))
    return problems


def check_manifest(manifest: Any, name: str | None = None, namespace: str | None = None) -> ModelDeployment:
    """The validated deployment, or `InvalidSpec` listing every problem. `name` and `namespace`, when given, must be
    the manifest's `metadata.name` and `metadata.namespace` (a PUT to /v1/namespaces/NS/deployments/NAME can neither
    rename nor move a deployment); left out of the manifest, they are taken from the address."""
    if not isinstance(manifest, dict):
        raise InvalidSpec([SpecProblem(field="body", message="must be a ModelDeployment object", type="type")])
    metadata = manifest.get("metadata")
    if isinstance(metadata, dict):
        if name is not None and "name" not in metadata:
            metadata = {**metadata, "name": name}
        # `default` is left implicit, so a default-namespace manifest stays as it was written.
        if namespace not in (None, DEFAULT_NAMESPACE) and metadata.get("namespace") is None:
            metadata = {**metadata, "namespace": namespace}
        manifest = {**manifest, "metadata": metadata}
    try:
        deployment = ModelDeployment.model_validate(manifest)
    except ValidationError as error:
        raise InvalidSpec(_schema_problems(error)) from None
    if name is not None and deployment.metadata.name != name:
        message = f"is {deployment.metadata.name!r} but the deployment addressed is {name!r}"
        raise InvalidSpec([SpecProblem(field="metadata.name", message=message, type="name_mismatch")])
    if namespace is not None and deployment.namespace != namespace:
        message = f"is {deployment.namespace!r} but the deployment addressed is in namespace {namespace!r}"
        raise InvalidSpec([SpecProblem(field="metadata.namespace", message=message, type="namespace_mismatch")])
    problems = _selector_problems(deployment) + _gguf_problems(deployment)
    if problems:
        raise InvalidSpec(problems)
    return deployment


def _gguf_problems(deployment: ModelDeployment) -> list[SpecProblem]:
    """A member's `resources.gguf` names a file on the machine that plans it: `berth plan` reads it there; the
    control plane reads no file a manifest names. The member gives the estimate `berth plan` prints instead."""
    return [
        SpecProblem(
            field=f"spec.template.spec.engines[{e}].members[{m}].resources.gguf",
            message="is read by `berth plan` only; give resources.gpuMemory (the estimate `berth plan` prints)",
            type="unsupported",
        )
        for e, engine in enumerate(deployment.spec.template.spec.engines)
        for m, member in enumerate(engine.members)
        if member.resources is not None and member.resources.gguf is not None
    ]


def normalised(deployment: ModelDeployment) -> dict[str, Any]:
    """The manifest as the workflow keeps it: camelCase, unset fields left out, observed status dropped."""
    return deployment.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
