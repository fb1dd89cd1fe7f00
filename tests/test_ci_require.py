"""CI that cannot lie. With CLAWLOOP_REQUIRE naming a part, a test that would skip because the part is
missing fails instead, naming it (`needs_part` / `require_or_skip` in conftest.py): proved here on the
real browser tests with chromium hidden, in a pytest subprocess. Also: `make sysdeps` fails, naming what
it could not install, and `make bench`'s collector reads a result printed over many lines."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# One browser test per way the suites look for chromium: the dashboard's on PATH, the GUI track's at
# CLAWLOOP_CHROMIUM (else PATH, else /usr/bin/chromium), and a module-wide mark (the GUI rollout).
BROWSER_TESTS = ["tests/test_dashboard.py::test_the_page_asks_for_a_key",
                 "tests/test_env_gui.py::test_observation_has_refs_and_a_png",
                 "tests/test_gui_rollout.py::test_screenshot_observations_are_image_parts_and_stripped_from_items"]


def run_without_chromium(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess:
    """pytest on BROWSER_TESTS where no chromium can be found: off PATH and CLAWLOOP_CHROMIUM pointing nowhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLAWLOOP_REQUIRE", "PYTEST_ADDOPTS")}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.access(os.path.join(d, "chromium"), os.X_OK))
    env["CLAWLOOP_CHROMIUM"] = str(tmp_path / "no-chromium-here")
    if require is not None:
        env["CLAWLOOP_REQUIRE"] = require
    return subprocess.run([sys.executable, "-m", "pytest", "-rfEs", "-p", "no:cacheprovider", *BROWSER_TESTS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.browser  # pytest runs of the browser tests: with them, in make test-browser
def test_a_required_browser_that_is_missing_fails_the_run_naming_it(tmp_path):
    p = run_without_chromium(tmp_path, "sandbox,browser")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert out.count("required part 'browser' is missing") >= len(BROWSER_TESTS), out
    assert f"{len(BROWSER_TESTS)} errors" in out and "skipped" not in out and "passed" not in out, out
    assert "chromium is not on PATH" in out and "no chromium at" in out, out  # each site says what it looked for


@pytest.mark.browser  # pytest runs of the browser tests: with them, in make test-browser
def test_without_the_requirement_the_same_tests_skip_and_say_why(tmp_path):
    p = run_without_chromium(tmp_path, None)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert f"{len(BROWSER_TESTS)} skipped" in out and "browser is missing" in out, out
    assert "SKIPPED" in out and "chromium is not on PATH" in out, out  # -rs: the reasons are printed


def test_requiring_a_part_that_does_not_exist_is_an_error():
    env = {**os.environ, "CLAWLOOP_REQUIRE": "browser,chromium"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only",
                        "tests/test_ci_require.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "CLAWLOOP_REQUIRE names chromium: not a part" in p.stdout + p.stderr


def test_sysdeps_says_what_it_could_not_install_and_fails(tmp_path):
    """Where nothing can be installed (here: no apt-get, no id on PATH), the target names what is missing and
    exits non-zero, instead of a note and success."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    (tmp_path / "bin").mkdir()
    os.symlink(shutil.which("sh"), tmp_path / "bin" / "sh")
    p = subprocess.run([make, "--no-print-directory", "-s", "sysdeps", "SYSPKGS=no-such-package:no-such-command"],
                       cwd=ROOT, env={"PATH": str(tmp_path / "bin")}, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "FAILED: still missing: no-such-package" in p.stdout, p.stdout + p.stderr


def load_run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    return run_all


def test_bench_results_are_read_whole_across_lines():
    run_all = load_run_all()
    indented = {"bench": "ray_scale", "single": {"step_ms": 12.5}, "actors": [{"n": 1}, {"n": 2}]}
    stdout = ("model            2+1\n{n} rows, {'not': 'json'}\n"  # text that only looks like JSON
              + json.dumps(indented, indent=2) + "\n"
              + json.dumps({"agent": "oracle", "reward": 1.0}) + "\n" + '{"agent": "model", "reward": 0.5}\n'
              + "{\n  truncated")
    assert run_all.bench_results(stdout) == [indented, {"agent": "oracle", "reward": 1.0},
                                             {"agent": "model", "reward": 0.5}]
    assert run_all.bench_results("no result\n") == []


def test_run_all_writes_every_result_and_every_failure(tmp_path, monkeypatch):
    """Three stand-in benches: one prints its result indented over many lines (as ray_scale does), one
    exits 1, one prints no JSON; the run goes to its end and last_run.jsonl holds a line for each."""
    run_all = load_run_all()
    (tmp_path / "indented.py").write_text('import json\nprint("table")\nprint(json.dumps({"x": {"y": 1}}, indent=2))\n')
    (tmp_path / "crashes.py").write_text('raise SystemExit(1)\n')
    (tmp_path / "silent.py").write_text('print("no result")\n')
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    assert run_all.main(["indented", "crashes", "silent"]) == 1
    lines = [json.loads(ln) for ln in (tmp_path / "last_run.jsonl").read_text().splitlines()]
    assert [(r["bench"], r.get("x"), r.get("_failed")) for r in lines] == [
        ("indented", {"y": 1}, None), ("crashes", None, "exit status 1"), ("silent", None, "printed no JSON result")]
    assert all(isinstance(r["_seconds"], float) for r in lines)
