"""The GUI track: MiniWoB++ pages in the system chromium, through both backends (playwright, selenium):
oracles pass and doing nothing fails, observations carry refs and a real PNG, bad actions are readable tool
errors, the env pool's capacity holds, a crashed or hung browser is replaced, and no chromium outlives close."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import struct
import time

import pytest

from conftest import needs_part

from clawloop.envs import gui
from clawloop.envs.base import NOOP_MESSAGE, EnvOptions, assistant_tool_call, get_track

pytestmark = pytest.mark.browser  # `make test-browser`
WHY = {b: gui.missing_requirements(b) for b in gui.BACKENDS}
needs = {b: needs_part("browser", WHY[b] and f"gui track with {b} cannot run here: {WHY[b]}")
         for b in gui.BACKENDS}
BOTH = [pytest.param(b, marks=needs[b]) for b in gui.BACKENDS]
FEW = ["choose-list", "click-checkboxes", "click-collapsible-nodelay", "enter-text", "use-autocomplete"]


@pytest.fixture(scope="module", autouse=True)
def _no_browser_left():
    yield
    gui.close_browsers()


def env_for(task_id: str, **opts):
    env = gui.TRACK.make_env(gui.TRACK.get_task(task_id), EnvOptions(**opts))
    return env


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


# ---- without a browser ----------------------------------------------------------------------------------------

@needs_part("browser", "miniwob" in WHY["playwright"] and "miniwob is not installed")
def test_tasks_solvers_and_options():
    from clawloop.envs.gui.solvers import SOLVERS

    track = get_track("gui")
    ids = [t.task_id for t in track.load_tasks(EnvOptions())]
    assert ids == list(gui.SOLVED_TASKS) and len(ids) >= 20 and set(ids) == set(SOLVERS)
    assert {t.data["seed"] for t in track.load_tasks(EnvOptions())} == {f"clawloop-gui:{i}" for i in ids}
    assert gui.effective_max_steps(EnvOptions()) == 15 and gui.effective_max_steps(EnvOptions(max_steps=4)) == 4
    with pytest.raises(ValueError, match="SCREENSHOT_BACKEND"):
        track.make_env(track.get_task("click-test"), EnvOptions(screenshot_backend="firefox"))
    with pytest.raises(ValueError, match="gui_observation"):
        track.load_tasks(EnvOptions(gui_observation="video"))
    with pytest.raises(ValueError, match="no MiniWoB"):
        track.get_task("no-such-task")
    unsolved = track.get_task("drag-box")
    assert unsolved.task_id not in ids
    with pytest.raises(ValueError, match="no scripted solution"):
        track.make_env(unsolved, EnvOptions()).oracle()


def test_element_lines_and_keys():
    lines = gui.format_elements([
        {"ref": 3, "tag": "button", "role": "button", "text": "Submit", "depth": 0},
        {"ref": 5, "tag": "input", "role": "input", "type": "text", "label": "Username", "value": "", "depth": 0},
        {"ref": 7, "tag": "input", "role": "checkbox", "label": "ksa", "checked": False, "depth": 1},
        {"ref": 9, "tag": "select", "role": "select", "value": "Spain", "depth": 0, "focused": True},
        {"ref": 10, "tag": "option", "role": "option", "text": "Spain", "selected": True, "depth": 1},
    ]).splitlines()
    assert lines == ['[3] button "Submit"', '[5] input text "Username" value=""', '  [7] checkbox "ksa" checked=false',
                     '[9] select value="Spain" focused', '  [10] option "Spain" selected']
    assert gui.actions.keys_of("ctrl+a") == ["Control", "a"] and gui.actions.keys_of("Return") == ["Enter"]
    with pytest.raises(gui.ActionError, match="unknown key"):
        gui.actions.keys_of("Hyper+q")


# ---- through the real browser -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BOTH)
def test_check_oracle_passes_and_doing_nothing_fails(backend):
    from clawloop.envs.check import run_check

    out = io.StringIO()
    results = run_check("gui", EnvOptions(screenshot_backend=backend), task_ids=FEW, parallel=2, out=out)
    n = len(FEW)
    assert out.getvalue().strip().splitlines()[-1] == f"oracle_pass={n}/{n} noop_fail={n}/{n}"
    assert [r.oracle_reward for r in results] == [1.0] * n and [r.noop_reward for r in results] == [-1.0] * n


@needs["playwright"]
def test_observation_has_refs_and_a_png():
    env = env_for("enter-text", gui_observation="both")
    try:
        first = env.reset()
        assert first.tools[0]["function"]["name"] == "computer"
        text, image = first.messages[1]["content"]
        assert text["type"] == "text" and image["type"] == "image_url"
        assert 'Task: Enter "' in text["text"] and '] button "Submit"' in text["text"]
        url = image["image_url"]["url"]
        assert url.startswith("data:image/png;base64,")
        png = base64.b64decode(url.split(",", 1)[1])
        assert png == env.last_screenshot and png_size(png) == gui.TASK_AREA
        assert first.info["screenshot_png_b64"] == url.split(",", 1)[1]  # what the rollout saves as the reset's PNG
        field = next(line for line in text["text"].splitlines() if "input text" in line)
        ref = int(field.split("]")[0].strip(" ["))
        out = env.step(assistant_tool_call("computer", {"action": "type", "ref": ref, "text": "hello"}))
        assert not out.done and base64.b64decode(out.info["screenshot_png_b64"]) == env.last_screenshot
        after = out.messages[0]["content"][0]["text"]
        assert f'[{ref}] input text value="hello" focused' in after  # same ref, new value
        assert png_size(env.last_screenshot) == gui.TASK_AREA
        # no network: http(s) never leaves the browser
        assert env._js("net", "() => fetch('http://example.com/').then(() => 'reached', () => 'blocked')") == "blocked"
    finally:
        env.close()
    dom = env_for("click-test")
    try:
        assert isinstance(dom.reset().messages[1]["content"], str) and png_size(dom.last_screenshot)
    finally:
        dom.close()


@needs["playwright"]
def test_bad_actions_are_readable_tool_errors():
    env = env_for("click-button")
    try:
        env.reset()
        calls = [("computer", {"action": "click", "ref": 9999}), ("computer", {"action": "click"}),
                 ("computer", {"action": "type", "ref": 1, "text": "x"}),
                 ("computer", {"action": "press", "key": "Hyper"}), ("computer", {"action": "fly"}),
                 ("computer", {"action": "click_xy", "x": 900, "y": 5}),
                 ("computer", {"action": "select", "ref": 1, "option": "a"}),
                 ("browser", {"action": "click", "ref": 1}), ("computer", {"action": "scroll"}),
                 ("computer", {"action": "click", "ref": "abc"})]
        msg = {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)]}
        msg["tool_calls"].append({"id": "raw", "type": "function",
                                  "function": {"name": "computer", "arguments": "{oops"}})
        out = env.step(msg)
        texts = [m["content"] for m in out.messages]
        assert not out.done and len(texts) == len(calls) + 1
        assert all(t.startswith("error: ") for t in texts), texts
        assert "no element [9999]" in texts[0] and "`ref` is required" in texts[1]
        assert "not a text field" in texts[2] and "unknown key" in texts[3] and "unknown action 'fly'" in texts[4]
        assert "inside the page" in texts[5] and "not a dropdown" in texts[6]
        assert "no tool named 'browser'" in texts[7] and "needs `dx`" in texts[8] and "must be an element" in texts[9]
        assert "not JSON" in texts[-1] or "not a JSON object" in texts[-1]
        assert "Elements:" in texts[-1]  # the observation still comes with the last answer
        for m in env.oracle():  # the episode goes on after the errors
            if env.step(m).done:
                break
        ev = env.evaluate()
        assert ev.reward == 1.0 and ev.details["action_errors"] == len(calls) + 1
    finally:
        env.close()
    quiet = env_for("click-button")
    try:
        quiet.reset()
        assert quiet.step(dict(NOOP_MESSAGE)).done
        ev = quiet.evaluate()
        assert ev.reward == -1.0 and ev.details["raw_reward"] is None and ev.details["end_reason"] == "no_action"
    finally:
        quiet.close()


@needs["playwright"]
def test_env_pool_capacity_one_refuses_a_second_lease():
    from clawloop.envs.pool import EnvPool, PoolError

    pool = EnvPool("gui", EnvOptions(), capacity=1)
    try:
        a = pool.allocate("click-test")
        assert "[" in pool.reset(a["lease_id"])["messages"][1]["content"]
        with pytest.raises(PoolError) as full:
            pool.allocate("click-button")
        assert full.value.status == 429 and pool.status()["refused_full"] == 1
        for m in pool.oracle(a["lease_id"])["messages"]:
            if pool.step(a["lease_id"], m)["done"]:
                break
        assert pool.evaluate(a["lease_id"])["reward"] == 1.0
        pool.close(a["lease_id"])
        b = pool.allocate("click-button")
        assert pool.reset(b["lease_id"])["tools"][0]["function"]["name"] == "computer"
        pool.close(b["lease_id"])
    finally:
        pool.shutdown()


@needs["playwright"]
def test_a_crashed_or_hung_browser_is_replaced():
    env = env_for("click-test", command_timeout_s=5)
    try:
        env.reset()
        pid = env.browser.chromium.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(gui.GuiBrowserError, match="crashed|gone"):
            env.step(assistant_tool_call("computer", {"action": "click", "ref": 4}))
    finally:
        env.close()
    assert not alive(pid)
    again = env_for("click-test", command_timeout_s=5)
    try:
        again.reset()
        pid2 = again.browser.chromium.pid
        assert pid2 != pid and alive(pid2)
        t0 = time.monotonic()
        with pytest.raises(gui.GuiBrowserError, match="hung"):
            again._js("spin", "() => { while (true) {} }", timeout=2)
        assert time.monotonic() - t0 < 10 and not alive(pid2)
    finally:
        again.close()
    fresh = env_for("click-test")
    try:
        assert fresh.reset().messages and fresh.browser.chromium.pid not in (pid, pid2)
    finally:
        fresh.close()


@pytest.mark.parametrize("backend", BOTH)
def test_no_chromium_survives_close(backend):
    envs = [env_for("click-test", screenshot_backend=backend) for _ in range(2)]
    for e in envs:
        e.reset()
    groups = gui.started_process_groups()
    pids = [p for g in groups for p in gui.chromium.group_pids(g)]
    stats = gui.browser_stats()
    assert groups and pids and all(s["rss_mb"] > 0 for s in stats)
    for e in envs:
        e.close()
    gui.close_browsers()
    assert gui.started_process_groups() == []
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


def test_env_check_says_what_is_missing():
    from conftest import run_cli

    r = run_cli("env", "check", "--track", "gui", "--tasks", "click-button",
                env={"CLAWLOOP_CHROMIUM": "/nonexistent/chromium"})
    assert r.returncode != 0
    assert "env.screenshot_backend: the gui track cannot run here" in r.stderr and "/nonexistent/chromium" in r.stderr
