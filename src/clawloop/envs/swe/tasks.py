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
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawloop.envs.swe.mutations import Mutation, mutations
from clawloop.envs.swe.repos import (INSTANCES_FILE, REPOS_DIR, build_base, git, init_pristine, source_files,
                                     test_files)
from clawloop.envs.swe.suite import SUITE_TIMEOUT_S, run_suite

CREATED_AT = "2024-01-01T00:00:00Z"
VERSION = "1.0"
DEFAULT_MAX_PER_REPO = 40


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
