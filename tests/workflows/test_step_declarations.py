"""The workflows call activities through the declarations in contracts/steps.py; each must be registered by the
process that runs it under the same name, with the same argument and result types. A declaration that drifted from
its implementation would fail only at run time, on a real allocation (a payload that does not decode)."""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity

from activities.cluster.activities import ClusterActivities
from activities.control.admission import AdmissionActivities
from activities.control.audit import AuditActivities
from activities.control.claims import ClaimActivities
from activities.control.deployments import DeploymentActivities
from activities.control.placement import PlacementActivities
from activities.control.records import RecordActivities
from activities.control.reservations import ReservationActivities
from agent.activities import NodeAgent
from contracts import steps

WORKFLOWS = Path(__file__).parents[2] / "workflows"
CONTROL = (
    PlacementActivities,
    AdmissionActivities,
    ClaimActivities,
    RecordActivities,
    AuditActivities,
    DeploymentActivities,
    ClusterActivities,
    ReservationActivities,
)


def _registered(*classes: type) -> dict[str, Callable[..., Any]]:
    """Activity name -> method, for every `@activity.defn` method of the classes."""
    found: dict[str, Callable[..., Any]] = {}
    for cls in classes:
        for _, method in inspect.getmembers(cls, inspect.isfunction):
            definition = getattr(method, "__temporal_activity_definition", None)
            if definition is not None:
                found[definition.name] = method
    return found


def _declared() -> list[Callable[..., Any]]:
    return [
        fn for _, fn in inspect.getmembers(steps, inspect.isfunction) if hasattr(fn, "__temporal_activity_definition")
    ]


def _types(fn: Callable[..., Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(fn)
    parameters = [name for name in inspect.signature(fn).parameters if name != "self"]
    return {"args": [hints[name] for name in parameters], "result": hints.get("return")}


@pytest.mark.parametrize("declared", _declared(), ids=lambda fn: fn.__name__)
def test_each_declared_step_is_implemented_with_the_same_name_and_types(declared: Callable[..., Any]) -> None:
    name = activity._Definition.must_from_callable(declared).name
    assert declared.__name__ == name  # the node-call summary in the UI names the step by the function
    node_side = _registered(NodeAgent)
    implementation = node_side.get(name) or _registered(*CONTROL).get(name)
    assert implementation is not None, f"no process registers the activity {name!r}"
    assert _types(implementation) == _types(declared)
    # The node agent's steps are synchronous (they run on its thread pool) and the control steps are coroutines:
    # the declaration says which kind it is, so a reader of the workflow knows where the step runs.
    assert inspect.iscoroutinefunction(declared) == inspect.iscoroutinefunction(implementation)
    assert (name in node_side) == (not inspect.iscoroutinefunction(declared))


# Every module whose code runs inside a workflow: those that import through the sandbox.
WORKFLOW_CODE = sorted(
    str(path.relative_to(WORKFLOWS))
    for path in WORKFLOWS.rglob("*.py")
    if "workflow.unsafe.imports_passed_through" in path.read_text()
)


@pytest.mark.parametrize("module", WORKFLOW_CODE)
def test_the_workflows_call_no_activity_by_a_string_name(module: str) -> None:
    """What the workflows run is a declaration of contracts/steps.py, never a
    name in a string (which "go to definition" cannot follow and no type checker can hold against the result)."""
    tree = ast.parse((WORKFLOWS / module).read_text())
    callers = {"execute_activity", "execute_local_activity", "on_node", "on_control", "control", "local"}
    by_string = [
        f"line {call.lineno}: {ast.unparse(call)[:80]}"
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and (call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)) in callers
        and any(isinstance(arg, ast.Constant) and isinstance(arg.value, str) for arg in call.args)
    ]
    assert not by_string, by_string
