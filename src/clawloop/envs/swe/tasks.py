"""Make the SWE track's tasks: inject bugs into small repos, keep those the tests catch, write SWE-bench instances.

    clawloop swe make-tasks [--repos DIR] [--out FILE] [--max-per-repo N] [--seed S] [--jobs J]

A repo is a folder holding a pure-Python package and `tests/test_*.py` (plain
`test_*` functions that `clawloop.envs.testrun` runs); the shipped ones are in
`clawloop/data/swe_repos/`, their instances in `clawloop/data/swe_instances.jsonl`.

For each repo: every mutation site of the package's source (not the tests) is
listed from its AST — a comparison flipped (`<` to `<=`, `==` to `!=`, `in` to
`not in`), `+`/`-` and the other arithmetic operators swapped, an integer off
by one, `and`/`or` swapped, a `not` dropped or added, a unary minus dropped,
`True`/`False` flipped, `min`/`max` swapped, the first two arguments of a call
swapped. Each is a small textual edit at the node's position, so the bug's diff
is one or two lines. In an order drawn from the seed (kinds taken in turn), each mutant's suite runs
in a subprocess (with a timeout and a memory cap: a mutant may loop forever);
a mutant is kept when the suite finishes and at least one test fails (an
import error of a whole test module does not count). The first `--max-per-repo`
kept become instances:

- `instance_id` `<repo>__<repo>-<n>`, `repo` `clawloop/<repo>`;
- `base_commit`: the sha of the buggy tree committed as the only commit of a
  new git repo with fixed names and dates (`build_base`), so `SWEEnv.reset`
  rebuilds the same sha from the shipped files and the bug patch (and the
  history does not show the bug going in);
- `problem_statement`: a bug report written from the first failing test —
  which function misbehaves, a snippet to reproduce it and what it gave
  against what was expected (values taken by running the buggy code) or the
  exception (its traceback cut at the test's own frames), the failing test's
  id; never the mutation;
- `FAIL_TO_PASS` / `PASS_TO_PASS` (JSON-encoded lists, as SWE-bench ships
  them), `patch` (the gold fix, a git diff), `test_patch` (empty: the tests are
  already in the repo), `hints_text`, `created_at`, `version`;
- clawloop's own: `bug_patch` (the diff that injects the bug into the pristine
  repo), `mutation` (kind, file, line), and `repo_path` when the repos are not
  the shipped ones (relative to the output file).

The same seed over the same repos gives the same file.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "data"
REPOS_DIR = DATA / "swe_repos"
INSTANCES_FILE = DATA / "swe_instances.jsonl"

GIT_DATE = "2024-01-01T00:00:00+0000"
CREATED_AT = "2024-01-01T00:00:00Z"
VERSION = "1.0"
BASE_MESSAGE = "Initial commit"
DEFAULT_MAX_PER_REPO = 40
SUITE_TIMEOUT_S = 10.0
SUITE_MEMORY_MB = 1024
DETAILED_FAILURES = 3
"""Failing tests the probe explains (the statement uses the first)."""
_SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


# ---- the repos as git repos --------------------------------------------------------------------

def git_env() -> dict[str, str]:
    """Git with no user or system config, fixed identities and dates: commits are reproducible, and the
    workspace may belong to another user (the sandbox's)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(), "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
            "GIT_AUTHOR_NAME": "clawloop", "GIT_AUTHOR_EMAIL": "swe@clawloop.invalid", "GIT_AUTHOR_DATE": GIT_DATE,
            "GIT_COMMITTER_NAME": "clawloop", "GIT_COMMITTER_EMAIL": "swe@clawloop.invalid",
            "GIT_COMMITTER_DATE": GIT_DATE}


def git(cwd: Path, *args: str, stdin: str | None = None, timeout_s: float = 120.0) -> str:
    """Run git on a repo the host made (never on one an agent touched); RuntimeError with git's message."""
    r = subprocess.run(["git", *args], cwd=str(cwd), env=git_env(), input=stdin, capture_output=True, text=True,
                       timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} in {cwd} failed: {(r.stderr or r.stdout).strip()[-1000:]}")
    return r.stdout


def repo_files(root: Path) -> list[str]:
    """The repo's files (relative, sorted): what gets committed. Caches and hidden folders are not."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for f in files:
            if not f.endswith((".pyc", ".pyo")):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def test_files(root: Path) -> list[str]:
    return [f for f in repo_files(root) if f.startswith("tests" + os.sep) and os.path.basename(f).startswith("test_")
            and f.endswith(".py")]


def source_files(root: Path) -> list[str]:
    return [f for f in repo_files(root) if f.endswith(".py") and not f.startswith("tests" + os.sep)
            and not os.path.basename(f).startswith(("test_", "conftest"))]


def copy_files(src: Path, dest: Path) -> None:
    """The repo's files into `dest`, bytes only: modes and times must not leak into the git tree."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in repo_files(src):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((src / rel).read_bytes())
        target.chmod(0o644)


def init_pristine(src: Path, dest: Path) -> str:
    """`src`'s files committed as a new git repo at `dest` (generation's scratch repo); the commit's sha."""
    copy_files(src, dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-verify", "-m", BASE_MESSAGE)
    return git(dest, "rev-parse", "HEAD").strip()


def build_base(src: Path, dest: Path, bug_patch: str) -> str:
    """The buggy tree as the only commit of a new git repo at `dest` (`src`'s files, `bug_patch` applied);
    its sha, the same every time. No parent: the history must not show the bug going in."""
    copy_files(src, dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "apply", "--whitespace=nowarn", "-", stdin=bug_patch)
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-verify", "-m", BASE_MESSAGE)
    return git(dest, "rev-parse", "HEAD").strip()


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


# ---- running a suite (in a subprocess) ---------------------------------------------------------

def _limit_child(timeout_s: float) -> None:
    """A mutant may allocate without end, or loop forever after this process died and cannot kill it."""
    resource.setrlimit(resource.RLIMIT_AS, (SUITE_MEMORY_MB << 20, SUITE_MEMORY_MB << 20))
    cpu = int(timeout_s) + 5
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))


def run_suite(root: Path, timeout_s: float = SUITE_TIMEOUT_S) -> dict[str, Any] | None:
    """The repo's tests run by `_probe` in a child python: {"tests": {id: result}, "details": [...]};
    None when the suite did not finish (timeout, crash)."""
    root = root.resolve()
    out = root / ".clawloop-probe.json"
    out.unlink(missing_ok=True)
    code = "import sys; from clawloop.envs.swe_tasks import _probe; _probe(sys.argv[1], sys.argv[2:])"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
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
    import operator

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
    import traceback

    from clawloop.envs import testrun

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


def _probe(out_path: str, files: list[str]) -> None:
    """In the child: run the suite with testrun, explain the first failures, write JSON to `out_path`."""
    import contextlib
    import io

    from clawloop.envs import testrun

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


# ---- problem statements ------------------------------------------------------------------------

_DUNDER_WORDS = {"__init__": "creating a", "__eq__": "`==` on", "__lt__": "ordering of", "__contains__": "`in` on",
                 "__getitem__": "indexing a", "__add__": "`+` on", "__sub__": "`-` on", "__matmul__": "`@` on",
                 "__len__": "`len()` of", "__iter__": "iterating over a", "__repr__": "`repr()` of"}


def public_names(root: Path) -> dict[str, str]:
    """Public functions, classes and methods of the repo's package by the name a call site shows:
    name -> qualified name (`wrap`, `Interval.overlaps`). A method name several classes share maps to
    itself; a special method only when one class has it."""
    seen: dict[str, set[str]] = {}
    for rel in source_files(root):
        tree = ast.parse((root / rel).read_bytes(), rel)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                seen.setdefault(node.name, set()).add(node.name)
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for m in node.body:
                    if isinstance(m, ast.FunctionDef) and (not m.name.startswith("_") or m.name in _DUNDER_WORDS):
                        seen.setdefault(m.name, set()).add(f"{node.name}.{m.name}")
    return {k: (next(iter(v)) if len(v) == 1 else k) for k, v in seen.items()
            if len(v) == 1 or k not in _DUNDER_WORDS}


def _subject(detail: dict[str, Any], names: dict[str, str]) -> str:
    """How the report names what misbehaves: `wrap()`, `Interval.overlaps()`, or `==` on `Matrix`."""
    quals = set(names.values())
    candidates = []
    if detail.get("function"):
        candidates.append(detail["function"])
    candidates += [names[c] for c in detail.get("calls") or [] if c in names]
    for qual in candidates:
        if qual not in quals:
            continue
        cls, _, meth = qual.rpartition(".")
        if meth in _DUNDER_WORDS:
            return f"{_DUNDER_WORDS[meth]} `{cls}`"
        return f"`{qual}()`"
    return ""


def _code(text: str, lang: str = "python") -> str:
    return f"```{lang}\n{text}\n```"


def problem_statement(repo: str, detail: dict[str, Any] | None, fail_to_pass: list[str], names: dict[str, str],
                      rng: random.Random) -> str:
    """A bug report from the first failing test's explanation (see `_explain`)."""
    if detail is None:  # nothing could be re-run: say which tests fail
        shown = ", ".join(f"`{t}`" for t in fail_to_pass[:5])
        return (f"Some behaviour of `{repo}` is broken: {shown} fail"
                f"{'s' if len(fail_to_pass) == 1 else ''}. Please find and fix the bug in the library.")
    subject = _subject(detail, names) or f"the code under test in `{detail['test']}`"
    kind = detail.get("kind")
    where = ""
    if detail.get("loop_vars"):
        where = " (for " + ", ".join(f"`{k} = {v}`" for k, v in detail["loop_vars"].items()) + ")"
    if kind == "compare":
        expr, actual, expected = detail["expr"], detail["actual"], detail["expected"]
        if detail["op"] == "Eq":
            what = rng.choice([f"`{expr}` returns `{actual}`{where}, but it should be `{expected}`.",
                               f"`{expr}` gives `{actual}`{where}; I expected `{expected}`.",
                               f"Expected `{expected}` from `{expr}`{where}, got `{actual}`."])
        else:
            what = (f"The check `{detail['statement']}` fails{where}: `{expr}` is `{actual}` "
                    f"(compared with `{expected}`).")
        title = rng.choice([f"{subject} returns a wrong result", f"Wrong result from {subject}",
                            f"{subject} gives an incorrect value"])
    elif kind == "truth":
        expr, actual = detail["expr"], detail["actual"]
        wanted = "true" if detail["wanted"] else "false"
        what = f"`{expr}` is `{actual}`{where}, but it should be {wanted}."
        if detail.get("args"):
            what += " The values involved: " + ", ".join(f"`{a}` = `{v}`" for a, v in detail["args"]) + "."
        title = rng.choice([f"{subject} returns a wrong result", f"Incorrect behaviour of {subject}"])
    elif kind == "message":
        what = f"The check fails{where}: {detail['message'].strip().rstrip('.') or 'it does not hold'}."
        raise_word = "should raise" in detail["message"]
        title = (f"{subject} does not reject invalid input" if raise_word
                 else rng.choice([f"{subject} misbehaves", f"Unexpected behaviour of {subject}"]))
    else:
        what = f"It fails{where} with:\n\n{_code(detail['traceback'], 'text')}"
        title = rng.choice([f"{subject} raises {detail['exception']}",
                            f"{detail['exception']} from {subject}"])
    title = title[0].upper() + title[1:] if title[0] != "`" else title
    intro = rng.choice([f"I ran into this while using `{repo}`:",
                        "Here is a small example:",
                        "Steps to reproduce:",
                        f"Minimal reproduction with `{repo}`:"])
    others = len(fail_to_pass) - 1
    tail = f"The test `{detail['test']}` fails because of this"
    tail += f" (and {others} other test{'s' if others != 1 else ''} fail{'' if others != 1 else 's'} too)." \
        if others else "."
    return f"{title}\n\n{intro}\n\n{_code(detail['snippet'])}\n\n{what}\n\n{tail}\n"


# ---- generation --------------------------------------------------------------------------------

@dataclass
class RepoReport:
    name: str
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    survived: int = 0
    unfinished: int = 0
    import_errors: int = 0
    seconds: float = 0.0


def _interleave(cands: list[Mutation], rng: random.Random) -> list[Mutation]:
    """The order mutants are tried in: each kind shuffled, then the kinds taken in turn, so that
    off-by-ones (the most numerous sites) do not crowd out the other kinds of bug."""
    by_kind: dict[str, list[Mutation]] = {}
    for m in cands:
        by_kind.setdefault(m.kind, []).append(m)
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    for k in kinds:
        rng.shuffle(by_kind[k])
    out = []
    while any(by_kind.values()):
        for k in kinds:
            if by_kind[k]:
                out.append(by_kind[k].pop())
    return out


def _is_repo(p: Path) -> bool:
    return p.is_dir() and (p / "tests").is_dir() and bool(test_files(p))


def make_repo_instances(root: Path, *, max_n: int, seed: int, jobs: int = 2, timeout_s: float = SUITE_TIMEOUT_S,
                        repo_path: str | None = None, log: Any = None) -> tuple[list[dict[str, Any]], RepoReport]:
    """Up to `max_n` instances from one repo (see the module docstring)."""
    name = root.name
    report = RepoReport(name)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"clawloop-swe-gen-{name}-") as tmp:
        gitrepo = Path(tmp) / "repo"
        init_pristine(root, gitrepo)
        baseline = run_suite(gitrepo, timeout_s)
        if baseline is None or not baseline["tests"] or any(r != "passed" for r in baseline["tests"].values()):
            bad = {k: v for k, v in (baseline or {}).get("tests", {}).items() if v != "passed"}
            raise RuntimeError(f"repo {name}: the pristine test suite does not pass: {bad or 'it did not finish'}")
        all_tests = list(baseline["tests"])
        names = public_names(gitrepo)
        cands = mutations(gitrepo)
        report.candidates = len(cands)
        rng = random.Random(f"{seed}:{name}")
        cands = _interleave(cands, rng)
        # One scratch copy per worker; mutants run in batches and are accepted in the shuffled order,
        # so the result does not depend on which worker finished first.
        scratch = []
        for k in range(jobs):
            d = Path(tmp) / f"work{k}"
            shutil.copytree(gitrepo, d, ignore=shutil.ignore_patterns(".git"))
            scratch.append(d)
        originals = {rel: (gitrepo / rel).read_bytes() for rel in source_files(gitrepo)}
        seen_sources: set[bytes] = set()
        unique = []
        for m in cands:
            mutated = m.apply(originals[m.path])
            if (m.path.encode() + b"\0" + mutated) not in seen_sources:
                seen_sources.add(m.path.encode() + b"\0" + mutated)
                unique.append((m, mutated))

        def trial(k: int, m: Mutation, mutated: bytes) -> dict[str, Any] | None:
            target = scratch[k] / m.path
            target.write_bytes(mutated)
            try:
                return run_suite(scratch[k], timeout_s)
            finally:
                target.write_bytes(originals[m.path])

        instances: list[dict[str, Any]] = []
        pos = 0
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            while pos < len(unique) and len(instances) < max_n:
                batch = unique[pos:pos + jobs]
                pos += len(batch)
                results = list(pool.map(lambda kb: trial(kb[0], *kb[1]), enumerate(batch)))
                for (m, mutated), res in zip(batch, results):
                    if len(instances) >= max_n:
                        break
                    report.tried += 1
                    if res is None:
                        report.unfinished += 1
                        continue
                    tests = res["tests"]
                    if set(tests) != set(all_tests):  # a test module that no longer imports
                        report.import_errors += 1
                        continue
                    failing = [t for t in all_tests if tests[t] != "passed"]
                    if not failing:
                        report.survived += 1
                        continue
                    n = len(instances) + 1
                    (gitrepo / m.path).write_bytes(mutated)
                    bug_patch = git(gitrepo, "diff", "--no-color", "--no-ext-diff")
                    gold = git(gitrepo, "diff", "-R", "--no-color", "--no-ext-diff")
                    git(gitrepo, "checkout", "-q", "--", m.path)
                    base = build_base(root, Path(tmp) / f"base{n}", bug_patch)
                    shutil.rmtree(Path(tmp) / f"base{n}")
                    details = res.get("details") or []
                    inst: dict[str, Any] = {
                        "instance_id": f"{name}__{name}-{n}",
                        "repo": f"clawloop/{name}",
                        "base_commit": base,
                        "problem_statement": problem_statement(name, details[0] if details else None, failing,
                                                               names, rng),
                        "FAIL_TO_PASS": json.dumps(failing),
                        "PASS_TO_PASS": json.dumps([t for t in all_tests if t not in failing]),
                        "patch": gold,
                        "test_patch": "",
                        "hints_text": "",
                        "created_at": CREATED_AT,
                        "version": VERSION,
                        "bug_patch": bug_patch,
                        "mutation": {"kind": m.kind, "file": m.path, "line": m.line, "function": m.function},
                    }
                    if repo_path is not None:
                        inst["repo_path"] = repo_path
                    instances.append(inst)
                    report.kept += 1
                    if log is not None:
                        log(f"  {inst['instance_id']}: {m.kind} in {m.path}:{m.line}, {len(failing)} failing test(s)")
    report.seconds = time.monotonic() - t0
    return instances, report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="clawloop swe make-tasks",
                                description="Inject bugs into small repos and write SWE-bench instances.")
    p.add_argument("--repos", default=str(REPOS_DIR),
                   help="A folder of repos (each a package + tests/test_*.py), or one repo (default: the shipped).")
    p.add_argument("--out", default=str(INSTANCES_FILE), help="Instances file to write (JSONL).")
    p.add_argument("--max-per-repo", type=int, default=DEFAULT_MAX_PER_REPO, help="Instances per repo, at most.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the order mutants are tried in and of the wording.")
    p.add_argument("--jobs", type=int, default=2, help="Test suites run at once.")
    p.add_argument("--timeout", type=float, default=SUITE_TIMEOUT_S, help="Seconds one mutant's suite may take.")
    p.add_argument("--quiet", action="store_true", help="Only the summary.")
    a = p.parse_args(argv)
    repos_dir = Path(a.repos).expanduser().resolve()
    roots = [repos_dir] if _is_repo(repos_dir) else sorted(d for d in repos_dir.iterdir() if _is_repo(d)) \
        if repos_dir.is_dir() else []
    if not roots:
        print(f"swe make-tasks: no repos in {repos_dir} (a repo is a folder with tests/test_*.py)", file=sys.stderr)
        return 2
    bad = [r.name for r in roots if not re.fullmatch(r"[A-Za-z0-9_.-]+", r.name)]
    if bad:
        print(f"swe make-tasks: repo names must be letters, digits, '_', '.', '-': {', '.join(bad)}", file=sys.stderr)
        return 2
    out = Path(a.out).expanduser().resolve()
    shipped = repos_dir == REPOS_DIR.resolve() or repos_dir.parent == REPOS_DIR.resolve()
    t0 = time.monotonic()
    everything: list[dict[str, Any]] = []
    log = None if a.quiet else print
    for root in roots:
        rel = None if shipped else os.path.relpath(root, out.parent)
        try:
            instances, rep = make_repo_instances(root, max_n=a.max_per_repo, seed=a.seed, jobs=max(1, a.jobs),
                                                 timeout_s=a.timeout, repo_path=rel, log=log)
        except RuntimeError as e:
            print(f"swe make-tasks: {e}", file=sys.stderr)
            return 1
        everything += instances
        print(f"{rep.name}: {rep.kept} instance(s) from {rep.tried} of {rep.candidates} mutants tried "
              f"({rep.survived} survived the tests, {rep.unfinished} did not finish, {rep.import_errors} broke "
              f"imports) in {rep.seconds:.1f} s", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in everything), encoding="utf-8")
    tmp.replace(out)
    print(f"wrote {len(everything)} instance(s) from {len(roots)} repo(s) to {out} in "
          f"{time.monotonic() - t0:.1f} s")
    return 0
