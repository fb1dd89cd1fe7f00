"""The tool-call track (ReTool-style): answer a math problem, using tools that run in the sandbox.

    ENV_TYPE=toolcall [TOOLS_CONFIG=tools.json] [--task-dir problems.jsonl]

Tasks: the packaged math problems (`clawloop/data/math_problems.jsonl`) plus
generated arithmetic in the tiny model's wording, or the user's JSONL
(`--task-dir FILE`, lines `{"prompt" | "messages", "label", "instance_id"?}`).

Tools, by default the reference's `code_interpreter` (Python in a subprocess of
the sandbox, a module allowlist, 120 s, 4 GB). `TOOLS_CONFIG` names a JSON file
instead: `{"tools": [OpenAI function tools], "system": "optional system prompt"}`
(or just the list). A tool named `code_interpreter` or `calculator` gets the
built-in implementation; any other needs a `"command"` key beside its
`"function"`: a shell command run in the sandbox with the call's arguments as
JSON on stdin (and in `$TOOL_ARGS`), its output the tool's answer.

Episode: every assistant message with tool calls gets one tool message per
call; the first message without a tool call is the final answer and ends the
episode (so does `max_steps`). Reward as in the reference: +1 when the final
answer (the last `\\boxed{}`, else the last number) equals the label, else -1,
and a failed trajectory gets `min(-0.6, -1 + (n_calls - 2) / 2 * 0.1)`:
trying the tools costs less than not trying.

Every call is also scored (`info.calls[i].score`, in [0, 1]): 1 for a *correct
call*, one whose result is the answer (and that computes it, not one that
passes the bare answer in); otherwise how close its argument is to the task's
reference expression (`oracle`, else the `a+b` in the question; difflib's
ratio, whitespace ignored), 0 when there is none. `evaluate()` reports
`call_score` (the mean over the episode's calls: more tries do not raise it),
`exact_call` (some call was correct) and `answer_from_tool` (the final answer
equals a result a tool returned). The generator's `reward: shaped`
(`RewardShaping`) turns them into reward; the env's own reward stays the
reference's.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from clawloop.envs.base import (Env, EnvOptions, Evaluation, Observation, StepResult, Task, Track,
                                assistant_tool_call, tool_calls_of, tool_message)
from clawloop.envs.sandbox import Limits, Sandbox
from clawloop.generation.answers import extract_answer, read_problems, score_answer
from clawloop.tinymodel.corpus import heldout_questions

DATA = Path(__file__).resolve().parents[2] / "data" / "math_problems.jsonl"
N_GENERATED = 200
MAX_OBSERVATION = 4000

ALLOWED_MODULES = ("math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "collections",
                   "random", "re", "string", "json", "datetime", "heapq", "bisect", "operator", "numbers", "sympy",
                   "numpy", "typing", "dataclasses", "copy", "time", "array", "calendar")

CODE_INTERPRETER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python 3 code and return what it prints (stdout), or the error. Only "
                       "math-style modules can be imported; no files, no network.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                       "required": ["code"]},
    },
}
CALCULATOR: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
DEFAULT_SYSTEM = ("Solve the problem. You can run Python with the code_interpreter tool (print what you need). "
                  "When you know the answer, reply without a tool call and put the final answer in \\boxed{}.")

# Runs inside the sandbox: user code may import only ALLOWED modules (modules they import are free).
_CODE_RUNNER = r"""
import ast, builtins, sys
_allowed = set(sys.argv[1].split(","))
_real_import = builtins.__import__
def _guarded(name, globals=None, locals=None, fromlist=(), level=0):
    if (globals or {}).get("__name__") == "__agent__" and level == 0 and name.split(".")[0] not in _allowed:
        raise ImportError(f"import of {name!r} is not allowed here")
    return _real_import(name, globals, locals, fromlist, level)
builtins.__import__ = _guarded
src = sys.stdin.read()
tree = ast.parse(src, "<code>")
last = None
if tree.body and isinstance(tree.body[-1], ast.Expr):   # show the value of a last bare expression
    last = ast.Expression(tree.body.pop().value)
ns = {"__name__": "__agent__"}
exec(compile(tree, "<code>", "exec"), ns)
if last is not None:
    v = eval(compile(last, "<code>", "eval"), ns)
    if v is not None:
        print(repr(v))
"""

_CALC_RUNNER = r"""
import ast, operator, sys
ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
       ast.USub: operator.neg, ast.UAdd: operator.pos}
def ev(n):
    if isinstance(n, ast.Expression): return ev(n.body)
    if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)): return n.value
    if isinstance(n, ast.BinOp) and type(n.op) in ops:
        if isinstance(n.op, ast.Pow) and abs(ev(n.right)) > 100: raise ValueError("exponent too large")
        return ops[type(n.op)](ev(n.left), ev(n.right))
    if isinstance(n, ast.UnaryOp) and type(n.op) in ops: return ops[type(n.op)](ev(n.operand))
    raise ValueError("not an arithmetic expression")
v = ev(ast.parse(sys.stdin.read().strip(), mode="eval"))
print(int(v) if isinstance(v, float) and v.is_integer() else v)
"""


def reward_of(final_text: str, label: Any, n_calls: int) -> tuple[float, bool]:
    ok = score_answer(final_text, label) == 1.0
    if ok:
        return 1.0, True
    return min(-0.6, -1.0 + (n_calls - 2) / 2 * 0.1), False


def call_score(argument: str, output: str | None, label: Any, reference: str | None) -> float:
    """One tool call's score in [0, 1]: 1 when its result (`output`, None for a call that failed) is the
    label and its argument is not the bare label; else the similarity of its argument to the reference
    expression (difflib ratio, whitespace ignored), 0 without a reference."""
    arg = "".join(argument.split())
    if output is not None and score_answer(output, label) == 1.0 and not _is_number(arg):
        return 1.0
    if not reference:
        return 0.0
    ref = "".join(reference.split())
    return min(SequenceMatcher(None, arg, ref, autojunk=False).ratio(), 0.99)  # 1 only for a correct call


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


REWARD_MODES = ("outcome", "shaped")
CREDIT_MODES = ("outcome", "step")


@dataclass
class RewardShaping:
    """How the toolcall generator turns an episode into reward (payload keys `reward`, `reward_call_coef`,
    `reward_use_coef`, `reward_call_partial`).

    `outcome`: the environment's reward, the reference's (+1 / -1 and the failure shaping), on every step.
    `shaped`: the outcome plus `call_coef` x the calls' mean score (1 for a correct call, the argument's
    closeness to the reference expression otherwise; the mean, so that calling again never pays) plus
    `use_coef` when the final answer is a result a tool returned. Per step (what `--advantage-estimator
    step_wise` normalises): a step that called tools gets outcome + call_coef x its calls' mean score, the
    final answer outcome + use_coef x used, any other step the outcome alone.

    `credit` (payload `reward_credit`) says what a step is credited with under `shaped`: `outcome` (the
    above: every step carries the episode's outcome) or `step`, each step its own check (a process
    reward): a call step call_coef x its calls' score alone (was its result the answer?), the final
    answer (1 if it reports a tool's result, else the outcome) + use_coef x used. Under `outcome`, an
    answer that faithfully reports a wrong call's result is blamed for the call (-1), so RL teaches the
    answer step to stop trusting the tool (RESULTS: after a cold start, answers taking the tool's result
    0.84 -> 0.56 in 48 updates); under `step` the call takes that blame."""
    mode: str = "outcome"
    call_coef: float = 1.0
    """Reward for a correct call (its result is the answer); partial credit for a near one."""
    use_coef: float = 0.5
    """Reward for a final answer that is a tool's result (right or wrong): rely on the tool."""
    partial: float = 1.0
    """Weight of a near call's partial credit (0: only a correct call scores). Partial credit pays the
    policy for calls *like* the right one, and a model that copies one operand and guesses the other
    climbs it while its exact calls fall (RESULTS: call score 0.77 -> 0.80, correct calls 0.14 -> 0.02)."""
    credit: str = "outcome"
    """`outcome` or `step` (see above)."""

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "RewardShaping":
        mode = str(data.get("reward") or "outcome")
        if mode not in REWARD_MODES:
            raise ValueError(f"reward must be one of {', '.join(REWARD_MODES)}, got {mode!r}")
        d = cls()
        credit = str(data.get("reward_credit") or d.credit)
        if credit not in CREDIT_MODES:
            raise ValueError(f"reward_credit must be one of {', '.join(CREDIT_MODES)}, got {credit!r}")
        return cls(mode, float(data.get("reward_call_coef", d.call_coef)),
                   float(data.get("reward_use_coef", d.use_coef)), float(data.get("reward_call_partial", d.partial)),
                   credit)

    def _credit(self, score: float) -> float:
        return score if score >= 1.0 else self.partial * score

    def __call__(self, outcome: float, details: dict[str, Any], step_infos: list[dict[str, Any]]
                 ) -> tuple[float, list[float], dict[str, Any]]:
        """(trajectory reward, each step's reward, what went into them)."""
        if self.mode == "outcome":
            return outcome, [outcome] * len(step_infos), {"mode": self.mode}
        call, used = float(details["call_score"]), bool(details["answer_from_tool"])
        if self.partial != 1.0:
            every = [self._credit(float(c["score"])) for info in step_infos for c in info.get("calls") or []]
            call = sum(every) / len(every) if every else 0.0
        steps = []
        for info in step_infos:
            scores = [self._credit(float(c["score"])) for c in info.get("calls") or []]
            own = self.credit == "step"
            if scores:
                steps.append((0.0 if own else outcome) + self.call_coef * sum(scores) / len(scores))
            elif info.get("end_reason") == "answered":
                steps.append((1.0 if own and used else outcome) + self.use_coef * used)
            else:
                steps.append(outcome)
        reward = outcome + self.call_coef * call + self.use_coef * used
        return reward, steps, {"mode": self.mode, "call_coef": self.call_coef, "use_coef": self.use_coef,
                               "partial": self.partial, "credit": self.credit, "call_score": call,
                               "answer_from_tool": used}


def load_tools_config(path: str) -> tuple[list[dict[str, Any]], str | None, dict[str, str]]:
    """(tools as offered, system prompt or None, {tool name: shell command}) from a TOOLS_CONFIG file."""
    where = f"TOOLS_CONFIG {path}"
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON: {e}") from None
    system = None
    if isinstance(raw, dict):
        system = raw.get("system")
        raw = raw.get("tools")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: expected a non-empty list of tools (or {{'tools': [...]}})")
    tools, commands = [], {}
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"{where}: tools[{i}] needs function.name")
        name = fn["name"]
        if name not in ("code_interpreter", "calculator"):
            if not isinstance(t.get("command"), str) or not t["command"].strip():
                raise ValueError(f"{where}: tools[{i}] ({name}) is not built in (code_interpreter, calculator) "
                                 "and has no 'command' to run")
            commands[name] = t["command"]
        tools.append({"type": "function", "function": fn})
    return tools, system, commands


def generated_problems(n: int = N_GENERATED, seed: int = 0) -> list[dict[str, Any]]:
    """Arithmetic in the tiny model's wording (its corpus's held-out pairs, so not memorised)."""
    out = []
    for i, q in enumerate(heldout_questions(n, seed=seed)):
        if q.get("skill") in ("add", "sub"):
            out.append({"instance_id": f"gen-{i:03d}", "prompt": q["question"], "label": q["answer"]})
    return out


class ToolCallTrack(Track):
    name = "toolcall"

    def load_tasks(self, opts: EnvOptions) -> list[Task]:
        if opts.task_dir:
            path = Path(opts.task_dir)
            if path.is_dir():
                files = sorted(path.glob("*.jsonl"))
                if not files:
                    raise ValueError(f"--task-dir {path}: no *.jsonl problem files")
            else:
                files = [path]
            problems = []
            for f in files:
                try:
                    problems += read_problems(f)
                except (OSError, ValueError, json.JSONDecodeError) as e:
                    raise ValueError(f"--task-dir {f}: {e}") from None
        else:
            problems = read_problems(DATA) + generated_problems()
        tasks = []
        for p in problems:
            if "label" not in p:
                raise ValueError(f"toolcall task {p.get('instance_id')!r}: no 'label' to score the answer against")
            instr = p.get("prompt") or next((m["content"] for m in reversed(p["messages"]) if m["role"] == "user"), "")
            tasks.append(Task(task_id=str(p["instance_id"]), track=self.name, instruction=str(instr),
                              data={"label": p["label"], "messages": p.get("messages"), "oracle": p.get("oracle")}))
        return tasks

    def make_env(self, task: Task, opts: EnvOptions, *, slot: int = 0) -> "ToolCallEnv":
        return ToolCallEnv(task, opts, slot=slot)


class ToolCallEnv(Env):
    track = "toolcall"

    def __init__(self, task: Task, opts: EnvOptions, *, slot: int = 0):
        super().__init__(task, opts, slot=slot)
        if opts.tools_config:
            self.tools, self.system, self.commands = load_tools_config(opts.tools_config)
        else:
            self.tools, self.system, self.commands = [CODE_INTERPRETER], DEFAULT_SYSTEM, {}
        self.names = [t["function"]["name"] for t in self.tools]
        self.workspace = Path(tempfile.mkdtemp(prefix=f"clawloop-toolcall-{slot}-", dir=opts.work_dir or None))
        self.sandbox = Sandbox(self.workspace, level=opts.sandbox, allow_unsandboxed=opts.allow_unsandboxed,
                               limits=Limits(memory_mb=opts.memory_mb, disk_mb=opts.disk_mb), slot=slot)
        self.reference = task.data.get("oracle") or _expression_of(task.instruction)
        self.n_calls = 0
        self.well_formed = 0
        self.call_scores: list[float] = []
        self.results: list[str] = []  # what the tools answered, for calls that ran cleanly
        self.final: str | None = None
        self.closed = False

    def reset(self) -> Observation:
        self.steps, self.n_calls, self.well_formed, self.final = 0, 0, 0, None
        self.call_scores, self.results = [], []
        msgs = list(self.task.data.get("messages") or [{"role": "user", "content": self.task.instruction}])
        if self.system and not any(m.get("role") == "system" for m in msgs):
            msgs = [{"role": "system", "content": self.system}] + msgs
        return Observation(messages=msgs, tools=self.tools)

    def _run_tool(self, name: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        timeout = self.opts.command_timeout_s
        if name == "code_interpreter":
            code = args.get("code")
            if not isinstance(code, str):
                return "error: code_interpreter needs a string 'code'", {"error": "bad arguments"}
            cmd = f"python3 -I -c {shlex.quote(_CODE_RUNNER)} {','.join(ALLOWED_MODULES)}"
            res = self.sandbox.run(cmd, timeout_s=timeout, stdin=code)
        elif name == "calculator":
            expr = args.get("expression")
            if not isinstance(expr, str):
                return "error: calculator needs a string 'expression'", {"error": "bad arguments"}
            res = self.sandbox.run(f"python3 -I -c {shlex.quote(_CALC_RUNNER)}", timeout_s=timeout, stdin=expr)
        else:
            payload = json.dumps(args)
            self.sandbox.env["TOOL_ARGS"] = payload
            res = self.sandbox.run(self.commands[name], timeout_s=timeout, stdin=payload)
        out = res.output.strip()
        if res.returncode != 0:
            lines = [ln for ln in out.splitlines() if ln.strip()]
            out = "error: " + (lines[-1] if lines else (res.reason or f"exit code {res.returncode}"))
            if res.reason:
                out += f" ({res.reason})"
        if len(out) > MAX_OBSERVATION:
            out = out[:MAX_OBSERVATION] + f"\n[cut: {len(out)} characters]"
        return out, {"returncode": res.returncode, "seconds": round(res.seconds, 3), "reason": res.reason}

    def step(self, message: dict[str, Any]) -> StepResult:
        self.steps += 1
        calls = tool_calls_of(message)
        if not calls:
            self.final = message.get("content") or ""
            return StepResult(messages=[], done=True, info={"end_reason": "answered"})
        out, infos = [], []
        for c in calls:
            self.n_calls += 1
            if c["name"] not in self.names:
                text, info = (f"error: no tool named {c['name']!r}; tools: {', '.join(self.names)}",
                              {"error": "unknown tool", "score": 0.0})
            elif c["arguments"] is None:
                text, info = (f"error: arguments are not a JSON object: {c['raw'][:200]}",
                              {"error": "bad arguments", "score": 0.0})
            else:
                self.well_formed += 1
                text, info = self._run_tool(c["name"], c["arguments"])
                ok = info.get("returncode") == 0
                if ok:
                    self.results.append(text)
                arg = c["arguments"].get("expression", c["arguments"].get("code"))
                info["score"] = call_score(arg if isinstance(arg, str) else json.dumps(c["arguments"]),
                                           text if ok else None, self.task.data.get("label"), self.reference)
            self.call_scores.append(info["score"])
            out.append(tool_message(c["id"], text))
            infos.append({"tool": c["name"], **info})
        done = self.steps >= self.opts.max_steps
        return StepResult(messages=out, done=done, info={"calls": infos, **({"end_reason": "max_steps"} if done else {})})

    def evaluate(self) -> Evaluation:
        final = self.final or ""
        reward, ok = reward_of(final, self.task.data.get("label"), self.n_calls)
        pred = extract_answer(final)
        scores = self.call_scores
        return Evaluation(reward=reward, success=ok, details={
            "pred": pred, "label": self.task.data.get("label"), "n_calls": self.n_calls,
            "well_formed_calls": self.well_formed, "answered": self.final is not None,
            "reference": self.reference, "call_score": sum(scores) / len(scores) if scores else 0.0,
            "exact_call": 1.0 in scores,
            "answer_from_tool": pred is not None and any(score_answer(final, r) == 1.0 for r in self.results)})

    def oracle(self) -> list[dict[str, Any]]:
        label = self.task.data.get("label")
        if "calculator" in self.names:
            expr = self.task.data.get("oracle") or _expression_of(self.task.instruction)
            if expr:
                return [assistant_tool_call("calculator", {"expression": expr}),
                        {"role": "assistant", "content": f"The answer is \\boxed{{{label}}}."}]
        if "code_interpreter" in self.names:
            expr = self.task.data.get("oracle") or _expression_of(self.task.instruction) or repr(str(label))
            return [assistant_tool_call("code_interpreter", {"code": f"print({expr})"}),
                    {"role": "assistant", "content": f"The answer is \\boxed{{{label}}}."}]
        return [{"role": "assistant", "content": f"The answer is \\boxed{{{label}}}."}]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.opts.keep_workspaces:
            shutil.rmtree(self.workspace, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return {"track": self.track, "task_id": self.task.task_id, "tools": self.names,
                "sandbox": self.sandbox.describe()}


def _expression_of(text: str) -> str | None:
    """`12+7` out of "What is 12 + 7?" (the oracle's calculator input)."""
    m = re.search(r"(\d+)\s*([-+*/])\s*(\d+)", text)
    if m:
        return f"{m.group(1)}{m.group(2)}{m.group(3)}"
    m = re.search(r"(\d+)\s+(plus|minus|take away|times)\s+(\d+)", text, re.I)
    if m:
        op = {"plus": "+", "minus": "-", "take away": "-", "times": "*"}[m.group(2).lower()]
        return f"{m.group(1)}{op}{m.group(3)}"
    m = re.search(r"(add|sum of)\s+(\d+)\s+and\s+(\d+)", text, re.I)
    if m:
        return f"{m.group(2)}+{m.group(3)}"
    m = re.search(r"subtract\s+(\d+)\s+from\s+(\d+)", text, re.I)
    if m:
        return f"{m.group(2)}-{m.group(1)}"
    return None


TRACK = ToolCallTrack()
