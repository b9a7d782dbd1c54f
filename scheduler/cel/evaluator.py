"""Evaluating a checked selector with cel-python, patched where it differs from cel-go as Kubernetes runs it.

cel-python 0.5 interprets the syntax tree directly. This subclass of its evaluator adds or changes:

* `cel.bind(name, value, expr)` (cel-go's bindings extension, which Kubernetes enables for DRA): `expr` is
  evaluated with `name` bound to `value`; an error in `value` matters only if `expr` uses it.
* The comprehension macros (`all`, `exists`, `exists_one`, `map`, `filter`) with cel-go's semantics: `all`
  is false if any element is false even when others err, `exists` true if any is true; ranging over a
  non-list non-map is an error, not a Python exception.
* Lookups fail as cel-go reports them: "no such key: name", and list indexes must be in range (cel-python
  would accept -1).
* `has(e.f)` is an error when `e` itself is (cel-python would say false).
* `strings.quote(s)`: a namespaced function, where cel-python would look up a variable `strings`.
* Actual cost (cost.py): every evaluated node that is more than a precedence wrapper or a literal costs 1, every
  comprehension iteration 1 more; past the limit evaluation stops with `CostLimitExceeded` (past the request's
  budget, `RequestCostExceeded`).
* Speed: precedence wrappers are skipped rather than visited, and cel-python's per-operator typing casts
  made cheap; together about twice as fast on the selectors bench/cel_cost.py measures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import lark
from celpy import celtypes
from celpy import evaluation as _celpy_evaluation
from celpy.evaluation import Activation, CELEvalError, Evaluator

from scheduler.cel.cost import charge, charge_text
from scheduler.cel.library import PARSERS, RUNTIME_FUNCTIONS
from scheduler.cel.syntax import PASS_THROUGH, arguments, is_cel_bind, plain_name, unwrap
from scheduler.cel.values import type_name

# cel-python recurses through its syntax tree, about three Python frames per level; checker.MAX_DEPTH
# keeps expressions well inside this. cel-python's own Environment raises the limit the same way.
_RECURSION_LIMIT = 2500
sys.setrecursionlimit(max(sys.getrecursionlimit(), _RECURSION_LIMIT))

# cel-python's operators run `cast(Tuple[List[Result], Result], ...)` at every call, and typing rebuilds and hashes its
# large `Result` union each time: about half the CPU of a comprehension-heavy selector (profiled). `Result`
# is a type hint only (cel-python never tests a value against it), so it is made `Any` for the running interpreter.
if hasattr(_celpy_evaluation, "Result"):
    _celpy_evaluation.Result = Any  # type: ignore[attr-defined]

_GLOBALS = Activation(annotations={}, functions=RUNTIME_FUNCTIONS)
# Nodes that cost nothing: precedence wrappers passing one child up, and literal constants (as in cel-go).
_FREE = PASS_THROUGH | {"literal"}
# The wrappers whose cel-python method does nothing but return its one child's value (`primary` also builds list and
# map literals and resolves names, so it is visited as it is).
_WRAPPERS = PASS_THROUGH - {"primary", "paren_expr"}

Result = Any  # a CEL value or a CELEvalError carried as a value


def evaluate(tree: lark.Tree, variables: dict[str, Any]) -> Any:
    """Evaluate a checked tree; raises CELEvalError if the result is an error."""
    return DeviceSelectorEvaluator(tree, activation=_GLOBALS).evaluate(variables)


class DeviceSelectorEvaluator(Evaluator):
    """cel-python's tree interpreter with the changes listed at the top of this module."""

    def sub_evaluator(self, ast: lark.Tree) -> DeviceSelectorEvaluator:
        return DeviceSelectorEvaluator(ast, activation=self.activation)

    def _visit_tree(self, tree: lark.Tree) -> Result:
        """Every node goes through here (lark's Interpreter): charge the ones that do work.

        A precedence wrapper holding one subtree only hands its child's value up (cel-python visits it, makes a
        list of one and takes it back out): going straight to the child gives the same value and skips most of the
        interpreter's overhead, since CEL's grammar wraps every operand in up to ten such levels."""
        while tree.data in _WRAPPERS and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree):
            tree = tree.children[0]
        if tree.data not in _FREE or (len(tree.children) != 1 and tree.data != "literal"):
            charge(1)
        return super()._visit_tree(tree)

    def function_eval(self, name_token: lark.Token, exprlist: Any = None) -> Result:
        """A global function call costs 1, as in cel-go (cel-python reaches it from `primary`, a node that is
        otherwise free); a conversion or parser of a string is charged its traversal too."""
        charge(1)
        if str(name_token) in PARSERS and exprlist:
            arguments = list(exprlist)
            charge_text(*(str(arg) for arg in arguments if isinstance(arg, celtypes.StringType)))
            exprlist = arguments
        return super().function_eval(name_token, exprlist)

    def _scoped(self, body: lark.Tree, name: str) -> Callable[[Any], Result]:
        """`body` as a function of one variable; errors come back as values."""
        nested = self.sub_evaluator(body)

        def run(value: Any) -> Result:
            charge(1)  # the iteration itself, besides its body
            try:
                return nested.evaluate({name: value})
            except CELEvalError as error:
                return error

        return run

    def member_dot(self, tree: lark.Tree) -> Result:
        target_tree, field = tree.children
        return _lookup(self.visit(target_tree), celtypes.StringType(field), field)

    def member_index(self, tree: lark.Tree) -> Result:
        target, index = self.visit_children(tree)
        if isinstance(index, CELEvalError):
            return index
        return _lookup(target, index, tree)

    def macro_has_eval(self, exprlist: lark.Tree) -> Result:
        selection = unwrap(exprlist.children[0])
        target = self.visit(selection.children[0])
        if isinstance(target, CELEvalError):
            return target
        if not isinstance(target, celtypes.MapType):
            return CELEvalError(f"has() needs a map, not {type_name(target)}", tree=selection)
        return celtypes.BoolType(celtypes.StringType(selection.children[1]) in target)

    def member_dot_arg(self, tree: lark.Tree) -> Result:
        name = str(tree.children[1])
        args = arguments(tree)
        if is_cel_bind(tree):
            value = self.visit(args[1])
            return self._scoped(args[2], plain_name(args[0]) or "")(value)
        if plain_name(tree.children[0]) == "strings" and "strings" not in self.activation.identifiers:
            return self.function_eval(lark.Token("IDENT", f"strings.{name}"), [self.visit(arg) for arg in args])
        if name not in _MACROS:
            return super().member_dot_arg(tree)
        target = self.visit(tree.children[0])
        if isinstance(target, CELEvalError):
            return target
        if not isinstance(target, celtypes.ListType | celtypes.MapType):
            return CELEvalError(f"expected iterable type, got {type_name(target)}", tree=tree)
        body = self._scoped(args[1], plain_name(args[0]) or "")
        return _MACROS[name](iter(target), body, tree)


def _error(message: str, where: lark.Tree | lark.Token) -> CELEvalError:
    if isinstance(where, lark.Token):
        return CELEvalError(message, token=where)
    return CELEvalError(message, tree=where)


def _lookup(target: Any, key: Any, where: lark.Tree | lark.Token) -> Result:
    """`target[key]` or `target.key` with cel-go's errors."""
    if isinstance(target, CELEvalError):
        return target
    if isinstance(target, celtypes.MapType):
        try:
            return target[key]
        except KeyError:
            return _error(f"no such key: {key}", where)
        except TypeError:
            return _error(f"unsupported key type: {type_name(key)}", where)
    if isinstance(target, celtypes.ListType) and isinstance(key, celtypes.IntType | celtypes.UintType):
        if 0 <= key < len(target):
            return target[key]
        return _error(f"index out of bounds: {key}", where)
    return _error(f"no such overload: {type_name(target)}[{type_name(key)}]", where)


def _quantifier(
    decisive: bool,
) -> Callable[[Iterator[Any], Callable[[Any], Result], lark.Tree], Result]:
    """`all` (decisive False) or `exists` (decisive True): one decisive element settles the answer even
    if others are errors; otherwise the first error is the answer."""

    def quantify(elements: Iterator[Any], body: Callable[[Any], Result], tree: lark.Tree) -> Result:
        error = None
        for element in elements:
            outcome = body(element)
            if isinstance(outcome, celtypes.BoolType):
                if bool(outcome) is decisive:
                    return celtypes.BoolType(decisive)
            elif error is None:
                error = outcome if isinstance(outcome, CELEvalError) else _not_bool(outcome, tree)
        return error if error is not None else celtypes.BoolType(not decisive)

    return quantify


def _not_bool(value: Any, tree: lark.Tree) -> CELEvalError:
    return CELEvalError(f"predicate returned {type_name(value)}, not bool", tree=tree)


def _exists_one(elements: Iterator[Any], body: Callable[[Any], Result], tree: lark.Tree) -> Result:
    count = 0
    for element in elements:
        outcome = body(element)
        if not isinstance(outcome, celtypes.BoolType):
            return outcome if isinstance(outcome, CELEvalError) else _not_bool(outcome, tree)
        count += bool(outcome)
    return celtypes.BoolType(count == 1)


def _map(elements: Iterator[Any], body: Callable[[Any], Result], tree: lark.Tree) -> Result:
    results = []
    for element in elements:
        outcome = body(element)
        if isinstance(outcome, CELEvalError):
            return outcome
        results.append(outcome)
    return celtypes.ListType(results)


def _filter(elements: Iterator[Any], body: Callable[[Any], Result], tree: lark.Tree) -> Result:
    kept = []
    for element in elements:
        outcome = body(element)
        if not isinstance(outcome, celtypes.BoolType):
            return outcome if isinstance(outcome, CELEvalError) else _not_bool(outcome, tree)
        if outcome:
            kept.append(element)
    return celtypes.ListType(kept)


_MACROS: dict[str, Callable[[Iterator[Any], Callable[[Any], Result], lark.Tree], Result]] = {
    "all": _quantifier(decisive=False),
    "exists": _quantifier(decisive=True),
    "exists_one": _exists_one,
    "map": _map,
    "filter": _filter,
}
