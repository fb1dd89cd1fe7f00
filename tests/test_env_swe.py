"""The SWE track: shipped repos and instances, bug generation, the mini-swe-agent protocol and SWE-bench scoring.

Everything runs for real: git, the sandbox (bwrap, else unshare), the in-sandbox test runner.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import needs_part

from clawloop.envs import sandbox as sb
from clawloop.envs.base import NOOP_MESSAGE, EnvOptions, get_track
from clawloop.envs.check import check_task, play
from clawloop.envs.swe import repos as swe_repos
from clawloop.envs.swe import suite as swe_suite
from clawloop.envs.swe import tasks as swe_tasks

pytestmark = needs_part("sandbox", sb.probe("bwrap") and sb.probe("unshare")
                        and f"no sandbox level runs here: {sb.probe('bwrap')}; {sb.probe('unshare')}")

TRACK = get_track("swe")
REPOS = sorted(p for p in swe_repos.REPOS_DIR.iterdir() if p.is_dir())
KEYS = ("instance_id", "repo", "base_commit", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS", "patch",
        "bug_patch", "created_at", "version")


def bash(command: str) -> dict:
    return {"role": "assistant", "content": f"THOUGHT: next.\n\n```bash\n{command}\n```"}


SUBMIT = bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


def opts(**kw) -> EnvOptions:
    return EnvOptions(**{"command_timeout_s": 60.0, **kw})


def run_tests(repo: Path, ids: list[str]) -> dict[str, str]:
    files = sorted({t.split("::")[0] for t in ids})
    out = repo / ".results.json"
    subprocess.run([sys.executable, "-m", "clawloop.envs.testrun", *files, "--json", str(out),
                    *[a for t in ids for a in ("-k", t)]], cwd=repo, capture_output=True, timeout=60)
    return json.loads(out.read_text())["tests"]


@pytest.fixture(scope="module")
def shipped():
    return [json.loads(line) for line in swe_repos.INSTANCES_FILE.read_text().splitlines() if line.strip()]


def test_pristine_repos_pass_their_suites():
    assert 4 <= len(REPOS) <= 6
    for repo in REPOS:
        assert (repo / "README.md").is_file()
        results = swe_suite.run_suite(repo)
        assert results is not None, repo.name
        assert 15 <= len(results["tests"]) <= 40, (repo.name, len(results["tests"]))
        assert all(r == "passed" for r in results["tests"].values()), (repo.name, results["tests"])


def test_make_tasks_small_run_is_valid_and_deterministic(tmp_path):
    repos = tmp_path / "repos"
    for name in ("textkit", "lrukit"):
        shutil.copytree(swe_repos.REPOS_DIR / name, repos / name)
    out = tmp_path / "instances.jsonl"
    assert swe_tasks.main(["--repos", str(repos), "--out", str(out), "--max-per-repo", "2", "--seed", "3",
                           "--quiet"]) == 0
    lines = out.read_text().splitlines()
    instances = [json.loads(x) for x in lines]
    assert [i["instance_id"] for i in instances] == ["lrukit__lrukit-1", "lrukit__lrukit-2", "textkit__textkit-1",
                                                     "textkit__textkit-2"]
    for inst in instances:
        assert all(inst.get(k) for k in KEYS), inst["instance_id"]
        f2p, p2p = json.loads(inst["FAIL_TO_PASS"]), json.loads(inst["PASS_TO_PASS"])
        assert f2p and not set(f2p) & set(p2p)
        name = inst["repo"].split("/")[1]
        base = tmp_path / "base" / inst["instance_id"]
        assert swe_repos.build_base(repos / name, base, inst["bug_patch"]) == inst["base_commit"]
        with_bug = run_tests(base, f2p + p2p)
        assert all(with_bug[t] == "failed" for t in f2p), inst["instance_id"]
        assert all(with_bug[t] == "passed" for t in p2p), inst["instance_id"]
        swe_repos.git(base, "apply", "-", stdin=inst["patch"])
        fixed = run_tests(base, f2p + p2p)
        assert all(fixed[t] == "passed" for t in f2p + p2p), inst["instance_id"]
        for line in inst["bug_patch"].splitlines():  # the report shows the symptom, not the edit
            if line.startswith("+") and not line.startswith("+++"):
                assert line[1:].strip() not in inst["problem_statement"]
    # The same seed makes the same instances, whatever other repos are beside it.
    again = tmp_path / "again.jsonl"
    assert swe_tasks.main(["--repos", str(repos / "textkit"), "--out", str(again), "--max-per-repo", "2",
                           "--seed", "3", "--quiet"]) == 0
    assert again.read_text().splitlines() == lines[2:]
    # Generated instances load as the user's own (their repo is a plain folder beside the file) and play.
    tasks = TRACK.load_tasks(opts(task_dir=str(out)))
    assert [t.task_id for t in tasks] == [i["instance_id"] for i in instances]
    assert play(TRACK, tasks[0], opts(task_dir=str(out)), None, slot=7)[0] == 1.0


def test_shipped_instances_file(shipped):
    assert len(shipped) >= 200
    ids = [i["instance_id"] for i in shipped]
    assert len(set(ids)) == len(ids)
    assert {i["repo"] for i in shipped} == {f"clawloop/{r.name}" for r in REPOS}
    for inst in shipped:
        assert all(inst.get(k) for k in KEYS), inst["instance_id"]
        name = inst["repo"].split("/")[1]
        assert inst["instance_id"].startswith(f"{name}__{name}-")
        f2p, p2p = json.loads(inst["FAIL_TO_PASS"]), json.loads(inst["PASS_TO_PASS"])
        assert f2p and not set(f2p) & set(p2p)
        assert inst["patch"].startswith("diff --git") and inst["bug_patch"].startswith("diff --git")
        assert not any(line[1:].strip() in inst["problem_statement"] for line in inst["bug_patch"].splitlines()
                       if line.startswith("+") and not line.startswith("+++")), inst["instance_id"]
    tasks = TRACK.load_tasks(opts())
    assert [t.task_id for t in tasks] == ids
    assert tasks[0].instruction == shipped[0]["problem_statement"]


def test_oracle_resolves_and_noop_does_not(shipped):
    by_repo: dict[str, list] = {}
    for inst in shipped:
        by_repo.setdefault(inst["repo"], []).append(inst["instance_id"])
    # Two per repo, spread over each repo's list.
    sample = {ids[k] for ids in by_repo.values() for k in (0, len(ids) // 2)}
    tasks = [t for t in TRACK.load_tasks(opts()) if t.task_id in sample]
    assert len(tasks) == 2 * len(by_repo)
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda it: check_task(TRACK, it[1], opts(), it[0]), enumerate(tasks)))
    bad = [(r.task_id, r.error) for r in results if r.error]
    assert not bad
    assert all(r.oracle_reward == 1.0 and r.noop_reward == -1.0 for r in results)


def first_task(**kw):
    o = opts(**kw)
    return o, TRACK.load_tasks(o)[0]


def test_protocol_format_errors_and_max_steps():
    o, task = first_task(max_steps=3)
    env = TRACK.make_env(task, o, slot=3)
    try:
        first = env.reset()
        assert first.tools is None
        assert [m["role"] for m in first.messages] == ["system", "user"]
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in first.messages[1]["content"]
        assert task.instruction.strip() in first.messages[1]["content"]
        two = env.step({"role": "assistant", "content": "```bash\nls\n```\nand\n```bash\npwd\n```"})
        assert not two.done
        assert two.messages[0]["role"] == "user"
        assert "EXACTLY ONE action" in two.messages[0]["content"] and "found 2 actions" in two.messages[0]["content"]
        none = env.step(dict(NOOP_MESSAGE))
        assert "found 0 actions" in none.messages[0]["content"] and not none.done
        last = env.step(bash("echo hello && exit 3"))
        assert last.messages[0]["content"] == "<returncode>3</returncode>\n<output>\nhello\n</output>"
        assert last.done and last.info["end_reason"] == "max_steps"
        ev = env.evaluate()
        assert ev.reward == -1.0 and not ev.details["submitted"]
        assert env.step(bash("ls")).info["end_reason"] == "episode_over"
    finally:
        env.close()


def test_long_output_timeout_and_submit_forms():
    o, task = first_task(command_timeout_s=1.0)
    env = TRACK.make_env(task, o, slot=4)
    try:
        env.reset()
        long = env.step(bash("python3 -c \"print('x' * 30000)\""))
        text = long.messages[0]["content"]
        assert "<output_head>" in text and "characters elided" in text and len(text) < 12000
        t0 = time.monotonic()
        hung = env.step(bash("sleep 30"))
        assert time.monotonic() - t0 < 15
        assert "timed out and has been killed" in hung.messages[0]["content"] and hung.info["timed_out"]
        # mini-swe-agent v1's own submit line counts (nothing after the echo runs).
        done = env.step(bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"))
        assert done.done and done.info["submitted"] and done.info["end_reason"] == "submitted"
        assert env.evaluate().details["reason"].startswith("empty patch")
    finally:
        env.close()


def test_editing_tests_does_not_resolve(shipped):
    o, task = first_task()
    inst = task.data
    f2p = json.loads(inst["FAIL_TO_PASS"])
    env = TRACK.make_env(task, o, slot=5)
    try:
        env.reset()
        files = sorted({t.split("::")[0] for t in f2p})
        # Neuter every failing test (and drop one test file altogether), then submit.
        cmd = " && ".join(f"sed -i 's/^    assert /    assert True or /' {f}" for f in files)
        env.step(bash(cmd + f" && git rm -q {files[0]}"))
        env.step(SUBMIT)
        ev = env.evaluate()
        assert ev.details["applied"] and ev.details["patch"]
        assert ev.reward == -1.0 and not ev.success
        assert all(ev.details["fail_to_pass"][t] == "failed" for t in f2p)
    finally:
        env.close()


def make_user_repo(root: Path) -> tuple[str, str, str]:
    """A git repo with a buggy commit and, after it, the fix: (base sha, fix sha, gold patch)."""
    repo = root / "repos" / "acme__widget"
    (repo / "widget").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "widget" / "__init__.py").write_text("def double(x):\n    return x + x + 1\n\n\ndef half(x):\n"
                                                 "    return x / 2\n")
    (repo / "tests" / "test_widget.py").write_text(
        "from widget import double, half\n\n\ndef test_double():\n    assert double(3) == 6\n\n\n"
        "def test_half():\n    assert half(3) == 1.5\n")
    env = swe_repos.git_env()
    def g(*a):
        return subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout
    g("init", "-q", "-b", "main")
    g("add", "-A")
    g("commit", "-qm", "buggy")
    base = g("rev-parse", "HEAD").strip()
    (repo / "widget" / "__init__.py").write_text("def double(x):\n    return x + x\n\n\ndef half(x):\n"
                                                 "    return x / 2\n")
    g("commit", "-qam", "fix double")
    return base, g("rev-parse", "HEAD").strip(), g("diff", base, "HEAD")


def test_user_instances_folder_with_git_repo(tmp_path):
    base, fix, patch = make_user_repo(tmp_path)
    inst = {"instance_id": "acme__widget-1", "repo": "acme/widget", "base_commit": base, "patch": patch,
            "problem_statement": "double(3) returns 7", "FAIL_TO_PASS": ["tests/test_widget.py::test_double"],
            "PASS_TO_PASS": json.dumps(["tests/test_widget.py::test_half"])}
    (tmp_path / "instances.jsonl").write_text(json.dumps(inst) + "\n")
    o = opts(task_dir=str(tmp_path))
    [task] = TRACK.load_tasks(o)
    assert task.task_id == "acme__widget-1" and task.instruction == "double(3) returns 7"
    env = TRACK.make_env(task, o, slot=6)
    try:
        env.reset()
        seen = env.step(bash("git log --all --format=%H; cat widget/__init__.py"))
        assert base in seen.messages[0]["content"] and fix not in seen.messages[0]["content"]  # no future commits
        assert "x + x + 1" in seen.messages[0]["content"]
        env.step(bash("sed -i 's/x + x + 1/2 * x/' widget/__init__.py"))
        assert env.step(SUBMIT).done
        ev = env.evaluate()
        assert ev.reward == 1.0, ev.details
        assert ev.details["tests"] == {"tests/test_widget.py::test_double": "passed",
                                       "tests/test_widget.py::test_half": "passed"}
    finally:
        env.close()
    assert play(TRACK, task, o, [dict(NOOP_MESSAGE)], slot=6)[0] == -1.0
    assert play(TRACK, task, o, None, slot=6)[0] == 1.0


def test_broken_instances_are_named(tmp_path):
    base, _, _ = make_user_repo(tmp_path)
    good = {"instance_id": "acme__widget-1", "repo": "acme/widget", "base_commit": base, "problem_statement": "x",
            "FAIL_TO_PASS": ["tests/test_widget.py::test_double"], "PASS_TO_PASS": []}
    cases = [({**good, "instance_id": "no-commit", "base_commit": ""}, "base_commit"),
             ({k: v for k, v in good.items() if k != "FAIL_TO_PASS"} | {"instance_id": "no-f2p"}, "FAIL_TO_PASS"),
             ({**good, "instance_id": "elsewhere", "repo": "acme/gadget"}, "unknown repo"),
             ({**good, "instance_id": "bad-sha", "base_commit": "0" * 40}, "is not a commit"),
             ({**good, "instance_id": "bad-ids", "PASS_TO_PASS": "[not json"}, "PASS_TO_PASS")]
    for inst, what in cases:
        path = tmp_path / "one.jsonl"
        path.write_text(json.dumps(inst) + "\n")
        with pytest.raises(ValueError) as e:
            TRACK.load_tasks(opts(task_dir=str(path)))
        assert inst["instance_id"] in str(e.value) and what in str(e.value), str(e.value)
