"""Chromium processes for the GUI track: launched here, each in a process group of its own, and killed whole.

Chromium (/usr/bin/chromium, or $CLAWLOOP_CHROMIUM) runs headless with a temporary
profile and no network (every host unresolvable, a dead proxy), listening only on
its DevTools port on 127.0.0.1. Its group is led by a small watchdog shell holding
a pipe from this process, so it also goes when this process is killed outright
(SIGKILL, OOM) and no atexit hook runs; every group started is registered, and
`started_process_groups()` lists the ones not killed yet. The window's geometry
(`VIEWPORT`, the task area `TASK_AREA`) is fixed here, so both backends render the same.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path


log = logging.getLogger(__name__)

BACKENDS = ("playwright", "selenium")
VIEWPORT = (500, 320)
TASK_AREA = (160, 210)
LAUNCH_TIMEOUT_S = 30.0


class GuiBrowserError(RuntimeError):
    """The browser crashed, hung or could not be started: the episode cannot go on."""


def chromium_path() -> str:
    return os.environ.get("CLAWLOOP_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def chromedriver_path() -> str:
    return os.environ.get("CLAWLOOP_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"


def missing_requirements(backend: str = "playwright") -> str:
    """'' when `backend` can run here, else why not (what the tests' skip reason says)."""
    if backend not in BACKENDS:
        return f"unknown screenshot backend {backend!r} (one of {', '.join(BACKENDS)})"
    why = []
    if importlib.util.find_spec("miniwob") is None:
        why.append("python package miniwob is not installed (pip install -e '.[gui]')")
    if importlib.util.find_spec(backend) is None:
        why.append(f"python package {backend} is not installed (pip install -e '.[gui]')")
    if not os.access(chromium_path(), os.X_OK):
        why.append(f"no chromium at {chromium_path()} (make sysdeps, or set CLAWLOOP_CHROMIUM)")
    if backend == "selenium" and not os.access(chromedriver_path(), os.X_OK):
        why.append(f"no chromedriver at {chromedriver_path()} (apt-get install chromium-driver, or set "
                   "CLAWLOOP_CHROMEDRIVER)")
    return "; ".join(why)


CHROMIUM_FLAGS = [
    "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
    "--disable-background-networking", "--disable-sync", "--disable-component-update", "--disable-default-apps",
    "--disable-breakpad", "--disable-crash-reporter", "--disable-domain-reliability", "--mute-audio",
    "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows", "--disable-features=Translate,MediaRouter,OptimizationHints,"
    "AutofillServerCommunication,CertificateTransparencyComponentUpdater,DialMediaRouteProvider",
    "--disable-dev-shm-usage", "--password-store=basic", "--use-mock-keychain", "--metrics-recording-only",
    f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "--force-device-scale-factor=1", "--lang=en-US",
    # no network: every host is unresolvable and every http(s)/ws request goes to a closed port
    "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
]


def group_pids(pgid: int) -> list[int]:
    """Processes whose process group is `pgid` (a browser and every process it forked)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d))
    return out


def own_children(word: str) -> list[int]:
    """Child processes of this process whose command line mentions `word`."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            if int(stat[stat.rfind(")") + 2:].split()[1]) != me:
                continue
            if word in Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace"):
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def memory_of(pids: list[int]) -> dict[str, float]:
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return {"processes": len(pids), "rss_mb": round(rss / 1024, 1), "pss_mb": round(pss / 1024, 1)}


class ChromiumProcess:
    """One headless chromium in a process group of its own, with a throwaway profile."""

    def __init__(self, label: str = ""):
        self.dir = tempfile.mkdtemp(prefix=f"clawloop-chromium-{label}-")
        self.profile = Path(self.dir) / "profile"
        self.profile.mkdir()
        self.log_path = Path(self.dir) / "chromium.log"
        self.proc: subprocess.Popen | None = None
        self.chromium_pid = 0
        self.port = 0
        self.sandboxed = os.geteuid() != 0 and os.environ.get("CLAWLOOP_CHROMIUM_NO_SANDBOX") != "1"
        self.launch_s = 0.0

    def start(self, timeout_s: float = LAUNCH_TIMEOUT_S) -> "ChromiumProcess":
        t0 = time.monotonic()
        try:
            self._start(timeout_s)
        except GuiBrowserError as e:
            if not self.sandboxed or "sandbox" not in str(e).lower():
                raise
            log.warning("gui: chromium's sandbox is not usable here; running it with --no-sandbox")
            self.kill()
            self.sandboxed = False
            self._start(timeout_s)
        self.launch_s = time.monotonic() - t0
        return self

    def _start(self, timeout_s: float) -> None:
        args = [chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}"]
        if not self.sandboxed:
            args.append("--no-sandbox")
        args.append("about:blank")
        env = dict(os.environ, TZ="UTC", LANG="en_US.UTF-8", LANGUAGE="en_US")
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(["/bin/sh", "-c", _WATCHDOG, "clawloop-chromium", *args],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, env=env,
                                         start_new_session=True, close_fds=True)
        register_group(self.proc.pid)
        line = self.proc.stdout.readline().strip()
        self.proc.stdout.close()
        if not line.isdigit():
            raise GuiBrowserError(f"could not start chromium: {self.log_tail()}")
        self.chromium_pid = int(line)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise GuiBrowserError(f"chromium exited at start: {self.log_tail()}")
            try:
                lines = port_file.read_text().split()
            except OSError:
                lines = []
            if len(lines) >= 2 and lines[0].isdigit():
                self.port = int(lines[0])
                return
            time.sleep(0.02)
        raise GuiBrowserError(f"chromium did not open its DevTools port in {timeout_s:g} s: {self.log_tail()}")

    def log_tail(self, n: int = 600) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip() and "dbus" not in ln.lower()
                 and "unexpected operator" not in ln]
        return " | ".join(lines)[-n:]

    @property
    def pid(self) -> int:
        """The browser process (the leader of its process group is the watchdog shell, `pgid`)."""
        return self.chromium_pid

    @property
    def pgid(self) -> int:
        return self.proc.pid if self.proc else 0

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None or not self.chromium_pid:
            return False
        try:
            stat = Path(f"/proc/{self.chromium_pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")

    def pids(self) -> list[int]:
        return group_pids(self.pgid) if self.proc else []

    def memory(self) -> dict[str, float]:
        return memory_of(self.pids())

    def kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self.proc.stdin:
                self.proc.stdin.close()
            unregister_group(self.proc.pid)
        shutil.rmtree(self.dir, ignore_errors=True)


# chromium runs under a watchdog shell that leads its process group and holds the read end of a pipe this
# process keeps open: when this process goes, however it goes, the read ends and the shell kills the group.
_WATCHDOG = '"$@" </dev/null >&2 & echo $!; read _; kill -9 -$$'

_GROUPS: set[int] = set()
_GROUPS_LOCK = threading.Lock()


def register_group(pgid: int) -> None:
    with _GROUPS_LOCK:
        _GROUPS.add(pgid)


def unregister_group(pgid: int) -> None:
    with _GROUPS_LOCK:
        _GROUPS.discard(pgid)


def kill_group(pgid: int) -> None:
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    # a process that left the group (setsid) is not followed; chromium's helpers stay in it
    for _ in range(50):
        if not group_pids(pgid):
            break
        time.sleep(0.02)


def started_process_groups() -> list[int]:
    """Process groups of the chromium (and chromedriver) processes this process started and has not killed."""
    with _GROUPS_LOCK:
        return sorted(_GROUPS)
