"""vLLM servers clawloop starts: finding the vLLM environment, one server process (its own process
group through `vllm_launch.py`, its log, its stop), and reading why one died from its log."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from clawloop.config import ConfigError

log = logging.getLogger("clawloop.engines.vllm")

LAUNCHER = Path(__file__).with_name("vllm_launch.py")
STOP_GRACE_S = 20.0


class VLLMNotInstalled(ConfigError):
    """The vLLM environment is missing: a one-line error that says how to get it."""


def find_vllm_python(explicit: str = "") -> Path:
    """The vLLM environment's Python: `--vllm-python`, else `.venv-vllm` in the
    working directory or beside the environment clawloop runs in."""
    if explicit:
        p = Path(explicit)
        if not p.exists():
            raise VLLMNotInstalled(f"model.vllm_python: {p} does not exist (run `make vllm` to create "
                                   ".venv-vllm, or point --vllm-python at a Python that has vLLM)")
        return p
    candidates = [Path.cwd() / ".venv-vllm" / "bin" / "python",
                  Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python"]
    for c in candidates:
        if c.exists():
            return c
    raise VLLMNotInstalled(f"--backend vllm: no vLLM environment at {candidates[0].parent.parent}: "
                           "run `make vllm` (or pass --vllm-python PATH)")


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


class VLLMProcess:
    """One vLLM server started by us: its own process group, log file, and stop."""

    def __init__(self, python: Path, args: list[str], env: dict[str, str], log_path: Path):
        self.python, self.args, self.env, self.log_path = python, args, env, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [str(self.python), str(LAUNCHER), str(os.getpid()), "--", *self.args],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, close_fds=True)
        finally:
            logf.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exited(self) -> int | None:
        """The exit code once the server process has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the process group (vLLM and its engine/worker processes), SIGKILL after `grace_s`."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the child's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever is left of the group (engine core, workers)
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("vLLM process %d did not exit after SIGKILL", pgid)

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _explain(tail: str) -> str:
    """The lines of a vLLM log that say why it died, with a plain-words note for common causes."""
    lines = [ln for ln in tail.splitlines() if ("Error" in ln or "error" in ln or "not supported" in ln)]
    note = ""
    if "not supported" in tail and "rchitecture" in tail:
        note = "vLLM cannot load this model's architecture; use --backend hf or a model vLLM supports.\n"
    elif "torchvision::nms" in tail:
        note = "torchvision in the vLLM environment is broken for this torch; rerun `make vllm`.\n"
    return note + ("\n".join(lines[-8:]) if lines else tail[-2000:])
