"""Read fleet files: YAML (several documents per file) or JSON, Kubernetes `List` objects included.

Loading is all-or-nothing: every document is validated, then the fleet as a whole, and every problem is reported
together, so an operator fixes a file in one pass instead of one error per run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fleet.errors import FleetError, FleetProblem
from fleet.fleet import Fleet
from fleet.kinds import KINDS
from fleet.meta import API_VERSIONS
from fleet.validate import check_fleet


def field_path(loc: Iterable[int | str]) -> str:
    """`('spec', 'nodePools', 0, 'name')` -> `spec.nodePools[0].name`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _problems_from_validation(error: ValidationError, base: FleetProblem) -> list[FleetProblem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = [p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        message = item["msg"]
        if item["type"] == "missing":
            message = "is required but missing"
        elif item["type"] == "extra_forbidden":
            message = "is not a known field (check its spelling and indentation)"
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        elif item["type"] == "literal_error":
            message = f"{message} (got {item['input']!r})"
        problems.append(base.model_copy(update={"path": field_path(loc) or None, "message": message}))
    return problems


def is_node_list(document: Any) -> bool:
    """A Kubernetes NodeList, or the `List` of `Node`s that `kubectl get nodes -o yaml` prints."""
    if not isinstance(document, dict):
        return False
    items = document.get("items")
    if document.get("kind") == "NodeList":
        return True
    return (
        document.get("kind") == "List"
        and isinstance(items, list)
        and bool(items)
        and all(isinstance(item, dict) and item.get("kind") == "Node" for item in items)
    )


def _parse_documents(text: str, source: str | None) -> tuple[list[tuple[int, Any]], list[FleetProblem]]:
    try:
        raw = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        return [], [FleetProblem(source=source, message=f"is not valid YAML or JSON{where}: {reason}")]
    documents: list[tuple[int, Any]] = []
    for number, document in enumerate(raw, start=1):
        if is_node_list(document):
            documents.append((number, document))
        elif isinstance(document, dict) and document.get("kind") == "List" and isinstance(document.get("items"), list):
            documents.extend((number, item) for item in document["items"])
        elif document is not None:
            documents.append((number, document))
    return documents, []


def _validate_document(number: int, document: Any, source: str | None) -> tuple[BaseModel | None, list[FleetProblem]]:
    if not isinstance(document, dict):
        return None, [
            FleetProblem(source=source, document=number, message="is not a mapping with apiVersion, kind and metadata")
        ]
    kind = document.get("kind")
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    name = name if isinstance(name, str) else None  # a problem names a document only by a string name
    base = FleetProblem(
        source=source, document=number, kind=kind if isinstance(kind, str) else None, name=name, message=""
    )
    if not kind:
        return None, [base.model_copy(update={"path": "kind", "message": "is required but missing"})]
    model = KINDS.get(kind) if isinstance(kind, str) else None  # a mapping or list as `kind` is unknown too
    if model is None:
        known = ", ".join(sorted(KINDS))
        return None, [
            base.model_copy(update={"path": "kind", "message": f"unknown kind {kind!r} (known kinds: {known})"})
        ]
    api_version = document.get("apiVersion")
    if api_version not in API_VERSIONS:
        accepted = " or ".join(API_VERSIONS)
        message = f"must be {accepted} (got {api_version!r})" if api_version else f"is required ({accepted})"
        return None, [base.model_copy(update={"path": "apiVersion", "message": message})]
    try:
        return model.model_validate(document), []
    except ValidationError as exc:
        return None, _problems_from_validation(exc, base)


def parse_fleet(sources: Iterable[tuple[str | None, str]]) -> Fleet:
    """Build a Fleet from (source name, text) pairs, or raise FleetError listing every problem."""
    problems: list[FleetProblem] = []
    objects: list[tuple[FleetProblem, BaseModel]] = []
    node_lists: list[dict[str, Any]] = []
    for source, text in sources:
        documents, parse_problems = _parse_documents(text, source)
        problems.extend(parse_problems)
        for number, document in documents:
            if is_node_list(document):
                node_lists.append(document)
                continue
            obj, found = _validate_document(number, document, source)
            problems.extend(found)
            if obj is not None:
                where = FleetProblem(
                    source=source,
                    document=number,
                    kind=document["kind"],
                    name=document["metadata"]["name"],
                    message="",
                )
                objects.append((where, obj))
    fleet, fleet_problems = check_fleet(objects)
    fleet.node_lists = node_lists
    problems.extend(fleet_problems)
    if problems:
        raise FleetError(problems)
    return fleet


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def load_fleet(paths: Iterable[Path | str]) -> Fleet:
    """Read and validate fleet files from disk (`-` is standard input; a directory: its manifest files)."""
    sources: list[tuple[str | None, str]] = []
    for path in paths:
        if str(path) == "-":
            import sys

            sources.append(("<stdin>", sys.stdin.read()))
            continue
        file = Path(path)
        if file.is_dir():  # as `kubectl apply -f DIR`: its .yaml, .yml and .json files, in name order, not recursive
            files = sorted(p for p in file.iterdir() if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
            if not files:
                raise FleetError(
                    [FleetProblem(source=str(file), message="is a directory with no .yaml, .yml or .json file")]
                )
            sources.extend(_read(f) for f in files)
            continue
        sources.append(_read(file))
    return parse_fleet(sources)


def _read(file: Path) -> tuple[str, str]:
    try:
        return str(file), file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FleetError([FleetProblem(source=str(file), message="no such file")]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise FleetError([FleetProblem(source=str(file), message=f"cannot be read: {exc}")]) from None
