"""The agent sandbox: real bubblewrap / unshare, real limits. Skips (with the reason) where a level
cannot run; `make sysdeps` installs bubblewrap as root on Debian."""

from __future__ import annotations

import os
import time

import pytest

from conftest import needs_part

from clawloop.envs.sandbox import Limits, Sandbox, SandboxUnavailable, choose_level, probe

LEVELS = [pytest.param(lv, marks=needs_part("sandbox", probe(lv) and f"{lv}: {probe(lv)}"))
          for lv in ("bwrap", "unshare")]


@pytest.fixture(params=LEVELS)
def box(request, tmp_path):
    return Sandbox(tmp_path / "ws", level=request.param, slot=7,
                   limits=Limits(disk_mb=40, file_size_mb=16, max_procs=32, memory_mb=1024))


def test_commands_run_in_the_workspace_as_an_unprivileged_user(box):
    r = box.run("echo hi > f.txt && pwd && id -u && cat f.txt")
    assert r.ok, r
    lines = r.output.split()
    assert lines[0] == box.cwd and lines[-1] == "hi"
    if os.geteuid() == 0:
        assert lines[1] == str(box.uid) and box.uid != 0
    assert (box.workspace / "f.txt").read_text() == "hi\n"
    # the project's Python (and clawloop) is there, read-only
    r = box.run("python3 -c 'import clawloop, sys; print(sys.prefix)'")
    assert r.ok, r.output


def test_no_network(box):
    r = box.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\"", timeout_s=20)
    assert r.returncode != 0 and ("unreachable" in r.output or "Errno" in r.output), r.output


def test_nothing_escapes_the_workspace(box, tmp_path):
    outside = tmp_path / "outside.txt"
    r = box.run(f"echo x > {outside}; echo y > /usr/evil; echo z > /etc/evil; ls /root")
    assert not outside.exists() and not os.path.exists("/usr/evil") and not os.path.exists("/etc/evil")
    if box.level == "bwrap":
        assert "Read-only file system" in r.output


def test_timeout_kills_everything(box):
    t0 = time.monotonic()
    r = box.run("sleep 60 & sleep 60; echo never", timeout_s=1.5)
    assert r.timed_out and "timeout" in r.reason and "never" not in r.output
    assert time.monotonic() - t0 < 15


def test_fork_bomb_is_bounded(box):
    t0 = time.monotonic()
    r = box.run(":(){ :|:& };:; sleep 2", timeout_s=8)
    assert time.monotonic() - t0 < 20
    assert box.run("echo alive").ok  # the machine and the sandbox still work
    del r


def test_file_size_and_disk_quota(box):
    r = box.run("head -c 50000000 /dev/zero > big", timeout_s=20)
    assert r.returncode != 0 and (box.workspace / "big").stat().st_size <= 16 << 20
    (box.workspace / "big").unlink()
    t0 = time.monotonic()
    r = box.run("for i in $(seq 100); do head -c 10000000 /dev/zero > f$i; done", timeout_s=60)
    assert "disk quota" in r.reason, r
    assert time.monotonic() - t0 < 30
    for f in box.workspace.glob("f*"):
        f.unlink()


def test_memory_limit(box):
    r = box.run("python3 -c 'x = bytearray(3 << 30)'", timeout_s=30)
    assert r.returncode != 0 and "MemoryError" in r.output


def test_output_is_capped(box):
    r = box.run("head -c 1000000 /dev/zero | tr '\\0' a")
    assert len(r.output) < box.limits.max_output_bytes + 200 and "output cut" in r.output


def test_unsandboxed_needs_to_be_asked_for(tmp_path):
    with pytest.raises(SandboxUnavailable, match="allow-unsandboxed"):
        choose_level("none")
    box = Sandbox(tmp_path, level="none", allow_unsandboxed=True)
    assert box.level == "none" and box.run("echo ok").output.strip() == "ok"
    assert box.describe()["network"] is True
