"""Parsing CEL text into cel-python's syntax tree, and reading that tree.

cel-python's grammar wraps every expression in one node per precedence level (expr, conditionalor, ...,
member, primary), so `a.b` sits a dozen nodes below the root. The checker and the evaluator both need to see
through those wrappers (to find the field selection inside `has(...)`, or the plain name a macro binds), so
the helpers live here once.
"""

from __future__ import annotations

import re
from pathlib import Path

import celpy
import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from scheduler.cel.errors import SelectorCompileError

# Nodes that only carry their single child up one precedence level (parentheses change nothing in CEL).
PASS_THROUGH = frozenset(
    {
        "expr",
        "conditionalor",
        "conditionaland",
        "relation",
        "addition",
        "multiplication",
        "unary",
        "member",
        "primary",
        "paren_expr",
    }
)

Node = lark.Tree | lark.Token

MAX_LENGTH = 10240  # bytes; resource.CELSelectorExpressionMaxLength


def _keyword_literal(token: lark.Token) -> lark.Token:
    """`true` and `false` lex as identifiers first; retype them, keeping their position (cel-python's
    own parser drops it, which would leave `true && x` without line and column)."""
    if token.value in ("true", "false"):
        return lark.Token.new_borrow_pos("BOOL_LIT", token.value, token)
    return token


# cel-python's grammar and parser settings, with positions kept on every token.
_PARSER = lark.Lark(
    (Path(celpy.__file__).parent / "cel.lark").read_text(),
    parser="lalr",
    start="expr",
    g_regex_flags=re.M,
    lexer_callbacks={"IDENT": _keyword_literal},
    propagate_positions=True,
    maybe_placeholders=False,
    priority="invert",
)


def parse(expression: str) -> lark.Tree:
    """The syntax tree of `expression`, or a SelectorCompileError at the offending position.

    Like Kubernetes, refuse expressions longer than 10240 bytes before parsing them."""
    if len(expression.encode()) > MAX_LENGTH:
        raise SelectorCompileError(expression, 1, 1, f"expression is longer than {MAX_LENGTH} bytes")
    try:
        return _PARSER.parse(expression)
    except UnexpectedInput as error:
        line, column = max(error.line, 1), max(error.column, 1)
        raise SelectorCompileError(expression, line, column, f"Syntax error: {_describe(error)}") from None


def _describe(error: UnexpectedInput) -> str:
    if isinstance(error, UnexpectedToken):
        if error.token.type == "$END":
            return "unexpected end of expression"
        return f"unexpected {error.token.value!r}"
    if isinstance(error, UnexpectedCharacters):
        return f"unexpected character {error.char!r}"
    return "invalid expression"


def unwrap(node: lark.Tree) -> lark.Tree:
    """The first node below `node` that does more than pass its single child through."""
    while node.data in PASS_THROUGH and len(node.children) == 1 and isinstance(node.children[0], lark.Tree):
        node = node.children[0]
    return node


def plain_name(node: lark.Tree) -> str | None:
    """The identifier if `node` is nothing but a name (as a macro's variable must be), else None."""
    inner = unwrap(node)
    if inner.data == "ident":
        return str(inner.children[0])
    return None


def is_cel_bind(node: lark.Tree) -> bool:
    """Whether a member_dot_arg node is `cel.bind(...)` rather than a method named `bind` on a value."""
    target, method = node.children[0], node.children[1]
    return str(method) == "bind" and isinstance(target, lark.Tree) and plain_name(target) == "cel"


def arguments(node: lark.Tree) -> list[lark.Tree]:
    """The argument expressions of a call node (ident_arg or member_dot_arg), possibly none."""
    if not node.children:  # `[]`, `{}`
        return []
    last = node.children[-1]
    if isinstance(last, lark.Tree) and last.data == "exprlist":
        return [child for child in last.children if isinstance(child, lark.Tree)]
    return []


def position(node: Node) -> tuple[int, int]:
    """1-based (line, column) of a node or token."""
    if isinstance(node, lark.Token):
        return node.line or 1, node.column or 1
    return getattr(node.meta, "line", 1), getattr(node.meta, "column", 1)


def depth(node: lark.Tree) -> int:
    """How deeply the tree nests; evaluation recurses about three Python frames per level."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in current.children if isinstance(child, lark.Tree))
    return deepest


def position_after(node: lark.Tree, expression: str) -> tuple[int, int]:
    """1-based (line, column) of the first character after `node`: where a binary operator stands."""
    offset = getattr(node.meta, "end_pos", 0)
    while offset < len(expression) and expression[offset].isspace():
        offset += 1
    line = expression.count("\n", 0, offset) + 1
    return line, offset - (expression.rfind("\n", 0, offset) + 1) + 1
