"""Running a repo's test suite in a child python, and telling what the first failures were.

`run_suite` runs `probe` in a subprocess (a time limit and a memory cap: a mutant
may loop or allocate forever); `probe` runs the suite with `clawloop.envs.testrun`
and re-runs the first failing tests with their asserts recorded, so the task
maker can write a bug report from values the buggy code really gave.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import operator
import os
import resource
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any

from clawloop.envs import testrun
from clawloop.envs.swe.repos import test_files

SUITE_TIMEOUT_S = 10.0
SUITE_MEMORY_MB = 1024
DETAILED_FAILURES = 3
"""Failing tests the probe explains (the statement uses the first)."""


# ---- running a suite (in a subprocess) ---------------------------------------------------------

def _limit_child(timeout_s: float) -> None:
    """A mutant may allocate without end, or loop forever after this process died and cannot kill it."""
    resource.setrlimit(resource.RLIMIT_AS, (SUITE_MEMORY_MB << 20, SUITE_MEMORY_MB << 20))
    cpu = int(timeout_s) + 5
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))


def run_suite(root: Path, timeout_s: float = SUITE_TIMEOUT_S) -> dict[str, Any] | None:
    """The repo's tests run by `probe` in a child python: {"tests": {id: result}, "details": [...]};
    None when the suite did not finish (timeout, crash)."""
    root = root.resolve()
    out = root / ".clawloop-probe.json"
    out.unlink(missing_ok=True)
    code = "import sys; from clawloop.envs.swe.suite import probe; probe(sys.argv[1], sys.argv[2:])"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[3])}  # src/
    try:
        subprocess.run([sys.executable, "-c", code, str(out), *test_files(root)], cwd=str(root), env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s,
                       preexec_fn=lambda: _limit_child(timeout_s))
        return json.loads(out.read_text(encoding="utf-8"))
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return None
    finally:
        out.unlink(missing_ok=True)


_LAST: dict[str, Any] = {}
"""What the last rewritten assert saw (the probe's child process only)."""


def _short(value: Any, limit: int = 300) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + "..."


def _cmp(left: Any, right: Any, op: str, first: int, last: int) -> bool:
    fn = {"Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
          "GtE": operator.ge, "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
          "Is": operator.is_, "IsNot": operator.is_not}[op]
    ok = bool(fn(left, right))
    _LAST.clear()
    _LAST.update(kind="compare", lines=(first, last), op=op, actual=_short(left), expected=_short(right), ok=ok)
    return ok


def _truth(value: Any, wanted: bool, first: int, last: int, args: list[Any] | None = None) -> bool:
    ok = bool(value) == wanted
    _LAST.clear()
    _LAST.update(kind="truth", lines=(first, last), actual=_short(value), wanted=wanted, ok=ok,
                 args=[_short(a) for a in args or []])
    return ok


def _checked_call(first: int, last: int, fn: Any, *args: Any, **kwargs: Any) -> bool:
    return _truth(fn(*args, **kwargs), True, first, last, list(args))


class _RecordAsserts(ast.NodeTransformer):
    """`assert a == b` -> `assert __clawloop__._cmp(a, b, "Eq", ...)` and the like: the values the failing
    check saw, each operand evaluated once and in the original's order."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        t = node.test
        lines = [ast.Constant(node.lineno), ast.Constant(node.end_lineno)]

        def helper(name: str, args: list[ast.expr], keywords: list[ast.keyword] | None = None) -> ast.Call:
            return ast.Call(ast.Attribute(ast.Name("__clawloop__", ast.Load()), name, ast.Load()), args,
                            keywords or [])

        if isinstance(t, ast.Compare) and len(t.ops) == 1:
            call = helper("_cmp", [t.left, t.comparators[0], ast.Constant(type(t.ops[0]).__name__), *lines])
        elif isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            call = helper("_truth", [t.operand, ast.Constant(False), *lines])
        elif isinstance(t, ast.Call) and not any(isinstance(a, ast.Starred) for a in t.args):
            call = helper("_checked_call", [*lines, t.func, *t.args], t.keywords)
        else:
            call = helper("_truth", [t, ast.Constant(True), *lines])
        return ast.copy_location(ast.Assert(test=call, msg=node.msg), node)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _call_names(node: ast.AST) -> list[str]:
    """Names of the functions and methods called, outermost first."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name):
                out.append(n.func.id)
            elif isinstance(n.func, ast.Attribute):
                out.append(n.func.attr)
    return out


def _returns(stmts: list[ast.stmt]) -> bool:
    """Whether the statements `return` (outside functions they define)."""
    todo: list[ast.AST] = list(stmts)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo += list(ast.iter_child_nodes(node))
    return False


def _snippet(tree: ast.Module, source: str, fdef: ast.FunctionDef, upto: int) -> str:
    """The test as a script: the imports and module-level helpers it uses, then its body up to
    statement `upto` (dedented, comments kept); a body that returns stays a function, called."""
    lines = source.splitlines()
    body = fdef.body
    end = body[upto].end_lineno or body[upto].lineno
    if _returns(body[:upto + 1]):
        code = "\n" + textwrap.dedent("\n".join(lines[fdef.lineno - 1:end])) + f"\n\n\n{fdef.name}()"
    else:
        code = textwrap.dedent("\n".join(lines[body[0].lineno - 1:end]))
    used = set().union(*(_names(s) for s in body[:upto + 1]))
    defs = _module_defs(tree)
    wanted: list[ast.stmt] = []
    todo = sorted(used & set(defs))
    while todo:
        s = defs[todo.pop()]
        if s not in wanted and s is not fdef:
            wanted.append(s)
            todo += sorted(_names(s) & set(defs))
            used |= _names(s)
    head = []
    for s in tree.body:
        if isinstance(s, ast.ImportFrom):
            names = [a for a in s.names if (a.asname or a.name) in used]
            if names:
                head.append(f"from {s.module} import " + ", ".join(
                    a.name if not a.asname else f"{a.name} as {a.asname}" for a in names))
        elif isinstance(s, ast.Import):
            head += [f"import {a.name}" for a in s.names if (a.asname or a.name).split(".")[0] in used]
    helpers = [ast.get_source_segment(source, s) or "" for s in tree.body if s in wanted]
    return ("\n".join(head) + ("\n\n" if head else "") + "".join(h + "\n\n" for h in helpers) + code).strip("\n")


def _module_defs(tree: ast.Module) -> dict[str, ast.stmt]:
    """Module-level functions, classes and assigned names of a test file."""
    defs: dict[str, ast.stmt] = {}
    for s in tree.body:
        if isinstance(s, (ast.FunctionDef, ast.ClassDef)):
            defs[s.name] = s
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    defs[t.id] = s
    return defs


def _explain(test_id: str, root: Path) -> dict[str, Any] | None:
    """Re-run one failing test with its asserts recorded: what failed, with which values, in which of the
    repo's functions, and a snippet to reproduce it. None when it cannot be told."""
    parts = test_id.split("::")
    if len(parts) != 2 or parts[1].startswith("<"):
        return None
    rel, name = parts
    path = (root / rel).resolve()
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    fdef = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fdef is None:
        return None
    module: dict[str, Any] = {"__name__": f"_clawloop_explain_{name}", "__file__": str(path),
                              "__clawloop__": sys.modules[__name__]}
    exec(compile(ast.fix_missing_locations(_RecordAsserts().visit(ast.parse(source, str(path)))), str(path), "exec"),
         module)
    fn = module[name]
    _LAST.clear()
    try:
        testrun._call(fn)
        return None  # passed this time: nothing to explain
    except BaseException as e:  # noqa: BLE001 - whatever the test raised is what we describe
        error = e
    tbs = []
    tb = error.__traceback__
    while tb is not None:
        tbs.append(tb)
        tb = tb.tb_next
    at = [k for k, t in enumerate(tbs) if t.tb_frame.f_code is fn.__code__]
    if not at:
        return None
    k_test = at[-1]
    test_line = tbs[k_test].tb_lineno
    test_locals = tbs[k_test].tb_frame.f_locals

    def in_repo(t: Any) -> bool:
        return Path(t.tb_frame.f_code.co_filename).resolve().is_relative_to(root.resolve())

    def in_tests(t: Any) -> bool:
        return Path(t.tb_frame.f_code.co_filename).resolve().is_relative_to((root / "tests").resolve())

    lib = [t for t in tbs[k_test + 1:] if in_repo(t) and not in_tests(t)]
    body = fdef.body
    upto = next((k for k, s in enumerate(body) if s.lineno <= test_line <= (s.end_lineno or s.lineno)), len(body) - 1)
    failing = min((s for s in ast.walk(fdef) if isinstance(s, ast.stmt) and s is not fdef
                   and s.lineno <= test_line <= (s.end_lineno or s.lineno)),
                  key=lambda s: (s.end_lineno or s.lineno) - s.lineno, default=body[upto])
    loop_vars = {}
    for node in ast.walk(fdef):
        if isinstance(node, ast.For) and node.lineno <= test_line <= (node.end_lineno or node.lineno):
            for v in sorted(_names(node.target)):
                if v in test_locals:
                    loop_vars[v] = _short(test_locals[v], 80)
    # Candidates for "what misbehaves": the calls of the failing check, then of the statements before it
    # (helpers of the test file looked into).
    defs = _module_defs(tree)
    calls: list[str] = []
    if isinstance(failing, ast.Assert) and isinstance(failing.test, ast.Compare):
        calls += _call_names(failing.test.left)
    for s in [failing, body[upto]] + list(reversed(body[:upto])):
        for c in _call_names(s):
            calls.append(c)
            if isinstance(defs.get(c), ast.FunctionDef):
                calls += _call_names(defs[c])
    out: dict[str, Any] = {"test": test_id, "snippet": _snippet(tree, source, fdef, upto), "loop_vars": loop_vars,
                           "function": lib[0].tb_frame.f_code.co_qualname if lib else "", "calls": calls,
                           "statement": (ast.get_source_segment(source, failing) or "").strip()}
    rec = dict(_LAST)
    raised_here = k_test == len(tbs) - 1  # the test's own check failed, not something it called
    if isinstance(error, AssertionError) and raised_here and rec and not rec["ok"] \
            and rec["lines"][0] <= test_line <= rec["lines"][1] and isinstance(failing, ast.Assert):
        test = failing.test
        if rec["kind"] == "compare" and isinstance(test, ast.Compare):
            out.update(kind="compare", expr=ast.get_source_segment(source, test.left) or "", op=rec["op"],
                       actual=rec["actual"], expected=rec["expected"])
        else:
            target = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else test
            out.update(kind="truth", expr=ast.get_source_segment(source, target) or "", actual=rec["actual"],
                       wanted=rec["wanted"])
            if isinstance(target, ast.Call) and rec.get("args"):
                out["args"] = [[ast.get_source_segment(source, a) or "", v] for a, v in zip(target.args, rec["args"])]
    elif isinstance(error, AssertionError) and not lib:
        out.update(kind="message", message=str(error))
    else:
        # The test's side of the traceback only: the library's frames would point at the bug.
        text = ["Traceback (most recent call last):"]
        for t, f in zip(tbs[k_test:], traceback.extract_tb(error.__traceback__)[k_test:]):
            if not in_tests(t):
                break
            text.append(f'  File "{os.path.relpath(f.filename, root)}", line {f.lineno}, in {f.name}')
            if f.line:
                text.append(f"    {f.line.strip()}")
        if lib:
            text.append("  ...")
        text.append(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        out.update(kind="error", exception=type(error).__name__, message=str(error), traceback="\n".join(text))
    return out


def probe(out_path: str, files: list[str]) -> None:
    """In the child: run the suite with testrun, explain the first failures, write JSON to `out_path`."""
    root = Path.cwd()
    results: dict[str, str] = {}
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        for f in files:
            results.update(testrun.run_file(f))
        details = []
        for tid, r in results.items():
            if r != "passed" and len(details) < DETAILED_FAILURES:
                try:
                    d = _explain(tid, root)
                except Exception:  # noqa: BLE001 - no explanation is not a reason to lose the result
                    d = None
                if d is not None:
                    details.append(d)
    Path(out_path).write_text(json.dumps({"tests": results, "details": details}), encoding="utf-8")

