"""Evaluates what the tests check in infra/*.bicep (app setting names, DNS records, rules),
on the syntax tree of pycep's own grammar: the parser checkov uses.

No Bicep CLI runs here (it cannot be downloaded on these machines), so the templates are read
with pycep's Lark grammar. Its tree is used rather than pycep's JSON because the JSON writes
an identifier and a string literal the same way. The grammar has no operator precedence:
``a.b == 'x'`` comes out as ``a.(b == 'x')`` and ``a == b && c`` as ``a == (b && c)``. This
evaluator refuses such shapes (``Unsupported``: write the operand in parentheses) instead of
computing a wrong answer, and refuses any syntax or function it does not know. Values only
Azure knows at deployment (resource ids, keys, ``uniqueString``) are ``Unknown``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from lark import Lark, Token, Tree
from pycep import BicepParser


@cache
def pycep() -> BicepParser:
    """pycep's parser, one per process: building its Lark parser takes 0.3 s of CPU."""
    return BicepParser()


def parser() -> Lark:
    """pycep's Lark parser (its grammar, LALR, positions kept)."""
    return pycep().lark_parser


@cache
def _parse(text: str) -> Tree:
    return parser().parse(text)


class Unsupported(Exception):
    """Syntax this evaluator does not handle, or a tree pycep may have grouped wrongly."""


@dataclass(frozen=True)
class Unknown:
    """A value known only in Azure, at deployment."""

    what: str


# Bicep's precedence, loosest first; operators of one level associate to the left.
PRECEDENCE = {
    "coalesce": 1, "or_op": 2, "and_op": 3, "equals": 4, "not_equals": 4,
    "equals_case_insens": 4, "not_equals_case_insens": 4, "greater_than": 5,
    "greater_than_or_equals": 5, "less_than": 5, "less_than_or_equals": 5, "add": 6,
    "substract": 6, "multiply": 7, "divide": 7, "modulo": 7,
}  # fmt: skip
ASSOCIATIVE = {"or_op", "and_op"}


def operator_name(node: Any) -> str | None:
    if isinstance(node, Tree) and node.data == "operator":
        return str(node.children[0].data)
    return None


@dataclass
class Template:
    """One .bicep file's declarations, unevaluated."""

    path: Path
    params: dict[str, Tree]
    variables: dict[str, Any]
    resources: dict[str, Tree]
    modules: dict[str, Tree]
    outputs: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Template:
        tree = _parse(path.read_text(encoding="utf-8"))
        found: dict[str, dict[str, Any]] = {
            "param": {}, "var": {}, "resource": {}, "module": {}, "output": {},
        }  # fmt: skip
        for element in tree.children:
            if isinstance(element, Tree) and element.data in found:
                found[str(element.data)][str(element.children[1])] = element
        return cls(path, found["param"], found["var"], found["resource"], found["module"],
                   found["output"])  # fmt: skip

    def instance(self, params: Mapping[str, Any]) -> Instance:
        return Instance(self, dict(params))


def allowed_values(param: Tree) -> list[Any] | None:
    decorator = param.children[0]
    if decorator is None:
        return None
    for item in decorator.children:
        if item.data == "deco_allowed":
            return [literal(node) for node in item.children[0].children]
    return None


def literal(node: Any) -> Any:
    """A constant (the values of ``@allowed``)."""
    return Instance(Template(Path("<literal>"), {}, {}, {}, {}, {}), {}).eval(node, {})


class Instance:
    """A template with its parameters: evaluates its variables, resources, modules, outputs."""

    def __init__(self, template: Template, params: dict[str, Any]) -> None:
        unknown = set(params) - set(template.params)
        if unknown:
            raise Unsupported(f"{template.path}: no parameter {sorted(unknown)}")
        self.template = template
        self.given = params
        self._values: dict[str, Any] = {}
        self._busy: set[str] = set()

    # ------------------------------------------------------------------ declarations

    def param(self, name: str) -> Any:
        node = self.template.params[name]
        if name in self.given:
            value = self.given[name]
        elif node.children[3] is not None:
            value = self._cached(f"param {name}", lambda: self.eval(node.children[3], {}))
        else:
            raise Unsupported(f"{self.template.path}: parameter {name!r} has no value")
        allowed = allowed_values(node)
        if allowed is not None and not isinstance(value, Unknown) and value not in allowed:
            raise Unsupported(f"{self.template.path}: {name}={value!r} is not one of {allowed}")
        return value

    def var(self, name: str) -> Any:
        node = self.template.variables[name]
        return self._cached(f"var {name}", lambda: self.eval(node.children[2], {}))

    def resource(self, name: str) -> list[dict[str, Any]]:
        """The bodies of a resource declaration: one, one per loop item, or none."""
        return self._declared(self.template.resources[name].children[4])

    def module(self, name: str) -> list[Instance]:
        """The module's template with the parameters this one passes (none: not deployed)."""
        element = self.template.modules[name]
        path = self.template.path.parent / self.eval(element.children[2], {}, raw=True)
        return [
            Template.load(path).instance(body.get("params", {}))
            for body in self._declared(element.children[3], keep={"params"})
        ]

    def output(self, name: str) -> Any:
        return self.eval(self.template.outputs[name].children[3], {})

    def _declared(self, node: Tree, keep: set[str] | None = None) -> list[dict[str, Any]]:
        if node.data == "deploy_condition":
            condition = self.eval(node.children[0], {})
            if isinstance(condition, Unknown):
                raise Unsupported(f"{self.template.path}: condition {condition.what}")
            return [self.eval(node.children[1], {})] if condition else []
        if node.data == "loop":
            return list(self._loop(node, {}))
        return [self.eval(node, {})]

    def _cached(self, key: str, compute: Any) -> Any:
        if key not in self._values:
            if key in self._busy:
                raise Unsupported(f"{self.template.path}: {key} refers to itself")
            self._busy.add(key)
            try:
                self._values[key] = compute()
            finally:
                self._busy.discard(key)
        return self._values[key]

    # ------------------------------------------------------------------ expressions

    def eval(self, node: Any, env: dict[str, Any], raw: bool = False) -> Any:
        if node is None:
            return None
        if isinstance(node, Token):
            if node.type == "QUOTED_INTERPOLATION" or raw:
                return self.string(str(node), env)
            return self.name(str(node), env)
        kind = str(node.data)
        if kind in ("string", "module_path", "type_api_pair", "data_type"):
            return self.eval(node.children[0], env, raw=raw or kind != "string")
        if kind == "int":
            return int(node.children[0])
        if kind in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[kind]
        if kind == "multi_line_string":
            return "".join(str(c) for c in node.children)[3:-3]
        if kind == "array":
            return [self.eval(child, env) for child in node.children]
        if kind == "object":
            found: dict[str, Any] = {}
            for pair in node.children:
                if pair.data != "pair":
                    raise Unsupported(f"{self.template.path}: nested resource declarations")
                key = str(pair.children[0].children[0])
                key = self.string(key, {}) if key.startswith("'") else key
                found[key] = self.eval(pair.children[1], env)
            return found
        if kind == "loop":
            return list(self._loop(node, env))
        if kind == "operator":
            return self.operator(node.children[0], env)
        if kind == "function":
            return self.function(node.children[0], env)
        raise Unsupported(f"{self.template.path}: {kind} at line {node.meta.line}")

    def name(self, name: str, env: dict[str, Any]) -> Any:
        if name in env:
            return env[name]
        declared = self.template
        if name in declared.params:
            return self.param(name)
        if name in declared.variables:
            return self.var(name)
        if name in declared.resources:
            return ResourceRef(self, name)
        if name in declared.modules:
            return ModuleRef(self, name)
        raise Unsupported(f"{self.template.path}: unknown name {name!r}")

    def string(self, text: str, env: dict[str, Any]) -> Any:
        """A quoted string: escapes, and ``${expression}`` parts evaluated."""
        body = text[1:-1] if text.startswith("'") else text
        parts: list[Any] = []
        index = 0
        while index < len(body):
            char = body[index]
            if char == "\\" and index + 1 < len(body):
                escaped = body[index + 1]
                parts.append({"n": "\n", "r": "\r", "t": "\t"}.get(escaped, escaped))
                index += 2
            elif body.startswith("${", index):
                end = _closing_brace(body, index + 2)
                parts.append(self.expression(body[index + 2 : end], env))
                index = end + 1
            else:
                parts.append(char)
                index += 1
        unknown = [p for p in parts if isinstance(p, Unknown)]
        if unknown:
            return Unknown(f"a string with {unknown[0].what}")
        return "".join(_text(p) for p in parts)

    def expression(self, text: str, env: dict[str, Any]) -> Any:
        tree = _parse(f"var interpolated = {text}\n")
        return self.eval(tree.children[0].children[2], env)

    def _loop(self, node: Tree, env: dict[str, Any]) -> Iterator[Any]:
        head, condition, body = node.children
        kind = str(head.data)
        names = [str(c) for c in head.children[:-1]]
        source = self.eval(head.children[-1], env)
        if isinstance(source, Unknown):
            raise Unsupported(f"{self.template.path}: a loop over {source.what}")
        if kind == "loop_array":
            items = [{names[0]: item} for item in source]
        elif kind == "loop_array_index":
            items = [{names[0]: item, names[1]: i} for i, item in enumerate(source)]
        elif kind == "loop_object":
            items = [{names[0]: {"key": k, "value": source[k]}} for k in sorted(source)]
        else:
            raise Unsupported(f"{self.template.path}: {kind}")
        for bound in items:
            scope = {**env, **bound}
            if condition is not None and not self.eval(condition, scope):
                continue
            yield self.eval(body, scope)

    def operator(self, node: Tree, env: dict[str, Any]) -> Any:
        kind = str(node.data)
        children = node.children
        if kind in PRECEDENCE:
            right = operator_name(children[1])
            if right is not None and (
                right == "conditional"
                or (right in PRECEDENCE and PRECEDENCE[right] < PRECEDENCE[kind])
                or (right in PRECEDENCE and PRECEDENCE[right] == PRECEDENCE[kind]
                    and not (right == kind and kind in ASSOCIATIVE))
            ):  # fmt: skip
                raise Unsupported(
                    f"{self.template.path}:{node.meta.line}: '{kind}' with a '{right}' on its "
                    "right: pycep may have grouped it wrongly; write the operands in parentheses"
                )
            left = self.eval(children[0], env)
            if (kind, left) in (("and_op", False), ("or_op", True)):
                return left
            return _binary(kind, left, self.eval(children[1], env))
        if kind == "not_op":
            inner = operator_name(children[0])
            if inner in PRECEDENCE or inner == "conditional":
                raise Unsupported(
                    f"{self.template.path}:{node.meta.line}: '!' before '{inner}': pycep may have "
                    "grouped it wrongly; write the operand in parentheses"
                )
            value = self.eval(children[0], env)
            return value if isinstance(value, Unknown) else not value
        if kind == "conditional":
            condition = self.eval(children[0], env)
            if isinstance(condition, Unknown):
                return Unknown(f"a choice on {condition.what}")
            return self.eval(children[1] if condition else children[2], env)
        if kind == "property_accessor":
            value = self.eval(children[0], env)
            for step in self.path(children[1], env):
                value = _get(value, step)
            return value
        if kind == "index_accessor":
            return _get(self.eval(children[0], env), self.eval(children[1], env))
        if kind == "function_accessor":
            return Unknown(f"{children[0]}.{children[1]}()")
        raise Unsupported(f"{self.template.path}:{node.meta.line}: operator {kind}")

    def path(self, node: Any, env: dict[str, Any]) -> list[Any]:
        """The right side of ``a.b.c[0].d``: names and indexes only."""
        if isinstance(node, Tree) and node.data == "string" and node.children[0].type == "STRING":
            return [str(node.children[0])]
        kind = operator_name(node)
        if kind == "property_accessor":
            inner = node.children[0]
            return self.path(inner.children[0], env) + self.path(inner.children[1], env)
        if kind == "index_accessor":
            inner = node.children[0]
            return [*self.path(inner.children[0], env), self.eval(inner.children[1], env)]
        line = getattr(getattr(node, "meta", None), "line", "?")
        raise Unsupported(
            f"{self.template.path}:{line}: a property read followed by '{kind}': pycep groups it "
            "as a.(b ...); write the property read in parentheses"
        )

    def function(self, node: Tree, env: dict[str, Any]) -> Any:
        kind = str(node.data)
        args = node.children
        if kind in RUNTIME_FUNCTIONS:
            return Unknown(f"{kind}(...)")
        if kind == "filter":
            array = self.eval(args[0], env)
            if isinstance(array, Unknown):
                return array
            name = str(args[1])
            return [x for x in array if _truth(self.eval(args[2], {**env, name: x}))]
        values = [self.eval(arg, env) for arg in args if arg is not None]
        if any(isinstance(v, Unknown) for v in values):
            return Unknown(f"{kind} of a deployment-time value")
        if kind == "concat":
            if all(isinstance(v, list) for v in values):
                return [item for v in values for item in v]
            return "".join(_text(v) for v in values)
        if kind == "contains":
            container, item = values
            return item in container
        if kind == "empty":
            return not values[0]
        if kind == "length":
            return len(values[0])
        if kind == "replace":
            return values[0].replace(values[1], values[2])
        if kind == "take":
            return values[0][: values[1]]
        if kind == "to_lower":
            return values[0].lower()
        if kind == "union":
            if all(isinstance(v, dict) for v in values):
                merged: dict[str, Any] = {}
                for v in values:
                    merged.update(v)
                return merged
            return list(dict.fromkeys(item for v in values for item in v))
        raise Unsupported(f"{self.template.path}:{node.meta.line}: function {kind}")


RUNTIME_FUNCTIONS = {
    "unique_string", "resource_group", "subscription", "environment", "list_func",
    "resource_id", "subscription_resource_id", "guid", "reference", "utc_now", "new_guid",
    "deployment", "tenant",
}  # fmt: skip


@dataclass
class ResourceRef:
    """A resource symbol: its ``name`` is known before deployment, the rest is not."""

    instance: Instance
    symbol: str

    def get(self, key: Any) -> Any:
        if key == "name":
            bodies = self.instance.resource(self.symbol)
            if len(bodies) == 1:
                return bodies[0].get("name")
        return Unknown(f"{self.symbol}.{key}")


@dataclass
class ModuleRef:
    """A module symbol: ``outputs`` are evaluated in the module's template."""

    instance: Instance
    symbol: str

    def get(self, key: Any) -> Any:
        if key == "outputs":
            modules = self.instance.module(self.symbol)
            if len(modules) == 1:
                return _Outputs(modules[0])
        return Unknown(f"{self.symbol}.{key}")


@dataclass
class _Outputs:
    module: Instance

    def get(self, key: Any) -> Any:
        return self.module.output(key)


def _get(value: Any, key: Any) -> Any:
    if isinstance(value, Unknown):
        return Unknown(f"{value.what}.{key}")
    if isinstance(key, Unknown):
        return Unknown(f"an index {key.what}")
    if isinstance(value, ResourceRef | ModuleRef | _Outputs):
        return value.get(key)
    if isinstance(value, dict):
        if key not in value:
            raise Unsupported(f"no property {key!r} in {sorted(value)}")
        return value[key]
    if isinstance(value, list) and isinstance(key, int):
        return value[key]
    raise Unsupported(f"cannot read {key!r} of {type(value).__name__}")


def _binary(kind: str, left: Any, right: Any) -> Any:
    if isinstance(left, Unknown) or isinstance(right, Unknown):
        return Unknown(f"{kind} of a deployment-time value")
    if kind == "and_op":
        return _truth(left) and _truth(right)
    if kind == "or_op":
        return _truth(left) or _truth(right)
    if kind == "equals":
        return left == right
    if kind == "not_equals":
        return left != right
    if kind == "add":
        return left + right
    raise Unsupported(f"operator {kind}")


def _truth(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Unsupported(f"a condition that is not a bool: {value!r}")
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _closing_brace(text: str, start: int) -> int:
    """Index of the ``}`` closing an interpolation whose body starts at ``start``."""
    depth, index, quoted = 0, start, False
    while index < len(text):
        char = text[index]
        if quoted:
            if char == "\\":
                index += 1
            elif char == "'":
                quoted = False
        elif char == "'":
            quoted = True
        elif char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return index
            depth -= 1
        index += 1
    raise Unsupported(f"unclosed interpolation in {text!r}")
