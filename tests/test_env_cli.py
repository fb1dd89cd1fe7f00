"""The agent-track commands as a user runs them: `clawloop env check`, `clawloop envpool`, and
`clawloop buffer` starting the ENV_TYPE track's rollout by itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from conftest import free_port, needs_part, run_cli

from clawloop.envs.sandbox import probe

pytestmark = needs_part("sandbox", probe("bwrap") and probe("unshare")
                        and f"no sandbox level runs here: {probe('bwrap')}; {probe('unshare')}")


def test_env_check_toolcall(tmp_path):
    r = run_cli("env", "check", "--track", "toolcall", "--tasks", "math-000,gen-001,math-042")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "oracle_pass=3/3 noop_fail=3/3"
    assert "env check toolcall" in r.stderr  # progress lines
    bad = run_cli("env", "check", "--track", "toolcall", "--tasks", "nope")
    assert bad.returncode == 2 and "nope" in bad.stderr
    alias = run_cli("env", "check", "--tasks", "math-000", env={"ENV_TYPE": "toolcall", "MAX_STEPS": "3"})
    assert alias.returncode == 0 and "oracle_pass=1/1" in alias.stdout
    none = run_cli("env", "check", env={"ENV_TYPE": ""})
    assert none.returncode == 2 and "env.track" in none.stderr


def _wait(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not come up")


def test_envpool_serves_the_lease_api(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "envpool", "--track", "toolcall", "--port",
                             str(port), "--parallel-envs", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url + "/health", proc)
        assert "math-000" in httpx.get(url + "/tasks").json()["task_ids"]
        lease = httpx.post(url + "/allocate", json={"task_id": "math-000"}).json()
        assert httpx.post(url + "/allocate", json={}).status_code == 429  # capacity 1
        first = httpx.post(url + "/reset", json={"lease_id": lease["lease_id"]}).json()
        assert first["tools"][0]["function"]["name"] == "code_interpreter"  # the default tool
        call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "code_interpreter", "arguments": json.dumps({"code": "print(60+23)"})}}]}
        out = httpx.post(url + "/step", json={"lease_id": lease["lease_id"], "message": call}).json()
        assert out["messages"][0]["content"] == "83"
        st = httpx.get(url + "/status").json()
        assert st["active"] == 1 and st["capacity"] == 1
        assert httpx.post(url + "/close", json={"lease_id": lease["lease_id"]}).json() == {"closed": True}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    refused = run_cli("envpool", "--track", "toolcall", "--host", "0.0.0.0", "--port", str(free_port()))
    assert refused.returncode == 2 and "--insecure" in refused.stderr
