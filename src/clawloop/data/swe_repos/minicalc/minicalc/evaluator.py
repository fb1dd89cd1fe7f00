"""Evaluating parsed expressions."""

import math

from minicalc.errors import CalcError
from minicalc.parser import parse


def _sqrt(x):
    if x < 0:
        raise CalcError(f"sqrt of a negative number ({x})")
    return math.sqrt(x)


def _round(x, digits=0):
    return round(x, int(digits))


FUNCTIONS = {"abs": (abs, 1, 1), "sqrt": (_sqrt, 1, 1), "round": (_round, 1, 2), "min": (min, 1, None),
             "max": (max, 1, None)}
"""name: (function, fewest arguments, most arguments or None)."""
CONSTANTS = {"pi": math.pi, "e": math.e}


def _binary(op, a, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op in ("/", "//", "%") and b == 0:
        raise CalcError("division by zero")
    if op == "/":
        return a / b
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    if op == "^":
        if a == 0 and b < 0:
            raise CalcError("zero to a negative power")
        return a ** b
    raise CalcError(f"unknown operator {op!r}")


def evaluate(node, variables):
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        name = node[1]
        if name in variables:
            return variables[name]
        if name in CONSTANTS:
            return CONSTANTS[name]
        raise CalcError(f"unknown name {name!r}")
    if kind == "neg":
        return -evaluate(node[1], variables)
    if kind == "bin":
        return _binary(node[1], evaluate(node[2], variables), evaluate(node[3], variables))
    if kind == "call":
        name, args = node[1], node[2]
        if name not in FUNCTIONS:
            raise CalcError(f"unknown function {name!r}")
        fn, least, most = FUNCTIONS[name]
        if len(args) < least or (most is not None and len(args) > most):
            raise CalcError(f"{name}() takes {least}{'' if most == least else '+'} argument(s), got {len(args)}")
        return fn(*[evaluate(a, variables) for a in args])
    if kind == "assign":
        value = evaluate(node[2], variables)
        variables[node[1]] = value
        return value
    if kind == "seq":
        result = None
        for statement in node[1]:
            result = evaluate(statement, variables)
        return result
    raise CalcError(f"unknown node {kind!r}")


def calc(text, **variables):
    """The value of `text`; keyword arguments are variables (assignments do not change the caller's)."""
    return evaluate(parse(text), dict(variables))
