"""Running one generator's `run_rollout(data)` in a child process we can stop.

The buffer starts `python -c <runner.main> FILE PAYLOAD_JSON [ENTRY]` in a
new session (its own process group), so `/stop_rollout` can end the
generator and every worker process it forked, and nothing else: the signal
goes to that group only. Output goes to a log file under the data dir.

    proc = RolloutProcess.start("math", Path(".../math_generator.py"), payload, log_dir)
    proc.status()        # {"task_type", "pid", "state": running|finished|failed|stopped, "returncode", "log"}
    proc.stop()          # SIGTERM to the group, SIGKILL after a grace period
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


# `-c` rather than `-m clawloop.buffer.runner`: the package imports this module, and
# runpy warns when a module it is about to run as __main__ is already imported.
_CHILD = "import sys; from clawloop.buffer.runner import main; sys.exit(main(sys.argv[1:]))"


class RolloutProcess:
    def __init__(self, task_type: str, path: Path, popen: subprocess.Popen, log_path: Path, payload: dict[str, Any]):
        self.task_type = task_type
        self.path = path
        self.popen = popen
        self.log_path = log_path
        self.payload = payload
        self.started_at = time.time()
        self.stopped = False

    @classmethod
    def start(cls, task_type: str, path: Path, payload: dict[str, Any], log_dir: Path,
              entry: str | None = None) -> "RolloutProcess":
        """`entry`: a `--rollout-function-path` spec to run instead of the file's `run_rollout`."""
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_path = log_dir / f"{task_type}-{stamp}-{os.getpid()}-{int(time.time() * 1000) % 100000}.log"
        payload_path = log_path.with_suffix(".payload.json")
        payload_path.touch(mode=0o600)  # the payload may hold an API key for the engine
        payload_path.write_text(json.dumps(payload, default=str))
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [sys.executable, "-u", "-c", _CHILD, str(path), str(payload_path), *([entry] if entry else [])],
                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: stop() reaches the generator's workers too
            )
        return cls(task_type, path, popen, log_path, payload)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def status(self) -> dict[str, Any]:
        rc = self.popen.poll()
        if rc is None:
            state = "running"
        elif self.stopped:
            state = "stopped"
        else:
            state = "finished" if rc == 0 else "failed"
        return {"task_type": self.task_type, "pid": self.pid, "state": state, "returncode": rc,
                "generator": str(self.path), "log": str(self.log_path), "started_at": self.started_at}

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the generator's process group (only ours: the group id is its pid)."""
        self.stopped = True
        if self.popen.poll() is not None:
            self._reap_group()
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self._reap_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass

    def _reap_group(self, sig: int = signal.SIGTERM) -> None:
        """Workers the generator forked may outlive it; they are still in its group."""
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str]) -> int:
    from clawloop.buffer.discovery import load_module

    path, payload_path, *entry = argv
    data = json.loads(Path(payload_path).read_text())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if entry:
        from clawloop.plugins import load_callable

        run = load_callable(entry[0], what="--rollout-function-path")
        print(f"clawloop buffer: running {entry[0]} pid={os.getpid()}", flush=True)
    else:
        module = load_module(Path(path))
        run = module.run_rollout
        print(f"clawloop buffer: running {path} (TASK_TYPE={getattr(module, 'TASK_TYPE', '?')}) pid={os.getpid()}",
              flush=True)
    run(data)
    print("clawloop buffer: run_rollout returned", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
