"""What every agent environment is, and the tracks that make them.

    track = get_track("terminal")                        # Track: tasks + env factory
    tasks = track.load_tasks(opts)                       # [Task], shipped/generated/user's own
    env = track.make_env(tasks[0], opts, slot=0)         # one episode's environment
    first = env.reset()                                  # Observation(messages, tools)
    out = env.step({"role": "assistant", "content": ..., "tool_calls": [...]})
    out.messages, out.done                               # what the agent sees next; episode over?
    ev = env.evaluate()                                  # Evaluation(reward, outcome, details)
    env.close()

One protocol for all tracks (tool-call, terminal, SWE, GUI): an episode is a
conversation. `reset` gives the opening messages (system + user instruction)
and the tools offered; each `step` takes the assistant's message as the
gateway returned it (text and parsed `tool_calls`) and answers with the
messages to append (role `tool` answers to tool calls, or a `user` message
carrying the observation for text protocols such as SWE's); `evaluate` scores
the end state (a task's tests, an answer check) into the track's reward.

`oracle()` is the task's reference solution written as assistant messages, so
`clawloop env check` and the scripted agent replay it through the same
`step` path an agent takes. A do-nothing agent (`NOOP_MESSAGE`) must not score
the maximum.

Everything an environment reports is JSON: observations, `info`, `details`,
and `Task.data`, so the pool can serve them over HTTP unchanged.
"""

from __future__ import annotations

import abc
import importlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

TRACKS = ("toolcall", "terminal", "swe", "gui")
"""Built-in tracks, by ENV_TYPE name; module `clawloop.envs.<name>` defines `TRACK`."""

NOOP_MESSAGE: dict[str, Any] = {"role": "assistant", "content": "I am done."}


@dataclass
class Task:
    task_id: str
    track: str
    instruction: str
    data: dict[str, Any] = field(default_factory=dict)
    """Track-specific: paths of the task's files, the label, the instance record."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Task":
        return cls(task_id=str(d["task_id"]), track=str(d["track"]), instruction=str(d["instruction"]),
                   data=dict(d.get("data") or {}))


@dataclass
class Observation:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    """E.g. {"reset_ms": 400, "screenshot_png_b64": "..."} (gui); recorded, never shown to the agent."""


@dataclass
class StepResult:
    messages: list[dict[str, Any]]
    """Appended to the conversation: tool results (role tool, with tool_call_id) or a user message."""
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    """E.g. {"returncode": 0, "seconds": 0.1, "submitted": true, "error": "..."}; recorded per step."""


@dataclass
class Evaluation:
    reward: float
    """The track's outcome reward (toolcall/swe: +1/-1 and the failure shaping; terminal: 2*acc - 1)."""
    success: bool
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvOptions:
    """How environments are built; the same for every track (tracks ignore what they do not use)."""
    max_steps: int = 20
    sandbox: str = "auto"
    allow_unsandboxed: bool = False
    command_timeout_s: float = 120.0
    memory_mb: int = 4096
    disk_mb: int = 512
    task_dir: str = ""
    """A user's own tasks (terminal-bench layout for terminal; SWE-bench instances for swe)."""
    tools_config: str = ""
    """toolcall: a JSON file of tool definitions (TOOLS_CONFIG)."""
    work_dir: str = ""
    """Where episode workspaces are made (default: a temp folder)."""
    keep_workspaces: bool = False
    """Keep each episode's workspace after close (debugging)."""
    screenshot_backend: str = "playwright"
    """gui: how chromium is driven, `playwright` (default) or `selenium` (chromedriver); SCREENSHOT_BACKEND."""
    gui_observation: str = "dom"
    """gui: what observations carry, `dom` (element list), `screenshot` (PNG) or `both`; the PNG is always taken."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "EnvOptions":
        d = dict(d or {})
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown env option(s): {', '.join(unknown)}")
        return cls(**d)


class Env(abc.ABC):
    """One episode of one task. Not thread-safe: one caller at a time (the pool serialises)."""

    track: str = ""

    def __init__(self, task: Task, opts: EnvOptions, *, slot: int = 0):
        self.task = task
        self.opts = opts
        self.slot = slot
        self.steps = 0

    @abc.abstractmethod
    def reset(self) -> Observation: ...

    @abc.abstractmethod
    def step(self, message: dict[str, Any]) -> StepResult: ...

    @abc.abstractmethod
    def evaluate(self) -> Evaluation: ...

    @abc.abstractmethod
    def oracle(self) -> list[dict[str, Any]]:
        """The reference solution as the assistant messages an agent would send."""

    def close(self) -> None:
        """Release the workspace and any process the episode started."""

    def describe(self) -> dict[str, Any]:
        """Metadata recorded in every item: task id, sandbox level and limits."""
        return {"track": self.track, "task_id": self.task.task_id}


class Track(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def load_tasks(self, opts: EnvOptions) -> list[Task]:
        """Every task of this track (shipped or generated, plus `opts.task_dir`'s), in a stable order.
        A broken user task raises ValueError naming the task and what is missing."""

    @abc.abstractmethod
    def make_env(self, task: Task, opts: EnvOptions, *, slot: int = 0) -> Env: ...

    def max_reward(self, task: Task) -> float:
        return 1.0


def get_track(name: str) -> Track:
    if name not in TRACKS:
        raise ValueError(f"unknown track {name!r} (ENV_TYPE): one of {', '.join(TRACKS)}")
    mod = importlib.import_module(f"clawloop.envs.{name}")
    return mod.TRACK


def tool_calls_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message's tool calls as [{"id", "name", "arguments": dict | None, "raw": str}]; arguments
    that are not a JSON object come back as None (the env answers with an error the agent can read)."""
    out = []
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        raw = fn.get("arguments")
        args: Any
        if isinstance(raw, dict):
            args, raw_s = raw, json.dumps(raw)
        else:
            raw_s = str(raw or "")
            try:
                args = json.loads(raw_s) if raw_s.strip() else {}
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):
                args = None
        out.append({"id": call.get("id") or f"call_{i}", "name": fn.get("name") or "", "arguments": args,
                    "raw": raw_s})
    return out


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def assistant_tool_call(name: str, arguments: dict[str, Any], call_id: str = "call_0",
                        content: str = "") -> dict[str, Any]:
    """An assistant message making one tool call (how oracles are written)."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}]}
