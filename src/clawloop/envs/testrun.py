"""A small test runner for task checks, run inside the sandbox (pytest is not assumed there).

    python -m clawloop.envs.testrun tests/test_outputs.py [more files] [--json OUT] [-k NAME ...]

Collects what pytest would for simple suites: module-level `test_*` functions
(with no arguments, or with pytest's `tmp_path` fixture) and `unittest.TestCase`
classes (`Test*` methods of both). Each test runs in this process, in file
order; the result of each is "passed", "failed" or "error" (the module did not
import). Prints one line per test (`PASSED tests/test_x.py::test_name`) and a
summary `N passed, M failed`; with `--json OUT` writes
`{"tests": {"tests/test_x.py::test_name": "passed", ...}, "passed": N, "failed": M}`.
Test ids are pytest's (`file::function`, `file::Class::method`), so SWE-bench
FAIL_TO_PASS / PASS_TO_PASS lists read the same either way. Exit code 0 only
when every test passed (and at least one ran).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import tempfile
import traceback
import unittest
from pathlib import Path


def _load(path: Path):
    name = "_task_test_" + "_".join(path.with_suffix("").parts[-3:]).replace("-", "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _call(fn) -> None:
    params = inspect.signature(fn).parameters
    if "tmp_path" in params:
        with tempfile.TemporaryDirectory() as d:
            fn(tmp_path=Path(d))
    else:
        fn()


def run_file(path: str, selected: set[str] | None = None) -> dict[str, str]:
    results: dict[str, str] = {}
    rel = os.path.relpath(path)
    root = str(Path(path).resolve().parent)
    for p in (os.getcwd(), root):  # appended: a workspace file named like a stdlib module cannot shadow it
        if p not in sys.path:
            sys.path.append(p)
    try:
        mod = _load(Path(path))
    except BaseException:  # noqa: BLE001 - a module that does not import fails all its tests
        traceback.print_exc()
        results[f"{rel}::<module>"] = "error"
        return results
    for name, obj in list(vars(mod).items()):
        if name.startswith("test") and inspect.isfunction(obj) and obj.__module__ == mod.__name__:
            tid = f"{rel}::{name}"
            if selected and tid not in selected and name not in selected:
                continue
            try:
                _call(obj)
                results[tid] = "passed"
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                results[tid] = "failed"
        elif inspect.isclass(obj) and obj.__module__ == mod.__name__ and (
                issubclass(obj, unittest.TestCase) or name.startswith("Test")):
            for meth in sorted(m for m in dir(obj) if m.startswith("test")):
                tid = f"{rel}::{name}::{meth}"
                if selected and tid not in selected and meth not in selected:
                    continue
                if issubclass(obj, unittest.TestCase):
                    res = unittest.TestResult()
                    obj(meth).run(res)
                    for _, tb in res.errors + res.failures:
                        print(tb, file=sys.stderr)
                    results[tid] = "passed" if res.wasSuccessful() else "failed"
                else:
                    try:
                        inst = obj()
                        if hasattr(inst, "setup_method"):
                            inst.setup_method(getattr(inst, meth))
                        _call(getattr(inst, meth))
                        results[tid] = "passed"
                    except BaseException:  # noqa: BLE001
                        traceback.print_exc()
                        results[tid] = "failed"
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clawloop.envs.testrun")
    p.add_argument("files", nargs="+")
    p.add_argument("--json", default="")
    p.add_argument("-k", action="append", default=[], help="Only this test id or name (repeatable).")
    a = p.parse_args(argv)
    results: dict[str, str] = {}
    for f in a.files:
        results.update(run_file(f, set(a.k) or None))
    for tid, r in results.items():
        print(f"{r.upper()} {tid}")
    n_pass = sum(r == "passed" for r in results.values())
    n_fail = len(results) - n_pass
    print(f"{n_pass} passed, {n_fail} failed")
    if a.json:
        Path(a.json).write_text(json.dumps({"tests": results, "passed": n_pass, "failed": n_fail}))
    sys.stdout.flush()
    return 0 if results and n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
