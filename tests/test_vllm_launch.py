"""No vLLM process outlives its owner (issue #30 item 5), with the real launcher and `VLLMProcess`.

A stand-in `vllm` package (the launcher runs `vllm.entrypoints.openai.api_server`) starts an "engine
core" child that ignores SIGTERM, as vLLM's engine core and workers outlived a killed owner before
(2.6 GB left behind per replica). The owner is killed with SIGKILL, or the launcher is, or the owner
stops the server as clawloop does; every process of the server's group must be gone, and so must the
reaper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clawloop.engines.vllm_process import LAUNCHER

API_SERVER = '''
import os, subprocess, sys, time
out = sys.argv[sys.argv.index("--pidfile") + 1]
core = subprocess.Popen([sys.executable, "-c",
                         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
with open(out + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {core.pid}")
os.replace(out + ".tmp", out)
time.sleep(600)
'''

OWNER = '''
import os, sys, time
from pathlib import Path
from clawloop.engines.vllm_process import VLLMProcess

fake, pidfile, log = sys.argv[1:4]
env = dict(os.environ, PYTHONPATH=fake, CLAWLOOP_REAP_GRACE_S="1")
p = VLLMProcess(Path(sys.executable), ["--pidfile", pidfile], env, Path(log))
p.start()
if sys.argv[4] == "stop":
    while not os.path.exists(pidfile):
        time.sleep(0.05)
    p.stop(grace_s=1)
    print("stopped", flush=True)
time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2] not in "ZX"


def _started(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()[19]


def _launcher_processes(pidfile: Path) -> list[int]:
    """The launcher and its reaper (a fork of it: the same command line), found by this test's pidfile."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(LAUNCHER).encode() in cmd and str(pidfile).encode() in cmd and _alive(int(name)):
                out.append(int(name))
    return out


def _wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.fixture
def server(tmp_path):
    fake = tmp_path / "fake"
    (fake / "vllm" / "entrypoints" / "openai").mkdir(parents=True)
    for d in ("vllm", "vllm/entrypoints", "vllm/entrypoints/openai"):
        (fake / d / "__init__.py").write_text("")
    (fake / "vllm" / "entrypoints" / "openai" / "api_server.py").write_text(textwrap.dedent(API_SERVER))
    owners: list[subprocess.Popen] = []
    started: list[tuple[int, str | None]] = []  # (pid, start time): a reused pid is not ours
    pidfile = tmp_path / "pids"

    def start(mode: str = "run") -> tuple[subprocess.Popen, int, int]:
        owner = subprocess.Popen([sys.executable, "-c", OWNER, str(fake), str(pidfile), str(tmp_path / "log"), mode],
                                 stdout=subprocess.PIPE, text=True)
        owners.append(owner)
        deadline = time.monotonic() + 30
        while not pidfile.exists():
            assert time.monotonic() < deadline and owner.poll() is None, "the stand-in server did not start"
            time.sleep(0.05)
        launcher, core = map(int, pidfile.read_text().split())
        started.extend((pid, _started(pid)) for pid in [launcher, core, *_launcher_processes(pidfile)])
        return owner, launcher, core

    yield start, pidfile
    for o in owners:  # only what this test started
        if o.poll() is None:
            o.kill()
            o.wait()
    for pid, t0 in started:  # a failed test must not leave its stand-in engine behind either
        if _alive(pid) and _started(pid) == t0:
            os.kill(pid, signal.SIGKILL)


def test_the_engine_dies_with_an_owner_killed_by_sigkill(server):
    start, pidfile = server
    owner, launcher, core = start()
    reaper = [p for p in _launcher_processes(pidfile) if p != launcher]
    assert len(reaper) == 1 and _alive(core)
    os.kill(owner.pid, signal.SIGKILL)  # no cleanup code of the owner's runs
    owner.wait()
    assert _wait_gone([launcher, core, *reaper]) == []


def test_the_engine_dies_with_its_launcher_killed_while_the_owner_lives(server):
    """A Ray VLLMHost or clawloop that lives on while the API server process was killed: the engine
    core must not stay behind holding its memory."""
    start, pidfile = server
    owner, launcher, core = start()
    reaper = [p for p in _launcher_processes(pidfile) if p != launcher]
    os.kill(launcher, signal.SIGKILL)
    assert _wait_gone([core, *reaper]) == []
    assert owner.poll() is None


def test_a_clean_stop_leaves_no_reaper(server):
    start, pidfile = server
    owner, launcher, core = start("stop")
    assert owner.stdout.readline().strip() == "stopped"
    assert _wait_gone([launcher, core]) == []
    assert _wait_gone(_launcher_processes(pidfile)) == []  # the reaper saw its group empty and left


def test_ci_fails_when_an_engine_process_survives():
    """scripts/check_leftovers.sh, the last step of .ci/run, names a surviving VLLM:: process."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_leftovers.sh"
    fake = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 60"])
    try:
        deadline = time.monotonic() + 10
        while b"VLLM::EngineCore" not in Path(f"/proc/{fake.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True)
        assert r.returncode == 1 and str(fake.pid) in r.stderr and "outlived the run" in r.stderr
    finally:
        fake.kill()
        fake.wait()
