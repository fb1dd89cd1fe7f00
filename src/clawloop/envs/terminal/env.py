"""The terminal track (terminal-bench style): do a job in a Linux shell, checked by the task's tests.

    ENV_TYPE=terminal [--task-dir DIR]            # DIR: one task folder or a folder of them

    env = TRACK.make_env(task, opts, slot=0)
    obs = env.reset()        # fresh workspace at /app, setup.sh run; system + instruction, the 4 shell tools
    env.step(message)        # runs the message's tool calls in a persistent bash; no tool call: finished
    env.evaluate()           # the task's tests on the workspace: reward 2*acc - 1

A task is a folder in terminal-bench's layout, with a setup script in place of
the Dockerfile:

    task.yaml              instruction (required); max_test_timeout_sec, category, difficulty, tags
    solution.sh            the reference solution (bash, run in the workspace)
    run-tests.sh           runs the checks with $TEST_DIR set to where tests/ was copied; shipped tasks
                           run `python3 -P -m clawloop.envs.testrun "$TEST_DIR/test_outputs.py" --json
                           "$TEST_DIR/results.json"` (-P: a package in the workspace cannot shadow clawloop)
    tests/test_outputs.py  pytest-style `test_*` functions looking at the workspace (the cwd)
    setup.sh               optional: prepares the workspace in the sandbox at reset
    files/                 optional: copied into the workspace before setup.sh

The shipped tasks live in `clawloop/data/terminal_tasks/`; a user task of the
same name replaces a shipped one.

The agent's tools (the reference's names): `shell_exec` runs a command in one
interactive bash per episode, so cwd, variables and background jobs persist;
`shell_view` shows output that came since the last read (a command still
running after its time limit keeps running); `shell_write_to_process` answers
a running program's prompt on its stdin; `shell_write_content_to_file` writes
a file. The shell runs with PS1 empty and a PROMPT_COMMAND that prints a
random marker with `$?` and `$PWD`, so the end of every command (even one
aborted by an expansion error) is seen in the output stream; commands are sent
as one `eval $'...'` line, so a syntax error cannot leave bash waiting for more
input and a program reading stdin gets only what the agent writes to it. A
watchdog kills the shell when the workspace keeps growing past its quota or
the episode's processes near their limit (a fork bomb); the next call starts a
new shell in the last working directory and says so.

Evaluation copies tests/ into a fresh hidden folder of the workspace (after
the agent's processes are killed), runs run-tests.sh there and reads
`results.json` (else a pytest-style `N passed, M failed` line): acc =
passed / total, reward = 2*acc - 1, success when every test passed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from clawloop.envs.base import (Env, EnvOptions, Evaluation, Observation, StepResult, Task, Track,
                                assistant_tool_call, tool_calls_of, tool_message)
from clawloop.envs.sandbox import MOUNT_POINT, Limits, Sandbox
from clawloop.envs.terminal.shell import Shell

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "terminal_tasks"
REQUIRED = ("task.yaml", "solution.sh", "run-tests.sh", "tests/test_outputs.py")
DEFAULT_TEST_TIMEOUT_S = 60.0
MAX_OBSERVATION = 8000
"""Characters of one tool answer; longer output keeps its head and tail."""
WRITE_INPUT_WAIT_S = 5.0
WRITE_INPUT_SEND_S = 2.0
"""How long input may wait for a program that does not read it (the pipe is full)."""
VIEW_WAIT_S = 2.0
SETTLE_S = 0.5
"""After writing to a running program or viewing it: return once its output has been quiet this long."""

SYSTEM_PROMPT = """You are an agent working in a Linux terminal to complete the user's task. The task's files \
are in the working directory {cwd}; there is no network.

Tools:
- shell_exec(command): run a bash command in a persistent shell (the working directory, variables and \
background jobs persist between calls) and get its output and exit code. A command still running after its \
time limit keeps running: see its later output with shell_view, answer its prompts with \
shell_write_to_process. A new shell_exec stops a command that is still running.
- shell_view(): the shell's output since the last read.
- shell_write_to_process(input): send a line of input to the running command's stdin.
- shell_write_content_to_file(path, content): write a file (a relative path is relative to {cwd}).

Work step by step and check your results. When the task is done, reply with a short summary and no tool \
call: that ends the episode and your work is checked."""


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


TOOLS: list[dict[str, Any]] = [
    _fn("shell_exec", "Run a bash command in the persistent shell and return its output and exit code.",
        {"command": {"type": "string", "description": "The command (several lines are fine)."},
         "timeout": {"type": "number", "description": "Seconds to wait before returning while it runs on "
                                                      "(at most the environment's limit)."}},
        ["command"]),
    _fn("shell_view", "Return the shell's output since the last read (e.g. of a command still running).", {}, []),
    _fn("shell_write_to_process", "Write a line to the stdin of the command running in the shell (answer its "
                                  "prompt); a newline is added when missing.",
        {"input": {"type": "string", "description": "What to type."}}, ["input"]),
    _fn("shell_write_content_to_file", "Write text to a file in the workspace (created or replaced, parent "
                                       "folders made).",
        {"path": {"type": "string", "description": "File path, relative to the working directory or absolute "
                                                   "inside it."},
         "content": {"type": "string", "description": "The whole new content of the file."}},
        ["path", "content"]),
]
_ARG_TYPES = {"command": str, "input": str, "path": str, "content": str, "timeout": (int, float)}


# ---- tasks -------------------------------------------------------------------------------------

def load_task(folder: Path, source: str) -> Task:
    """One task folder as a Task; ValueError naming the folder and what is missing or wrong."""
    folder = folder.resolve()
    where = f"terminal task {folder}"
    for rel in REQUIRED:
        if not (folder / rel).is_file():
            raise ValueError(f"{where}: missing {rel}")
    try:
        meta = yaml.safe_load((folder / "task.yaml").read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: task.yaml does not parse: {e}") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("instruction"), str) or not meta["instruction"].strip():
        raise ValueError(f"{where}: missing task.yaml instruction (a non-empty string)")
    timeout = meta.get("max_test_timeout_sec", DEFAULT_TEST_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{where}: task.yaml max_test_timeout_sec must be a positive number, not {timeout!r}")
    meta = json.loads(json.dumps(meta, default=str))  # Task.data travels as JSON (dates become strings)
    return Task(task_id=folder.name, track="terminal", instruction=meta["instruction"].strip(),
                data={"path": str(folder), "yaml": meta, "source": source})


def task_folders(root: Path) -> list[Path]:
    """`root` itself when it is a task folder, else its task sub-folders by name."""
    if not root.is_dir():
        raise ValueError(f"terminal task dir {root}: not a folder")
    if any((root / rel).exists() for rel in REQUIRED):  # one task (load_task says what it lacks)
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


class TerminalTrack(Track):
    name = "terminal"

    def load_tasks(self, opts: EnvOptions) -> list[Task]:
        """The shipped tasks plus `opts.task_dir`'s, by name; a broken user task raises ValueError."""
        tasks = {p.name: load_task(p, "shipped") for p in task_folders(SHIPPED)}
        if opts.task_dir:
            user = task_folders(Path(opts.task_dir).expanduser())
            if not user:
                raise ValueError(f"terminal task dir {opts.task_dir}: no task folders in it")
            tasks.update({p.name: load_task(p, "user") for p in user})
        return [tasks[k] for k in sorted(tasks)]

    def make_env(self, task: Task, opts: EnvOptions, *, slot: int = 0) -> "TerminalEnv":
        return TerminalEnv(task, opts, slot=slot)


TRACK = TerminalTrack()


# ---- sandbox -----------------------------------------------------------------------------------

def _clip(text: str, limit: int = MAX_OBSERVATION) -> str:
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"



# ---- the environment ---------------------------------------------------------------------------

class TerminalEnv(Env):
    track = "terminal"

    def __init__(self, task: Task, opts: EnvOptions, *, slot: int = 0):
        super().__init__(task, opts, slot=slot)
        self.folder = Path(task.data["path"])
        self.meta: dict[str, Any] = dict(task.data.get("yaml") or {})
        self.workspace: Path | None = None
        self.sandbox: Sandbox | None = None
        self.shell: Shell | None = None
        self._cwd = MOUNT_POINT
        self._told = False
        """The agent was already told that the last shell ended (the next call starts a new one)."""
        self._done = False

    # -- lifecycle --

    def reset(self) -> Observation:
        self.close()
        self.steps, self._done, self._told = 0, False, False
        if self.opts.work_dir:
            Path(self.opts.work_dir).mkdir(parents=True, exist_ok=True)
        self.workspace = Path(tempfile.mkdtemp(prefix=f"clawloop-{self.task.task_id}-",
                                               dir=self.opts.work_dir or None))
        try:
            if (self.folder / "files").is_dir():
                shutil.copytree(self.folder / "files", self.workspace, symlinks=True, dirs_exist_ok=True)
            self.sandbox = Sandbox(self.workspace, level=self.opts.sandbox,
                                        allow_unsandboxed=self.opts.allow_unsandboxed,
                                        limits=Limits(memory_mb=self.opts.memory_mb, disk_mb=self.opts.disk_mb),
                                        slot=self.slot, hide=[SHIPPED, self.folder])
            self.sandbox.own_workspace()
            self._cwd = self.sandbox.cwd
            setup = self.folder / "setup.sh"
            if setup.is_file():
                # As the command itself (bash -c), not a file in the workspace a setup's `git add -A` would catch.
                r = self.sandbox.run(setup.read_text(encoding="utf-8"), timeout_s=self.opts.command_timeout_s)
                if not r.ok:
                    raise RuntimeError(f"terminal task {self.task.task_id}: setup.sh failed (exit {r.returncode}"
                                       f"{', ' + r.reason if r.reason else ''}): {r.output.strip()[-2000:]}")
        except BaseException:
            self.close()
            raise
        system = SYSTEM_PROMPT.format(cwd=self._cwd)
        return Observation(messages=[{"role": "system", "content": system},
                                     {"role": "user", "content": self.task.instruction}],
                           tools=json.loads(json.dumps(TOOLS)))

    def close(self) -> None:
        if self.shell is not None:
            self.shell.kill("closed")
            self.shell = None
        if self.workspace is not None and not self.opts.keep_workspaces:
            shutil.rmtree(self.workspace, ignore_errors=True)
        self.workspace = None
        self.sandbox = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sandbox": self.sandbox.describe() if self.sandbox else None}

    def oracle(self) -> list[dict[str, Any]]:
        # A child bash: the solution's own `exit` or `set -e` must not end the agent's shell.
        script = (self.folder / "solution.sh").read_text(encoding="utf-8")
        return [assistant_tool_call("shell_exec", {"command": f"bash -c {shlex.quote(script)}"},
                                    content="Running the reference solution.")]

    # -- steps --

    def step(self, message: dict[str, Any]) -> StepResult:
        if self.sandbox is None:
            raise RuntimeError("step() before reset()")
        if self._done:
            return StepResult([], True, {"end_reason": "episode_over", "error": "the episode is over"})
        self.steps += 1
        calls = tool_calls_of(message)
        if not calls:
            self._done = True
            return StepResult([], True, {"end_reason": "agent_finished"})
        messages, infos = [], []
        for call in calls:
            t0 = time.monotonic()
            text, info = self._call(call)
            info = {"tool": call["name"], "returncode": None, "timed_out": False, **info,
                    "seconds": round(time.monotonic() - t0, 3)}
            messages.append(tool_message(call["id"], _clip(text)))
            infos.append(info)
        info: dict[str, Any] = {"calls": infos, "returncode": infos[-1]["returncode"],
                                "seconds": round(sum(i["seconds"] for i in infos), 3),
                                "timed_out": any(i["timed_out"] for i in infos)}
        errors = [i["error"] for i in infos if i.get("error")]
        if errors:
            info["error"] = "; ".join(errors)
        if self.steps >= self.opts.max_steps:
            self._done = True
            info["end_reason"] = "max_steps"
        return StepResult(messages, self._done, info)

    def _call(self, call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        name, args = call["name"], call["arguments"]
        spec = next((t["function"] for t in TOOLS if t["function"]["name"] == name), None)
        if spec is None:
            known = ", ".join(t["function"]["name"] for t in TOOLS)
            return self._error(f"unknown tool {name!r}; the tools are {known}")
        if args is None:
            return self._error(f"{name}: the arguments are not a JSON object: {call['raw'][:200]!r}")
        params = spec["parameters"]
        for key in params["required"]:
            if key not in args:
                return self._error(f"{name}: missing argument {key!r}")
        for key, value in args.items():
            if key in params["properties"] and (isinstance(value, bool) or not isinstance(value, _ARG_TYPES[key])):
                return self._error(f"{name}: argument {key!r} must be a {params['properties'][key]['type']}")
        if name == "shell_exec":
            return self._exec(args["command"], args.get("timeout"))
        if name == "shell_view":
            return self._view()
        if name == "shell_write_to_process":
            return self._write_input(args["input"])
        return self._write_file(args["path"], args["content"])

    @staticmethod
    def _error(text: str) -> tuple[str, dict[str, Any]]:
        return f"error: {text}", {"error": text}

    def _ensure_shell(self) -> tuple[str, str]:
        """(note for the agent, error): the live shell, or a new one in the last working directory."""
        assert self.sandbox is not None
        if self.shell is not None and self.shell.alive:
            return "", ""
        note = ""
        if self.shell is not None:
            note = "[" + ("" if self._told else self.shell.end_note() + "; ")
            self._cwd = self.shell.cwd
            self.shell.kill("ended")
            self.shell = None
        try:
            self.shell = Shell(self.sandbox, self._cwd)
        except RuntimeError as e:
            return "", str(e)
        self._told = False
        if note:
            note += f"a new shell started in {self.shell.cwd}: shell variables and background jobs are gone]\n"
        return note, ""

    def _lose_shell(self) -> str:
        """The shell died during a call: remember why for the next call's note."""
        assert self.shell is not None
        self._told = True
        self._cwd = self.shell.cwd
        return f"[{self.shell.end_note()}; the next command starts a new shell in {self._cwd}]"

    def _exec(self, command: str, timeout: float | None) -> tuple[str, dict[str, Any]]:
        limit = self.opts.command_timeout_s if timeout is None else max(0.1, min(float(timeout),
                                                                                  self.opts.command_timeout_s))
        note, err = self._ensure_shell()
        if err:
            return self._error(err)
        assert self.shell is not None
        if self.shell.busy:
            if self.shell.finished():
                text, code, _ = self.shell.collect()
                note += f"[the previous command's output since the last read:]\n{text}\n[exit code {code}]\n"
            else:
                self._cwd = self.shell.cwd
                self.shell.kill("stopped")
                self.shell = None
                _, err = self._ensure_shell()
                if err:
                    return self._error(err)
                note += (f"[the previous command was still running: it was stopped and a new shell started in "
                         f"{self._cwd}: shell variables and background jobs are gone]\n")
        assert self.shell is not None
        earlier = self.shell.drain()
        if earlier.strip():
            note += f"[output since the last command:]\n{earlier}\n[this command:]\n"
        failed = self.shell.run(command)
        if failed:  # half a command line may be in the shell: it cannot be trusted any more
            self.shell.kill(f"the command could not be sent: {failed}")
            return note + self._lose_shell(), {"error": failed}
        self.shell.wait(limit)
        text, code, state = self.shell.collect()
        if text and not text.endswith("\n"):
            text += "\n"
        if state == "done":
            return f"{note}{text}[exit code {code}]", {"returncode": code}
        if state == "dead":
            return f"{note}{text}{self._lose_shell()}", {"error": self.shell.end_note()}
        return (f"{note}{text}[still running after {limit:g} s: shell_view shows its later output, "
                f"shell_write_to_process sends it input, a new shell_exec stops it]",
                {"timed_out": True})

    def _view(self) -> tuple[str, dict[str, Any]]:
        note, err = self._ensure_shell()
        if err:
            return self._error(err)
        assert self.shell is not None
        if not self.shell.busy:
            text = self.shell.drain()
            return note + (text if text.strip() else "(no new output)"), {}
        self.shell.wait(min(VIEW_WAIT_S, self.opts.command_timeout_s), settle_s=SETTLE_S)
        return self._progress(note)

    def _write_input(self, data: str) -> tuple[str, dict[str, Any]]:
        note, err = self._ensure_shell()
        if err:
            return self._error(err)
        assert self.shell is not None
        if not self.shell.busy:
            return self._error("no command is running to read it; run commands with shell_exec")
        if self.shell.finished():
            text, info = self._progress(note)
            return f"[input not sent: the command had already ended]\n{text}", info
        failed = self.shell.send(data[:-1] if data.endswith("\n") else data, timeout_s=WRITE_INPUT_SEND_S)
        if failed and not self.shell.alive:
            return note + self._lose_shell(), {"error": failed}
        if failed:
            return self._error(f"the running command is not reading its input: {failed}")
        self.shell.wait(min(WRITE_INPUT_WAIT_S, self.opts.command_timeout_s), settle_s=SETTLE_S)
        return self._progress(note)

    def _progress(self, note: str) -> tuple[str, dict[str, Any]]:
        """The running command's new output and whether it ended."""
        assert self.shell is not None
        text, code, state = self.shell.collect()
        if text and not text.endswith("\n"):
            text += "\n"
        if state == "done":
            return f"{note}{text}[the command finished: exit code {code}]", {"returncode": code}
        if state == "dead":
            return f"{note}{text}{self._lose_shell()}", {"error": self.shell.end_note()}
        return f"{note}{text}[still running]", {"timed_out": True}

    def _write_file(self, path: str, content: str) -> tuple[str, dict[str, Any]]:
        assert self.sandbox is not None
        base = self.sandbox.cwd
        target = os.path.normpath(os.path.join(base, path))
        if not path.strip() or not target.startswith(base + "/"):
            return self._error(f"{path!r} is outside the workspace {base}; write files inside it")
        # Written by the sandbox user inside the sandbox: a symlink the agent planted cannot point it elsewhere.
        q = shlex.quote(target)
        r = self.sandbox.run(f"mkdir -p -- \"$(dirname -- {q})\" && cat > {q}", stdin=content,
                             timeout_s=min(30.0, self.opts.command_timeout_s))
        if not r.ok:
            return self._error(f"could not write {target}: {(r.output.strip() or r.reason)[-500:]}")
        return f"wrote {len(content.encode())} bytes to {target}", {"returncode": 0}

    # -- scoring --

    def evaluate(self) -> Evaluation:
        if self.sandbox is None or self.workspace is None:
            raise RuntimeError("evaluate() before reset()")
        if self.shell is not None:  # the agent is done; its processes must not touch the checks
            self.shell.kill("evaluation")
            self.shell = None
        name = f".clawloop_tests_{secrets.token_hex(6)}"
        hidden = self.workspace / name
        try:
            shutil.copytree(self.folder / "tests", hidden)
            shutil.copy2(self.folder / "run-tests.sh", hidden / ".run-tests.sh")
            self.sandbox.own_workspace()
            test_dir = f"{self.sandbox.cwd}/{name}"
            timeout = float(self.meta.get("max_test_timeout_sec", DEFAULT_TEST_TIMEOUT_S))
            r = self.sandbox.run(f"export TEST_DIR={shlex.quote(test_dir)}; "
                                 f"bash {shlex.quote(test_dir + '/.run-tests.sh')}", timeout_s=timeout)
            results = None
            try:
                results = json.loads((hidden / "results.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                pass
        finally:
            shutil.rmtree(hidden, ignore_errors=True)
        details: dict[str, Any] = {"returncode": r.returncode, "seconds": round(r.seconds, 3),
                                   "timed_out": r.timed_out, "output_tail": r.output[-3000:].replace(name, "tests")}
        passed, total, reason = self._count(results, r.output)
        if isinstance(results, dict) and isinstance(results.get("tests"), dict):
            details["tests"] = {k.replace(name, "tests"): v for k, v in results["tests"].items()}
        if r.reason:
            reason = f"{r.reason}; {reason}" if reason else r.reason
        acc = passed / total if total else 0.0
        details.update(passed=passed, total=total, acc=acc, reason=reason)
        return Evaluation(reward=2 * acc - 1, success=total > 0 and passed == total, details=details)

    @staticmethod
    def _count(results: Any, output: str) -> tuple[int, int, str]:
        """(passed, total, reason when they could not be read) from results.json, else the output."""
        if isinstance(results, dict) and isinstance(results.get("passed"), int):
            passed, failed = results["passed"], int(results.get("failed") or 0)
            return passed, passed + failed, "" if passed + failed else "no tests ran"
        counts = {}
        for line in reversed(output.splitlines()):
            found = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|errors?)\b", line))
            if found:
                counts = found
                break
        if not counts:
            return 0, 0, "no test results: neither results.json nor an 'N passed, M failed' line"
        passed = counts.get("passed", 0)
        total = passed + counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        return passed, total, "" if total else "no tests ran"
