"""Run an agent's command where it cannot hurt the machine: bubblewrap, else unshare.

    box = Sandbox(workspace, level="auto")          # bwrap > unshare; plain only when allowed
    res = box.run("ls -la", timeout_s=30)           # Result(returncode, output, timed_out, reason, ...)
    box.level                                       # "bwrap" | "unshare" | "none"

Levels, strongest first:
- `bwrap` (Debian's bubblewrap): a new root built from read-only binds of the
  system folders (/usr, /etc, /opt and the Python prefixes clawloop runs from),
  the workspace bound read-write at `/app` (terminal-bench's path) and the
  working directory, a private size-capped `/tmp`, `/home`, `/root` and `/work`
  hidden, no network (a fresh network namespace has only a loopback that is
  down), its own PID/IPC/UTS namespaces, killed with its parent.
- `unshare` (util-linux): own PID, network, IPC, UTS and mount namespaces; the
  file system is the host's (writes are still limited by the sandbox user's
  permissions: it can write the workspace and world-writable places only).
- `none`: a plain subprocess, only with `allow_unsandboxed=True`
  (`--allow-unsandboxed`); never chosen silently.

Every level runs the command as an unprivileged user (uid `20000 + slot`,
chosen per sandbox so one environment's processes do not count against
another's) when clawloop runs as root, because Linux does not apply the
process-count limit to root. Limits (per process, inherited): address space
(`memory_mb`), CPU seconds, open files, file size (`file_size_mb`), processes
(`max_procs`, for the sandbox's user), plus a wall-clock `timeout_s` after which
the whole process group (bwrap/unshare: the whole PID namespace) is killed, and a
workspace quota (`disk_mb`) checked while the command runs: a command that
fills the disk is killed and the result says so.

The output is stdout and stderr interleaved, cut to `max_output_bytes` (the
cut is marked). Nothing here raises on a failing command: the reason is in the
`Result` (`timeout`, `killed by signal 9`, `disk quota`, `output cut`).
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import clawloop

log = logging.getLogger(__name__)

LEVELS = ("bwrap", "unshare", "none")
MOUNT_POINT = "/app"
BASE_UID = 20000
_probe_cache: dict[str, str | None] = {}
_probe_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """No sandbox level that was allowed works on this machine; the message says what to install."""


@dataclass
class Limits:
    memory_mb: int = 4096
    """Address space per process (the reference's 4 GB)."""
    cpu_s: int = 300
    file_size_mb: int = 64
    max_procs: int = 64
    open_files: int = 256
    disk_mb: int = 512
    """Workspace quota, checked while a command runs."""
    tmp_mb: int = 64
    """Size of the sandbox's private /tmp (bwrap)."""
    max_output_bytes: int = 64 * 1024


@dataclass
class Result:
    returncode: int
    output: str
    timed_out: bool = False
    reason: str = ""
    """Why the command ended abnormally ("" when it exited on its own)."""
    seconds: float = 0.0
    level: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.reason


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _python_roots() -> list[str]:
    """Folders the sandboxed Python needs read-only: the interpreter, the venv, clawloop's source."""
    roots = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    roots.add(str(Path(clawloop.__file__).resolve().parent.parent))  # src/ of an editable install
    return sorted(r for r in roots if r and os.path.isdir(r))


def _bwrap_args(workspace: Path, limits: Limits, hide: list[str] = ()) -> list[str]:
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    # The new root is a tmpfs; system folders come in read-only, links as links.
    for name in sorted(os.listdir("/")):
        p = "/" + name
        if name in ("proc", "dev", "tmp", "sys", "root", "home", "work", "run", "mnt", "media", "lost+found",
                    "old_root", "farm", "boot", "srv", "var"):
            continue
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p) and name in ("usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            args += ["--ro-bind", p, p]
    # /tmp and /var/tmp as on any system (1777): the sandbox user runs mktemp and test runners' tmp_path
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(limits.tmp_mb << 20),
             "--tmpfs", "/tmp", "--dir", "/var", "--perms", "1777", "--dir", "/var/tmp", "--dir", "/run"]
    ws = str(workspace)
    made: set[str] = set()
    for root in _python_roots():
        if ws == root or ws.startswith(root + os.sep):
            continue
        for anc in reversed(Path(root).parents):  # bwrap would make them 0700: the sandbox user could not pass
            a = str(anc)
            if a != "/" and a not in made and a.split("/")[1] not in ("usr", "etc", "opt"):
                made.add(a)
                args += ["--perms", "0755", "--dir", a]
        args += ["--ro-bind", root, root]
    for h in hide:  # answers that live beside the code the sandboxed python needs (shipped tasks' solutions)
        args += ["--tmpfs", h]
    args += ["--bind", ws, MOUNT_POINT]
    if ws != MOUNT_POINT:  # paths the task files name stay valid inside too
        args += ["--bind", ws, ws]
    args += ["--chdir", MOUNT_POINT]
    return args


def _hidden(extra: list[str | os.PathLike[str]]) -> list[str]:
    """Folders to cover with an empty tmpfs under bwrap: clawloop's data (shipped tasks with their
    solutions and tests, SWE gold patches) plus `extra`; only those inside what bwrap binds
    (it cannot make a mount point in a folder it did not bind), outermost only."""
    visible = [Path(r) for r in _python_roots()] + [Path("/usr"), Path("/etc"), Path("/opt")]
    want = [Path(clawloop.__file__).resolve().parent / "data"] + [Path(h) for h in extra]
    shown = [h.resolve() for h in want if h.is_dir() and any(h.resolve().is_relative_to(v) for v in visible)]
    return sorted({str(h) for h in shown if not any(h != o and h.is_relative_to(o) for o in shown)})


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, process group) of every process descending from `pid`, as the host sees them."""
    children: dict[int, list[tuple[int, int]]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append((int(d), int(fields[2])))
        except (OSError, IndexError, ValueError):
            continue
    out: list[tuple[int, int]] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += [k for k, _ in kids]
    return out


def _unshare_args() -> list[str]:
    return ["unshare", "--fork", "--pid", "--mount-proc", "--net", "--ipc", "--uts", "--kill-child"]


def probe(level: str) -> str | None:
    """None when `level` works here, else why not (cached per process)."""
    with _probe_lock:
        if level in _probe_cache:
            return _probe_cache[level]
    why: str | None = None
    if level == "bwrap":
        if shutil.which("bwrap") is None:
            why = "bubblewrap is not installed (Debian: apt-get install bubblewrap; `make sysdeps` as root)"
    elif level == "unshare":
        if shutil.which("unshare") is None:
            why = "unshare (util-linux) is not installed"
    elif level == "none":
        why = None
    else:
        why = f"unknown sandbox level {level!r} (one of {', '.join(LEVELS)})"
    if why is None and level != "none":
        with tempfile.TemporaryDirectory(prefix="clawloop-probe-") as d:
            r = Sandbox(d, level=level, limits=Limits(disk_mb=0))._exec("echo ok", timeout_s=20)
            if r.returncode != 0 or "ok" not in r.output:
                why = f"{level} does not run here: {r.output.strip()[-300:] or r.reason}"
    with _probe_lock:
        _probe_cache[level] = why
    return why


def choose_level(level: str = "auto", *, allow_unsandboxed: bool = False) -> str:
    """The level to use: `level` itself when it works, for `auto` the strongest that works.
    Raises SandboxUnavailable naming what is missing."""
    if level == "none" and not allow_unsandboxed:
        raise SandboxUnavailable("sandbox level 'none' runs agent commands unsandboxed; pass --allow-unsandboxed")
    wanted = ["bwrap", "unshare"] + (["none"] if allow_unsandboxed else []) if level == "auto" else [level]
    reasons = []
    for lv in wanted:
        why = probe(lv)
        if why is None:
            if lv != wanted[0]:
                log.warning("sandbox: using %s (%s)", lv, "; ".join(reasons))
            return lv
        reasons.append(f"{lv}: {why}")
    raise SandboxUnavailable("no sandbox works here: " + "; ".join(reasons) +
                             ("" if allow_unsandboxed else " (or pass --allow-unsandboxed to run commands unsandboxed)"))


def _dir_size(path: str, cap: int) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
            if total > cap:
                return total
    return total


class Sandbox:
    """One workspace and the way commands run in it. Cheap: no process lives between commands."""

    def __init__(self, workspace: str | os.PathLike[str], *, level: str = "auto", allow_unsandboxed: bool = False,
                 limits: Limits | None = None, slot: int = 0, env: dict[str, str] | None = None,
                 hide: list[str | os.PathLike[str]] = ()):
        self.workspace = Path(workspace).resolve()
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.limits = limits or Limits()
        self.level = level if level in LEVELS and level != "auto" and (level != "none" or allow_unsandboxed) \
            else choose_level(level, allow_unsandboxed=allow_unsandboxed)
        self.uid = BASE_UID + (slot % 10000) if _is_root() else None
        self.hide = _hidden(list(hide))
        self.env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                    "HOME": MOUNT_POINT if self.level == "bwrap" else str(self.workspace),
                    "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb",
                    "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@sandbox",
                    "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@sandbox"}
        # The sandbox user may not reach the venv's interpreter (say under a 0700 /root) outside bwrap's
        # rebuilt root; clawloop's own in-sandbox helpers (the test runner) are stdlib-only and found this way.
        self.env["PYTHONPATH"] = str(Path(clawloop.__file__).resolve().parent.parent)
        self.env.update(env or {})
        self.own_workspace()

    @property
    def cwd(self) -> str:
        """The workspace as commands see it."""
        return MOUNT_POINT if self.level == "bwrap" else str(self.workspace)

    def own_workspace(self) -> None:
        """Give the workspace to the sandbox user (after the host wrote files into it)."""
        if self.uid is None:
            return
        for root, dirs, files in os.walk(self.workspace):
            for name in [root] + [os.path.join(root, x) for x in dirs + files]:
                try:
                    os.lchown(name, self.uid, self.uid)
                except OSError:
                    pass

    def _argv(self, command: str) -> list[str]:
        shell = ["/bin/bash", "-c", command] if os.path.exists("/bin/bash") else ["/bin/sh", "-c", command]
        drop = ([shutil.which("setpriv") or "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}",
                 "--clear-groups"] if self.uid is not None else [])
        if self.level == "bwrap":
            return _bwrap_args(self.workspace, self.limits, self.hide) + ["--"] + drop + shell
        if self.level == "unshare":
            return _unshare_args() + drop + shell
        return drop + shell

    def _preexec(self) -> None:
        lim = self.limits
        os.setsid()
        for res, value in ((resource.RLIMIT_AS, lim.memory_mb << 20), (resource.RLIMIT_CPU, lim.cpu_s),
                           (resource.RLIMIT_FSIZE, lim.file_size_mb << 20), (resource.RLIMIT_NOFILE, lim.open_files),
                           (resource.RLIMIT_NPROC, lim.max_procs), (resource.RLIMIT_CORE, 0)):
            try:
                resource.setrlimit(res, (value, value))
            except (ValueError, OSError):
                pass

    def spawn(self, command: str) -> subprocess.Popen[bytes]:
        """A long-lived sandboxed process (say an interactive shell) with pipes on stdin and
        stdout (stderr merged), same levels and limits as `run` but no timeout or quota watch:
        the caller polls and ends it with `kill(proc)`."""
        return subprocess.Popen(self._argv(command), cwd=str(self.workspace), env=self.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=self._preexec)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self._kill(proc)

    def workspace_bytes(self) -> int:
        return _dir_size(str(self.workspace), 1 << 62)

    def run(self, command: str, *, timeout_s: float = 120.0, stdin: str | None = None) -> Result:
        return self._exec(command, timeout_s=timeout_s, stdin=stdin)

    def _exec(self, command: str, *, timeout_s: float, stdin: str | None = None) -> Result:
        lim = self.limits
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(self._argv(command), cwd=str(self.workspace), env=self.env,
                                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=self._preexec)
        except OSError as e:
            return Result(127, f"cannot start the sandbox: {e}", reason=f"start failed: {e}", level=self.level)
        chunks: list[bytes] = []
        size = [0]
        cut = [False]

        def read() -> None:
            assert proc.stdout is not None
            while True:
                b = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(65536)
                if not b:
                    return
                if size[0] < lim.max_output_bytes:
                    chunks.append(b[: lim.max_output_bytes - size[0]])
                if size[0] + len(b) > lim.max_output_bytes:
                    cut[0] = True
                size[0] += len(b)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if stdin is not None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(stdin.encode())
                proc.stdin.close()
            except OSError:
                pass
        reason = ""
        deadline = t0 + timeout_s
        quota = lim.disk_mb << 20
        next_check = t0 + 0.25
        while True:
            try:
                proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= deadline:
                reason = f"timeout after {timeout_s:g} s"
                break
            if quota and now >= next_check:
                next_check = now + 0.5
                if _dir_size(str(self.workspace), quota) > quota:
                    reason = f"disk quota: workspace over {lim.disk_mb} MB"
                    break
        if reason:
            self._kill(proc)
        reader.join(timeout=5)
        rc = proc.returncode if proc.returncode is not None else -9
        out = b"".join(chunks).decode("utf-8", "replace")
        if cut[0]:
            out += f"\n[output cut: {size[0]} bytes, first {lim.max_output_bytes} shown]"
        if not reason and rc < 0:
            reason = f"killed by signal {-rc} ({signal.Signals(-rc).name})" if -rc in signal.valid_signals() \
                else f"killed by signal {-rc}"
        if not reason and rc in (128 + signal.SIGXFSZ, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            reason = {128 + signal.SIGXFSZ: "file size limit", 128 + signal.SIGXCPU: "cpu time limit",
                      128 + signal.SIGKILL: "killed (memory or process limit)"}[rc]
        return Result(rc, out, timed_out=reason.startswith("timeout"), reason=reason,
                      seconds=time.monotonic() - t0, level=self.level)

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill the command's whole process group (and with bwrap/unshare its PID namespace), and the
        groups of its descendants: an interactive shell or a setsid() moves to a group of its own, and
        setpriv clears the parent-death signal `unshare --kill-child` relies on."""
        own = os.getpgid(0)
        groups = {proc.pid} | {g for _, g in descendants(proc.pid)}
        for pgid in groups - {own}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def describe(self) -> dict[str, Any]:
        """What an item's metadata records about where its commands ran."""
        return {"level": self.level, "uid": self.uid, "memory_mb": self.limits.memory_mb,
                "max_procs": self.limits.max_procs, "file_size_mb": self.limits.file_size_mb,
                "disk_mb": self.limits.disk_mb, "network": self.level == "none"}
