"""The errors a DRA CEL selector can raise.

Kubernetes splits selector failures in two, and so do we: a compile error is the author's mistake and is
reported when the class, deployment or request is submitted; a runtime error depends on the device the
selector meets (a missing attribute, a value of the wrong type) and is reported per device while matching.
"""

from __future__ import annotations

_EXPRESSION_SHOWN = 200


def _quoted(expression: str) -> str:
    """The expression as it appears in a message: whole unless it is very long."""
    if len(expression) <= _EXPRESSION_SHOWN:
        return repr(expression)
    return repr(expression[:_EXPRESSION_SHOWN]) + "..."


class SelectorError(Exception):
    """Any failure of a DRA CEL selector."""


class SelectorCompileError(SelectorError):
    """The expression is not a valid DRA selector: syntax, undeclared names, wrong types, too costly."""

    def __init__(self, expression: str, line: int, column: int, reason: str) -> None:
        self.expression = expression
        self.line = line
        self.column = column
        self.reason = reason
        lines = expression.splitlines() or [""]
        source = lines[line - 1] if 0 < line <= len(lines) else ""
        caret = " " * max(column - 1, 0) + "^"
        super().__init__(
            f"CEL selector {_quoted(expression)} does not compile: {line}:{column}: {reason}\n | {source}\n | {caret}"
        )


class SelectorRuntimeError(SelectorError):
    """The expression compiled but could not be evaluated against one device."""

    def __init__(self, expression: str, reason: str, line: int | None = None, column: int | None = None) -> None:
        self.expression = expression
        self.reason = reason
        self.line = line
        self.column = column
        where = f" at {line}:{column}" if line is not None and column is not None else ""
        super().__init__(f"CEL selector {_quoted(expression)} failed{where}: {reason}")


class SelectorCostExceeded(SelectorError):
    """A request's selectors cost more than the request may spend (`cost.REQUEST_BUDGET`): the request is refused.

    Raised at admission when one selector's estimated cost alone is over the budget (`estimated` true), or out of a
    scheduling pass when the actual cost of all the request's selectors over the devices it met passes it; then
    `expression` is the selector being evaluated when it did. Not a runtime error: no device is at fault, and it is
    never remembered as a device's outcome."""

    code = "selector_cost_exceeded"

    def __init__(self, expression: str | None, cost: int, budget: int, *, estimated: bool = False) -> None:
        self.expression = expression
        self.cost = cost
        self.budget = budget
        self.estimated = estimated
        limit = f"the budget of {budget} that a request's selectors may spend together"
        if estimated:
            message = (
                f"CEL selector {_quoted(expression or '')} is too costly: its estimated cost {cost} is over {limit}"
            )
        else:
            which = f" (stopped in {_quoted(expression)})" if expression is not None else ""
            message = f"the request's CEL selectors cost more than {limit}{which}"
        super().__init__(message)


class DeviceError(SelectorError):
    """A published device cannot be given to CEL: an attribute or capacity value is malformed.

    Kubernetes reports this while matching (the device, not the expression, is at fault), so
    `Selector.matches` turns it into a `SelectorRuntimeError`; `prepare_device` raises it directly so a
    class can be validated before any selector meets it.
    """
