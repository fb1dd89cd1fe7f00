"""The layout's rules, checked on the source (issue #29): no import circles, counting the imports
inside functions and the package faces (`__init__.py`) an import runs; nothing below the composition
layer (`clawloop.apps`) imports it; no source file past ~900 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "clawloop"
MAX_LINES = 900


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the clawloop modules importing it runs: what it names (a module, or the module a name
    comes from), and, across packages, the package faces on the way (`import a.b.c` runs `a/b/__init__`)."""
    mods = _modules()

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(owner(a.name) for a in node.names if a.name.startswith("clawloop"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                if not base.startswith("clawloop"):
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.add(full if full in mods else owner(base))
        for t in targets:
            if not t or t == m:
                continue
            graph[m].add(t)
            parts = t.split(".")
            for i in range(2, len(parts)):  # the package faces an import of t runs, outside m's own package
                face = ".".join(parts[:i])
                if face in mods and not (m + ".").startswith(face + ".") and face != m:
                    graph[m].add(face)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for a, bs in graph.items():
        for b in bs:
            if top(a) != top(b):
                out.setdefault(top(a), set()).add(top(b))
            out.setdefault(top(b), set())
    return out


def test_the_checker_finds_a_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(g) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_between_modules():
    assert circles(import_graph()) == []


def test_no_import_circles_between_packages():
    assert circles(_package_graph(import_graph())) == []


def test_nothing_below_the_composition_layer_imports_it():
    graph = import_graph()
    users = sorted(m for m, ts in graph.items() if not m.startswith(("clawloop.apps", "clawloop.cli"))
                   and any(t.startswith("clawloop.apps") for t in ts))
    assert users == [], f"{users} import clawloop.apps: components must not know how they are deployed"


def test_no_source_file_is_past_the_limit():
    long = {str(p.relative_to(SRC)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these (over {MAX_LINES} lines): {long}"
