"""The bugs the SWE track's task maker injects: every mutation site of a package's source, from its AST.

A comparison flipped, an arithmetic operator swapped, an integer off by one,
`and`/`or` swapped, a `not` dropped or added, a unary minus dropped,
`True`/`False` flipped, `min`/`max` swapped, the first two arguments of a call
swapped; each a small textual edit at the node's position (see
`clawloop.envs.swe.tasks` for how mutants are tried and kept).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from clawloop.envs.swe.repos import source_files

# ---- mutations ---------------------------------------------------------------------------------

_COMPARE_SWAP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
                 ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
                 ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
_COMPARE_RE = {ast.Lt: r"<(?![<=])", ast.LtE: r"<=", ast.Gt: r">(?![>=])", ast.GtE: r">=", ast.Eq: r"==",
               ast.NotEq: r"!=", ast.In: r"(?<![\w])in(?![\w])", ast.NotIn: r"(?<![\w])not\s+in(?![\w])",
               ast.Is: r"(?<![\w])is(?![\w])", ast.IsNot: r"(?<![\w])is\s+not(?![\w])"}
_BINOP_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
               ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"), ast.Pow: ("**", "*")}
_BINOP_RE = {ast.Add: r"\+", ast.Sub: r"-", ast.Mult: r"\*(?!\*)", ast.Div: r"(?<!/)/(?!/)", ast.FloorDiv: r"//",
             ast.Mod: r"%", ast.Pow: r"\*\*"}

_NO_SWAP = {"isinstance", "issubclass", "getattr", "hasattr", "setattr", "super"}
"""Calls whose arguments swapped only make a TypeError, not a bug worth a task."""


@dataclass
class Mutation:
    path: str
    line: int
    kind: str
    function: str
    edits: list[tuple[int, int, str]]
    """(start, end, replacement) byte spans of the file, not overlapping."""

    def apply(self, source: bytes) -> bytes:
        out = source
        for start, end, new in sorted(self.edits, reverse=True):
            out = out[:start] + new.encode() + out[end:]
        return out


class _Sites(ast.NodeVisitor):
    """Every mutation of one module, in source order."""

    def __init__(self, path: str, source: bytes):
        self.path = path
        self.source = source
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.scope: list[str] = []
        self.found: list[Mutation] = []

    def pos(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.pos(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.pos(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def text(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.source[a:b].decode()

    def add(self, node: ast.AST, kind: str, edits: list[tuple[int, int, str]]) -> None:
        line = node.lineno  # type: ignore[attr-defined]
        self.found.append(Mutation(self.path, line, kind, ".".join(self.scope), edits))

    def between(self, left: ast.AST, right: ast.AST, pattern: str, new: str, node: ast.AST, kind: str) -> None:
        """Replace the one operator token matching `pattern` between two operands."""
        a = self.pos(left.end_lineno, left.end_col_offset)  # type: ignore[attr-defined]
        b = self.pos(right.lineno, right.col_offset)  # type: ignore[attr-defined]
        gap = self.source[a:b].decode()
        hits = list(re.finditer(pattern, gap))
        if len(hits) == 1 and "#" not in gap:
            m = hits[0]
            self.add(node, kind, [(a + len(gap[:m.start()].encode()), a + len(gap[:m.end()].encode()), new)])

    # -- scopes and what not to touch --

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(d)
        for stmt in node.body:
            self.visit(stmt)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for stmt in node.body:
            self.visit(stmt)
        self.scope.pop()

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """f-strings hold no logic worth breaking (and their inner positions are unreliable before 3.12)."""

    def visit_Raise(self, node: ast.Raise) -> None:
        """Error messages are not behaviour."""

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):  # docstrings
            self.generic_visit(node)

    # -- the mutations --

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left] + node.comparators
        for k, op in enumerate(node.ops):
            _, new = _COMPARE_SWAP[type(op)]
            self.between(operands[k], operands[k + 1], _COMPARE_RE[type(op)], new, node, "compare")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        stringy = any(isinstance(x, ast.JoinedStr) or (isinstance(x, ast.Constant) and isinstance(x.value, str))
                      for x in (node.left, node.right))
        if type(node.op) in _BINOP_SWAP and not stringy:
            _, new = _BINOP_SWAP[type(node.op)]
            self.between(node.left, node.right, _BINOP_RE[type(node.op)], new, node, "arithmetic")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if type(node.op) in (ast.Add, ast.Sub):
            old, new = _BINOP_SWAP[type(node.op)]
            self.between(node.target, node.value, re.escape(old) + "=", new + "=", node, "arithmetic")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        self.between(node.values[0], node.values[1], rf"(?<![\w]){old}(?![\w])", new, node, "boolean")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            a, _ = self.span(node)
            self.add(node, "negation", [(a, self.span(node.operand)[0], "")])
        elif isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            a, _ = self.span(node)
            self.add(node, "sign", [(a, self.span(node.operand)[0], "")])
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if not isinstance(node.test, ast.UnaryOp) or not isinstance(node.test.op, ast.Not):
            a, b = self.span(node.test)
            self.add(node.test, "negation", [(a, a, "not ("), (b, b, ")")])
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        v = node.value
        a, b = self.span(node)
        if isinstance(v, bool):
            self.add(node, "constant", [(a, b, repr(not v))])
        elif isinstance(v, int):
            for new in (v + 1, v - 1):
                if new >= 0:
                    self.add(node, "off-by-one", [(a, b, repr(new))])

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            a, b = self.span(node.func)
            self.add(node, "min/max", [(a, b, "max" if node.func.id == "min" else "min")])
        args = node.args
        typed = isinstance(node.func, ast.Name) and node.func.id in _NO_SWAP
        if len(args) >= 2 and not typed and not any(isinstance(x, ast.Starred) for x in args[:2]):
            first, second = self.text(args[0]), self.text(args[1])
            if first != second:
                (a0, b0), (a1, b1) = self.span(args[0]), self.span(args[1])
                self.add(node, "arguments", [(a0, b0, second), (a1, b1, first)])
        self.generic_visit(node)


def mutations(root: Path) -> list[Mutation]:
    """Every mutation of the repo's source that parses and changes its AST, in a stable order."""
    out = []
    for rel in source_files(root):
        source = (root / rel).read_bytes()
        tree = ast.parse(source, rel)
        sites = _Sites(rel, source)
        sites.visit(tree)
        original = ast.dump(tree)
        for m in sites.found:
            try:
                changed = ast.dump(ast.parse(m.apply(source), rel)) != original
            except SyntaxError:
                continue
            if changed:
                out.append(m)
    return out

