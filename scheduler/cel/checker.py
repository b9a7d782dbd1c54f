"""Compile-time checks: what Kubernetes rejects before a selector ever meets a device.

cel-python evaluates dynamically and would only fail on a misspelt name when a device reaches it; Kubernetes
compiles selectors with cel-go's type checker and then applies admission limits. This walks the syntax tree
once with the types from `types.py` and the declarations from `library.py` and raises
`SelectorCompileError` for what Kubernetes would refuse at submission:

* an undeclared identifier (only `device`, type names and macro/bind variables exist) or function;
* a field `device` does not have (`device.name`), or field selection on a value that has no fields;
* a call or operator with no matching overload for the argument types known statically
  (`quantity("1Gi") < quantity("2Gi")`, `sign` called as a method, `isQuantity(1)`);
* a result whose static type is neither `bool` nor `dyn` ("must evaluate to bool or the unknown type");
* a misused macro (`has(x["k"])`, a non-name macro variable);
* an expression whose estimated worst-case cost exceeds 1,000,000 (the 10240-byte length limit is
  applied earlier, by `syntax.parse`), or that nests too deeply for cel-python's recursive evaluator.

The cost estimate mirrors the shape of cel-go's (each step costs 1, a comprehension multiplies its body by
the largest range it can meet: 32 for a device's attribute and capacity maps, the length of a literal, 64
otherwise), not its exact numbers. Anything typed `dyn` (every attribute value) is left to run time, and so is
what no estimate can know (the length of a published string): evaluation counts its actual cost too (cost.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

import lark

from scheduler.cel.cost import MAX_COST
from scheduler.cel.errors import SelectorCompileError
from scheduler.cel.library import FUNCTIONS, KUBERNETES_ONLY
from scheduler.cel.syntax import Node, arguments, depth, is_cel_bind, plain_name, position, position_after, unwrap
from scheduler.cel.types import (
    BOOL,
    BYTES,
    DEVICE,
    DEVICE_FIELDS,
    DOUBLE,
    DYN,
    INT,
    NULL,
    NUMERIC,
    STRING,
    TYPE,
    TYPE_NAMES,
    UINT,
    CelType,
    element_type,
    is_assignable,
    join,
    list_of,
    map_of,
)

# cel-python evaluates recursively, about three Python frames per syntax level, under the recursion limit
# evaluator.py sets (2500): 300 levels leave room for the caller. Real selectors nest 20 to 60 levels.
MAX_DEPTH = 300
DEVICE_MAP_BOUND = 32  # resource.ResourceSliceMaxAttributesAndCapacitiesPerDevice
UNKNOWN_BOUND = 64

_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_PREDICATE_MACROS = frozenset({"all", "exists", "exists_one", "filter"})
_KUBERNETES_NAMESPACES = frozenset({"sets", "strings", "optional"})
_MAP_KEYS = (INT, UINT, BOOL, STRING)
_OPERATORS = {
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_gt": "_>_",
    "relation_ge": "_>=_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "relation_in": "_in_",
    "addition_add": "_+_",
    "addition_sub": "_-_",
    "multiplication_mul": "_*_",
    "multiplication_div": "_/_",
    "multiplication_mod": "_%_",
    "unary_not": "!_",
    "unary_neg": "-_",
}
_LITERALS = {
    "INT_LIT": INT,
    "UINT_LIT": UINT,
    "FLOAT_LIT": DOUBLE,
    "STRING_LIT": STRING,
    "MLSTRING_LIT": STRING,
    "BYTES_LIT": BYTES,
    "BOOL_LIT": BOOL,
    "NULL_LIT": NULL,
}

Scope = Mapping[str, CelType]


@dataclass(frozen=True)
class Checked:
    """What the checker knows of a subexpression: its type, estimated cost and (for a container) its
    largest possible size, if known."""

    type: CelType
    cost: int
    size: int | None = None


def check(expression: str, tree: lark.Tree) -> int:
    """Raise SelectorCompileError if Kubernetes would reject `expression`; else its estimated worst-case cost."""
    if depth(tree) > MAX_DEPTH:
        raise SelectorCompileError(expression, 1, 1, f"expression nests more than {MAX_DEPTH} levels deep")
    checked = _Checker(expression).check(tree, {})
    if checked.type not in (BOOL, DYN):
        line, column = position(tree)
        raise SelectorCompileError(
            expression, line, column, f"must evaluate to bool or the unknown type, not {checked.type}"
        )
    if checked.cost > MAX_COST:
        raise SelectorCompileError(
            expression, 1, 1, f"too complex, exceeds cost limit (estimated {checked.cost} > {MAX_COST})"
        )
    return checked.cost


def _signature(args: list[CelType], member: bool) -> str:
    if member:
        return f"{args[0]}.({', '.join(str(arg) for arg in args[1:])})"
    return f"({', '.join(str(arg) for arg in args)})"


class _Checker:
    def __init__(self, expression: str) -> None:
        self._expression = expression

    def _fail(self, where: Node | tuple[int, int], reason: str) -> NoReturn:
        line, column = where if isinstance(where, tuple) else position(where)
        raise SelectorCompileError(self._expression, line, column, reason)

    def check(self, node: lark.Tree, scope: Scope) -> Checked:
        node = unwrap(node)
        handler = getattr(self, f"_check_{node.data}")
        return handler(node, scope)

    # Operators --------------------------------------------------------------------------------------------

    def _check_expr(self, node: lark.Tree, scope: Scope) -> Checked:
        condition, then, otherwise = (self.check(child, scope) for child in node.children)
        if not is_assignable(BOOL, condition.type):
            self._fail(node, f"found no matching overload for '_?_:_' applied to '({condition.type}, ...)'")
        result = join(then.type, otherwise.type)
        if result is None:
            self._fail(node, f"the branches of '?:' have different types: {then.type} and {otherwise.type}")
        return Checked(result, condition.cost + max(then.cost, otherwise.cost) + 1)

    def _check_conditionalor(self, node: lark.Tree, scope: Scope) -> Checked:
        return self._logical("_||_", node, scope)

    def _check_conditionaland(self, node: lark.Tree, scope: Scope) -> Checked:
        return self._logical("_&&_", node, scope)

    def _logical(self, operator: str, node: lark.Tree, scope: Scope) -> Checked:
        left_node, right_node = node.children
        left, right = self.check(left_node, scope), self.check(right_node, scope)
        where = position_after(left_node, self._expression)
        return Checked(self._resolve(operator, [left.type, right.type], False, where), left.cost + right.cost + 1)

    def _binary(self, node: lark.Tree, scope: Scope) -> Checked:
        operator_node, right_node = node.children
        left_node = operator_node.children[0]
        operator = _OPERATORS[operator_node.data]
        left, right = self.check(left_node, scope), self.check(right_node, scope)
        where = position_after(left_node, self._expression)
        cost = left.cost + right.cost + 1
        if operator in ("_==_", "_!=_"):
            if not _comparable(left.type, right.type):
                self._fail(
                    where, f"found no matching overload for '{operator}' applied to '({left.type}, {right.type})'"
                )
            return Checked(BOOL, cost)
        if operator == "_in_":
            self._check_membership(left.type, right.type, where)
            return Checked(BOOL, cost)
        result = self._resolve(operator, [left.type, right.type], False, where)
        if operator == "_+_" and left.type.name == right.type.name == "list":
            result = list_of(join(element_type(left.type), element_type(right.type)) or DYN)
        return Checked(result, cost)

    _check_relation = _binary
    _check_addition = _binary
    _check_multiplication = _binary

    def _check_membership(self, item: CelType, container: CelType, where: tuple[int, int]) -> None:
        if container.name in ("list", "map") and _comparable(item, element_type(container)):
            return
        if container == DYN:
            return
        self._fail(where, f"found no matching overload for '_in_' applied to '({item}, {container})'")

    def _check_unary(self, node: lark.Tree, scope: Scope) -> Checked:
        operator_node, operand_node = node.children
        operand = self.check(operand_node, scope)
        result = self._resolve(_OPERATORS[operator_node.data], [operand.type], False, node)
        return Checked(result, operand.cost + 1)

    # Selection and indexing -------------------------------------------------------------------------------

    def _check_member_dot(self, node: lark.Tree, scope: Scope) -> Checked:
        target_node, field_token = node.children
        target = self.check(target_node, scope)
        field = str(field_token)
        if target.type == DEVICE:
            if field not in DEVICE_FIELDS:
                self._fail(field_token, f"undefined field '{field}'")
            field_type = DEVICE_FIELDS[field]
            return Checked(field_type, target.cost + 1, DEVICE_MAP_BOUND if field_type.name == "map" else None)
        if target.type.name == "map" and is_assignable(target.type.params[0], STRING):
            return self._element(target, target.type.params[1])
        if target.type == DYN:
            return Checked(DYN, target.cost + 1)
        self._fail(field_token, f"type '{target.type}' does not support field selection")

    def _check_member_index(self, node: lark.Tree, scope: Scope) -> Checked:
        target_node, index_node = node.children
        target, index = self.check(target_node, scope), self.check(index_node, scope)
        container = target.type
        if container.name == "list" and any(is_assignable(each, index.type) for each in (INT, UINT)):
            return self._element(target, container.params[0], index.cost)
        if container.name == "map" and is_assignable(container.params[0], index.type):
            return self._element(target, container.params[1], index.cost)
        if container == DYN:
            return Checked(DYN, target.cost + index.cost + 1)
        where = position_after(target_node, self._expression)
        self._fail(where, f"found no matching overload for '_[_]' applied to '({container}, {index.type})'")

    @staticmethod
    def _element(container: Checked, element: CelType, extra_cost: int = 0) -> Checked:
        """An element of a container; a device's domain map holds maps as bounded as itself."""
        inherited = container.size if container.size == DEVICE_MAP_BOUND and element.name == "map" else None
        return Checked(element, container.cost + extra_cost + 1, inherited)

    def _check_member_object(self, node: lark.Tree, scope: Scope) -> Checked:
        self._fail(node, "message construction is not supported in a device selector")

    # Calls and macros -------------------------------------------------------------------------------------

    def _check_member_dot_arg(self, node: lark.Tree, scope: Scope) -> Checked:
        target_node, method_token = node.children[0], node.children[1]
        name = str(method_token)
        args = arguments(node)
        if is_cel_bind(node):
            return self._bind(method_token, args, scope)
        if name in _MACROS:
            return self._macro(name, method_token, target_node, args, scope)
        namespace = plain_name(target_node)
        if namespace in _KUBERNETES_NAMESPACES and namespace not in scope:
            qualified = f"{namespace}.{name}"
            if qualified not in FUNCTIONS:
                self._fail(method_token, f"function '{qualified}' is not supported by Berth's CEL environment")
            checked_args = [self.check(arg, scope) for arg in args]
            result = self._resolve(qualified, [arg.type for arg in checked_args], False, method_token)
            return Checked(result, sum(arg.cost for arg in checked_args) + 1)
        target = self.check(target_node, scope)
        checked_args = [self.check(arg, scope) for arg in args]
        result = self._resolve(name, [target.type, *(arg.type for arg in checked_args)], True, method_token)
        return Checked(result, target.cost + sum(arg.cost for arg in checked_args) + 1)

    def _check_ident_arg(self, node: lark.Tree, scope: Scope) -> Checked:
        name_token = node.children[0]
        name = str(name_token)
        args = arguments(node)
        if name == "has":
            if len(args) != 1 or unwrap(args[0]).data != "member_dot":
                self._fail(name_token, "invalid argument to has() macro")
            return Checked(BOOL, self.check(args[0], scope).cost + 1)
        checked_args = [self.check(arg, scope) for arg in args]
        cost = sum(arg.cost for arg in checked_args) + 1
        if name == "dyn" and len(checked_args) == 1:
            return Checked(DYN, cost, checked_args[0].size)
        return Checked(self._resolve(name, [arg.type for arg in checked_args], False, name_token), cost)

    def _bind(self, where: Node, args: list[lark.Tree], scope: Scope) -> Checked:
        variable = plain_name(args[0]) if len(args) == 3 else None
        if variable is None:
            self._fail(where, "cel.bind() takes a variable name, a value and an expression")
        value = self.check(args[1], scope)
        body = self.check(args[2], {**scope, variable: value.type})
        return Checked(body.type, value.cost + body.cost + 1, body.size)

    def _macro(self, name: str, where: Node, target_node: lark.Tree, args: list[lark.Tree], scope: Scope) -> Checked:
        if name == "map" and len(args) == 3:
            self._fail(where, "map(x, predicate, transform) is not supported; write filter(x, predicate).map(x, ...)")
        variable = plain_name(args[0]) if len(args) == 2 else None
        if variable is None:
            self._fail(where, f"{name}() takes a variable name and an expression")
        target = self.check(target_node, scope)
        if target.type.name not in ("list", "map") and target.type != DYN:
            self._fail(where, f"expression of type '{target.type}' cannot be the range of a comprehension")
        body = self.check(args[1], {**scope, variable: element_type(target.type)})
        if name in _PREDICATE_MACROS and not is_assignable(BOOL, body.type):
            self._fail(where, f"the predicate of {name}() must be bool, not {body.type}")
        bound = target.size if target.size is not None else UNKNOWN_BOUND
        cost = target.cost + bound * (body.cost + 1) + 1
        if name == "map":
            return Checked(list_of(body.type), cost, target.size)
        if name == "filter":
            return Checked(list_of(element_type(target.type)), cost, target.size)
        return Checked(BOOL, cost)

    def _resolve(self, name: str, args: list[CelType], member: bool, where: Node | tuple[int, int]) -> CelType:
        """The result type of calling `name` with `args`, from its declared overloads."""
        function = FUNCTIONS.get(name)
        if function is None:
            if name in KUBERNETES_ONLY:
                self._fail(where, f"function '{name}' is not supported by Berth's CEL environment")
            self._fail(where, f"undeclared reference to '{name}'")
        results = {
            overload.result
            for overload in function.overloads
            if overload.member == member
            and len(overload.args) == len(args)
            and all(is_assignable(declared, actual) for declared, actual in zip(overload.args, args, strict=True))
        }
        if not results:
            self._fail(where, f"found no matching overload for '{name}' applied to '{_signature(args, member)}'")
        return results.pop() if len(results) == 1 else DYN

    # Names and literals -----------------------------------------------------------------------------------

    def _check_ident(self, node: lark.Tree, scope: Scope) -> Checked:
        token = node.children[0]
        name = str(token)
        if name in scope:
            return Checked(scope[name], 1)
        return self._global(token)

    def _check_dot_ident(self, node: lark.Tree, scope: Scope) -> Checked:
        return self._global(node.children[0])

    def _global(self, token: lark.Token) -> Checked:
        name = str(token)
        if name == "device":
            return Checked(DEVICE, 1)
        if name in TYPE_NAMES:
            return Checked(TYPE, 1)
        self._fail(token, f"undeclared reference to '{name}'")

    def _check_dot_ident_arg(self, node: lark.Tree, scope: Scope) -> Checked:
        self._fail(node, "calling a function with a leading '.' is not supported")

    def _check_literal(self, node: lark.Tree, scope: Scope) -> Checked:
        token = node.children[0]
        literal_type = _LITERALS[token.type]
        if literal_type in (INT, UINT) and not _in_range(token.value, literal_type):
            self._fail(token, f"invalid {literal_type} literal {token.value}")
        return Checked(literal_type, 1)

    def _check_list_lit(self, node: lark.Tree, scope: Scope) -> Checked:
        elements = [self.check(child, scope) for child in arguments(node)]
        element = _join_all([each.type for each in elements])
        return Checked(list_of(element), sum(each.cost for each in elements) + 1, len(elements))

    def _check_map_lit(self, node: lark.Tree, scope: Scope) -> Checked:
        entries = node.children[0].children if node.children else []
        checked = [self.check(child, scope) for child in entries]
        keys, values = checked[0::2], checked[1::2]
        for key_node, key in zip(entries[0::2], keys, strict=True):
            if key.type != DYN and key.type not in _MAP_KEYS:
                self._fail(key_node, f"unsupported map key type: {key.type}")
        key_type = _join_all([key.type for key in keys])
        value_type = _join_all([value.type for value in values])
        return Checked(map_of(key_type, value_type), sum(each.cost for each in checked) + 1, len(keys))


def _in_range(literal: str, literal_type: CelType) -> bool:
    """Whether an integer literal fits int64 (or uint64 for `1u`)."""
    digits = literal.rstrip("uU")
    if len(digits) > 24:
        return False
    low, high = (-(2**63), 2**63 - 1) if literal_type == INT else (0, 2**64 - 1)
    return low <= int(digits, 0) <= high


def _join_all(types: list[CelType]) -> CelType:
    result = types[0] if types else DYN
    for each in types[1:]:
        result = join(result, each) or DYN
    return result


def _comparable(left: CelType, right: CelType) -> bool:
    """Whether `==` between the two static types is allowed: same type, dyn, or both numbers."""
    return is_assignable(left, right) or (left in NUMERIC and right in NUMERIC)
