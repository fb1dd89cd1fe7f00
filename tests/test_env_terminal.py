"""The terminal track: shipped tasks (oracle passes, doing nothing does not), the persistent shell,
task loading, scoring, and bad input ending in bounded time."""

from __future__ import annotations

import ast
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import needs_part

from clawloop.envs.base import NOOP_MESSAGE, EnvOptions, assistant_tool_call, get_track
from clawloop.envs.sandbox import probe
from clawloop.envs.terminal import REQUIRED, SHIPPED, TRACK

_WHY = [probe("bwrap"), probe("unshare")]
pytestmark = needs_part("sandbox", all(_WHY) and f"no sandbox level runs here: bwrap: {_WHY[0]}; unshare: {_WHY[1]}")

RUN_TESTS = 'python3 -P -m clawloop.envs.testrun "$TEST_DIR/test_outputs.py" --json "$TEST_DIR/results.json"\n'
SLOT = 700  # sandbox users of their own: other test files use the low slots


def make_task(root: Path, name: str = "demo", *, instruction: str = "Write hello to out.txt.",
              solution: str = "echo hello > out.txt\n", run_tests: str = RUN_TESTS, yaml_extra: str = "",
              tests: str = 'from pathlib import Path\n\n\ndef test_out():\n    assert Path("out.txt").read_text() == '
                           '"hello\\n"\n\n\ndef test_exists():\n    assert Path("out.txt").exists()\n',
              setup: str | None = None) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text(f"instruction: {instruction}\n{yaml_extra}")
    (d / "solution.sh").write_text(solution)
    (d / "run-tests.sh").write_text(run_tests)
    (d / "tests" / "test_outputs.py").write_text(tests)
    if setup is not None:
        (d / "setup.sh").write_text(setup)
    return d


def user_task(tmp_path: Path, name: str = "demo", **kw):
    make_task(tmp_path / "tasks", name, **kw)
    opts = EnvOptions(task_dir=str(tmp_path / "tasks"), command_timeout_s=20, work_dir=str(tmp_path / "work"))
    return next(t for t in TRACK.load_tasks(opts) if t.task_id == name), opts


@pytest.fixture
def env(tmp_path):
    task, opts = user_task(tmp_path)
    opts.max_steps = 100
    e = TRACK.make_env(task, opts, slot=SLOT)
    e.reset()
    yield e
    e.close()


def call(env, name, **args):
    res = env.step(assistant_tool_call(name, args))
    assert len(res.messages) == 1 and res.messages[0]["role"] == "tool"
    return res.messages[0]["content"], res


def run_episode(task, opts, slot, messages):
    env = TRACK.make_env(task, opts, slot=slot)
    try:
        env.reset()
        for m in messages(env):
            if env.step(m).done:
                break
        return env.evaluate()
    finally:
        env.close()


# ---- the shipped tasks -------------------------------------------------------------------------

@pytest.mark.slow
def test_shipped_tasks_oracle_passes_and_doing_nothing_does_not():
    opts = EnvOptions(command_timeout_s=60)
    tasks = TRACK.load_tasks(opts)
    assert len(tasks) >= 32 and [t.task_id for t in tasks] == sorted(t.task_id for t in tasks)

    def check(i_task):
        i, task = i_task
        oracle = run_episode(task, opts, SLOT + 10 + 2 * i, lambda env: env.oracle())
        noop = run_episode(task, opts, SLOT + 11 + 2 * i, lambda env: [dict(NOOP_MESSAGE)])
        problems = []
        if oracle.reward != 1.0 or not oracle.success:
            problems.append(f"oracle {oracle.reward}: {oracle.details.get('reason')} "
                            f"{oracle.details.get('output_tail', '')[-800:]}")
        if noop.reward >= 1.0:
            problems.append(f"doing nothing scored {noop.reward}")
        return task.task_id, problems

    with ThreadPoolExecutor(3) as ex:
        failures = {tid: p for tid, p in ex.map(check, enumerate(tasks)) if p}
    assert not failures, failures


def test_shipped_tasks_are_well_formed():
    tasks = TRACK.load_tasks(EnvOptions())
    categories = set()
    for t in tasks:
        folder = Path(t.data["path"])
        assert folder.parent == SHIPPED and t.data["source"] == "shipped"
        meta = t.data["yaml"]
        assert meta["instruction"].strip() == t.instruction and meta["difficulty"] and meta["tags"]
        categories.add(meta["category"])
        tree = ast.parse((folder / "tests/test_outputs.py").read_text())
        n_tests = sum(isinstance(n, ast.FunctionDef) and n.name.startswith("test") for n in tree.body)
        assert 2 <= n_tests <= 5, (t.task_id, n_tests)
        assert "test_outputs" not in t.instruction and "solution.sh" not in t.instruction
    assert {"files", "text-processing", "git", "sqlite", "build", "json", "scripting"} <= categories


def test_observation_hides_solution_and_tests(tmp_path):
    task = next(t for t in TRACK.load_tasks(EnvOptions()) if t.task_id == "edit-app-config")
    env = TRACK.make_env(task, EnvOptions(work_dir=str(tmp_path)), slot=SLOT + 1)
    try:
        obs = env.reset()
        assert [m["role"] for m in obs.messages] == ["system", "user"]
        assert obs.messages[1]["content"] == task.instruction and env.sandbox.cwd in obs.messages[0]["content"]
        assert [t["function"]["name"] for t in obs.tools] == [
            "shell_exec", "shell_view", "shell_write_to_process", "shell_write_content_to_file"]
        assert sorted(p.name for p in env.workspace.iterdir()) == ["app.conf"]
        out, _ = call(env, "shell_exec", command=f"ls -A; cat {SHIPPED}/*/solution.sh | wc -c")
        assert out.startswith("app.conf\n") and "\n0\n" in out
        assert env.describe()["task_id"] == "edit-app-config" and env.describe()["sandbox"]["level"]
    finally:
        env.close()


# ---- the shell ---------------------------------------------------------------------------------

def test_shell_keeps_cwd_and_variables(env):
    out, res = call(env, "shell_exec", command="mkdir -p sub/dir && cd sub/dir && export GREETING=hi")
    assert out == "[exit code 0]" and res.info["returncode"] == 0 and not res.done
    out, _ = call(env, "shell_exec", command='pwd; echo "$GREETING"; false')
    assert out == f"{env.sandbox.cwd}/sub/dir\nhi\n[exit code 1]"
    # quotes, newlines, here-docs and syntax errors go through as typed
    out, _ = call(env, "shell_exec", command="cat <<'EOF'\n$HOME 'q' \"dq\" ✓\nEOF\necho \"unterminated")
    assert out.startswith("$HOME 'q' \"dq\" ✓\n") and "[exit code 2]" in out
    out, _ = call(env, "shell_exec", command="echo still here")
    assert out == "still here\n[exit code 0]"


def test_write_to_process_answers_a_prompt(env):
    out, res = call(env, "shell_exec", command='read -r name; echo "hello $name"', timeout=1)
    assert "still running" in out and res.info["timed_out"]
    out, res = call(env, "shell_write_to_process", input="world")
    assert out == "hello world\n[the command finished: exit code 0]" and res.info["returncode"] == 0
    out, _ = call(env, "shell_write_to_process", input="nobody reads this")
    assert out.startswith("error: no command is running")


def test_hanging_command_times_out_and_view_shows_the_rest(env):
    t0 = time.monotonic()
    out, res = call(env, "shell_exec", command="echo started; sleep 2; echo finished", timeout=0.5)
    assert time.monotonic() - t0 < 5 and res.info["timed_out"]
    assert out.startswith("started\n") and "still running" in out
    seen = ""
    deadline = time.monotonic() + 15
    while "exit code" not in seen and time.monotonic() < deadline:
        seen += call(env, "shell_view")[0]
    assert "finished\n[the command finished: exit code 0]" in seen
    # a new command stops one that still runs, and says so
    call(env, "shell_exec", command="sleep 60", timeout=0.3)
    out, _ = call(env, "shell_exec", command="echo next")
    assert "was stopped" in out and out.endswith("next\n[exit code 0]")


def test_exit_restarts_the_shell_in_the_same_folder(env):
    call(env, "shell_exec", command="mkdir -p d && cd d")
    out, res = call(env, "shell_exec", command="exit 3")
    assert "exited (code 3)" in out and res.info["error"]
    out, _ = call(env, "shell_exec", command="pwd")
    assert "new shell started" in out and out.endswith(f"{env.sandbox.cwd}/d\n[exit code 0]")


def test_long_output_is_cut(env):
    out, _ = call(env, "shell_exec", command="seq 1 200000")
    assert len(out) < 9000 and "characters cut" in out
    assert out.startswith("1\n2\n") and out.endswith("200000\n[exit code 0]")


def test_write_file_inside_and_refuse_outside(env, tmp_path):
    out, res = call(env, "shell_write_content_to_file", path="notes/a b.txt", content="x 'y' \"z\"\n")
    assert out.startswith("wrote") and res.info["returncode"] == 0
    assert (env.workspace / "notes" / "a b.txt").read_text() == "x 'y' \"z\"\n"
    outside = tmp_path / "outside.txt"
    for bad in ("../outside.txt", str(outside), "/etc/passwd", f"{env.sandbox.cwd}/../x", ""):
        out, res = call(env, "shell_write_content_to_file", path=bad, content="pwned")
        assert out.startswith("error:") and res.info["error"], bad
    # a link inside the workspace pointing out is followed only where the sandbox user may write
    call(env, "shell_exec", command=f"ln -s {tmp_path} escape")
    out, _ = call(env, "shell_write_content_to_file", path="escape/outside.txt", content="pwned")
    assert out.startswith("error:") and not outside.exists()


def test_bad_tool_calls_get_readable_errors(env):
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "rm_rf", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "shell_exec", "arguments": "{not json"}},
        {"id": "c", "type": "function", "function": {"name": "shell_exec", "arguments": "{}"}},
        {"id": "d", "type": "function", "function": {"name": "shell_exec", "arguments": '{"command": 5}'}},
        {"id": "e", "type": "function", "function": {"name": "shell_exec", "arguments": '{"command": "echo ok"}'}}]}
    res = env.step(msg)
    assert [m["tool_call_id"] for m in res.messages] == list("abcde")
    assert all(m["content"].startswith("error:") for m in res.messages[:4])
    assert "unknown tool" in res.messages[0]["content"] and "missing argument" in res.messages[2]["content"]
    assert res.messages[4]["content"] == "ok\n[exit code 0]" and len(res.info["calls"]) == 5


def test_episode_ends_without_tool_call_or_at_max_steps(tmp_path):
    task, opts = user_task(tmp_path)
    opts.max_steps = 2
    env = TRACK.make_env(task, opts, slot=SLOT + 2)
    try:
        env.reset()
        assert not call(env, "shell_exec", command="true")[1].done
        res = call(env, "shell_exec", command="true")[1]
        assert res.done and res.info["end_reason"] == "max_steps"
        env.reset()
        res = env.step(dict(NOOP_MESSAGE))
        assert res.done and res.messages == [] and res.info["end_reason"] == "agent_finished"
    finally:
        env.close()


# ---- tasks and scoring -------------------------------------------------------------------------

def test_user_tasks_load_and_replace_shipped(tmp_path):
    make_task(tmp_path / "many", "edit-app-config", instruction="Mine now.")
    make_task(tmp_path / "many", "zz-extra")
    tasks = TRACK.load_tasks(EnvOptions(task_dir=str(tmp_path / "many")))
    by_id = {t.task_id: t for t in tasks}
    assert by_id["edit-app-config"].instruction == "Mine now." and by_id["edit-app-config"].data["source"] == "user"
    assert "zz-extra" in by_id and len(tasks) == len(TRACK.load_tasks(EnvOptions())) + 1
    single = TRACK.load_tasks(EnvOptions(task_dir=str(tmp_path / "many" / "zz-extra")))
    assert "zz-extra" in {t.task_id for t in single}


@pytest.mark.parametrize("missing", REQUIRED)
def test_task_missing_a_file_is_a_value_error(tmp_path, missing):
    folder = make_task(tmp_path, "broken")
    (folder / missing).unlink()
    with pytest.raises(ValueError) as e:
        TRACK.load_tasks(EnvOptions(task_dir=str(tmp_path)))
    assert str(folder) in str(e.value) and missing in str(e.value)


def test_task_without_instruction_is_a_value_error(tmp_path):
    folder = make_task(tmp_path, "broken")
    (folder / "task.yaml").write_text("category: x\n")
    with pytest.raises(ValueError, match="instruction"):
        TRACK.load_tasks(EnvOptions(task_dir=str(folder)))


def test_failing_setup_is_a_runtime_error(tmp_path):
    task, opts = user_task(tmp_path, setup="echo preparing; exit 4\n")
    env = TRACK.make_env(task, opts, slot=SLOT + 3)
    with pytest.raises(RuntimeError, match="demo.*setup.sh failed.*preparing"):
        env.reset()
    env.close()
    assert not list((tmp_path / "work").iterdir())


def test_partial_credit_and_summary_line_scoring(tmp_path):
    half = "echo 'fine' > out.txt\n"
    task, opts = user_task(tmp_path, solution=half)
    ev = run_episode(task, opts, SLOT + 4, lambda env: env.oracle())
    assert ev.details["acc"] == 0.5 and ev.reward == 0.0 and not ev.success
    assert ev.details["tests"] == {"tests/test_outputs.py::test_out": "failed",
                                   "tests/test_outputs.py::test_exists": "passed"}
    task, opts = user_task(tmp_path / "b", run_tests="echo '=== 3 passed, 1 failed in 0.1s ==='\n")
    ev = run_episode(task, opts, SLOT + 4, lambda env: [dict(NOOP_MESSAGE)])
    assert ev.details["acc"] == 0.75 and ev.reward == 0.5
    task, opts = user_task(tmp_path / "c", run_tests="echo all good\n")
    ev = run_episode(task, opts, SLOT + 4, lambda env: [dict(NOOP_MESSAGE)])
    assert ev.reward == -1.0 and "no test results" in ev.details["reason"]
    assert not [p for p in (tmp_path / "c" / "work").rglob(".clawloop_tests_*")]


# ---- bad input ends in bounded time ------------------------------------------------------------

def test_hanging_solution_and_hanging_tests_time_out(tmp_path):
    task, opts = user_task(tmp_path, solution="sleep 600\n", yaml_extra="max_test_timeout_sec: 2\n",
                           run_tests="sleep 600\n")
    opts.command_timeout_s = 1
    t0 = time.monotonic()
    ev = run_episode(task, opts, SLOT + 5, lambda env: env.oracle())
    assert time.monotonic() - t0 < 15
    assert ev.reward == -1.0 and ev.details["timed_out"] and "timeout" in ev.details["reason"]


def test_fork_bomb_is_stopped_and_the_env_keeps_working(env):
    t0 = time.monotonic()
    call(env, "shell_exec", command=":(){ :|:& };:", timeout=3)
    # The watcher may kill the shell between two calls (the next call's note says so and runs in a new
    # shell) or during one (that call says so; the call after it runs in a new shell): either way the
    # agent is told, and a later command works.
    out, seen = "", ""
    while time.monotonic() - t0 < 30:
        time.sleep(0.5)
        out, _ = call(env, "shell_exec", command="echo alive", timeout=3)
        seen += out
        if "process limit" in seen and out.endswith("alive\n[exit code 0]"):
            break
    assert "process limit" in seen and out.endswith("alive\n[exit code 0]"), (seen, out)
    out, _ = call(env, "shell_exec", command="echo hello > out.txt && echo ok")
    assert out == "ok\n[exit code 0]"
    assert env.evaluate().success


def test_disk_filler_is_stopped_and_the_env_keeps_working(tmp_path):
    task, opts = user_task(tmp_path)
    opts.disk_mb = 16
    env = TRACK.make_env(task, opts, slot=SLOT + 6)
    try:
        env.reset()
        t0 = time.monotonic()
        out, res = call(env, "shell_exec", command="for i in $(seq 200); do head -c 8M /dev/zero > f$i; done")
        assert time.monotonic() - t0 < 15 and "disk quota" in out and res.info["error"]
        out, _ = call(env, "shell_exec", command="rm -f f* && echo hello > out.txt && echo cleaned")
        assert out.endswith("cleaned\n[exit code 0]")
        assert env.evaluate().success
    finally:
        env.close()


def test_close_is_idempotent_and_keeps_workspace_on_request(tmp_path):
    task, opts = user_task(tmp_path)
    env = TRACK.make_env(task, opts, slot=SLOT + 7)
    env.reset()
    ws = env.workspace
    call(env, "shell_exec", command="sleep 30 &")
    env.close()
    env.close()
    assert not ws.exists()
    opts.keep_workspaces = True
    env.reset()
    ws = env.workspace
    env.close()
    assert ws.is_dir()
    shutil.rmtree(ws)


def test_get_track_finds_the_terminal_track():
    assert get_track("terminal") is TRACK and TRACK.name == "terminal"
