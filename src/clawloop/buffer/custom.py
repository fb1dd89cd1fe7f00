"""Plugin functions for the rollout buffer's generators.

`--rollout-function-path file.py:fn` (or pkg.module:fn)
    `fn(data)` runs like a generator file's `run_rollout(data)`: in its own
    process group, with the `/start_rollout` payload, posting items to
    `data["remote_buffer_url"] + "/buffer/write"`. It is one more generator: its
    task type is its module's `TASK_TYPE` when defined, else the function's name;
    the module's hooks (`is_valid_group`, ...) apply as in a generator file. It
    replaces a built-in of the same task type; clashing with a file of
    `--generator-dir` is an error. Without `:fn`, `run_rollout` is used.

`--custom-generate-function-path file.py:fn` (or pkg.module:fn)
    How the built-in generators (math) get one answer, instead of asking the
    gateway. Two signatures, told apart by their positional parameters:

        slime's:    [async] def generate(args, sample, sampling_params) -> sample
        clawloop's: [async] def generate(messages, sampling_params) -> str | dict

    slime's gets a `GenerateSample` (slime's field names: `prompt` = the
    messages, `label`, `metadata`) and sets `response` and, to keep the item
    token-exact, `tokens` (prompt + response ids), `response_length` and
    `rollout_log_probs` (one per response id); `args` is the payload as a
    namespace. clawloop's returns the text, or a dict with `text` and
    optionally `prompt_ids`, `response_ids`, `response_logprobs`,
    `policy_version`, `finish_reason`. `sampling_params` holds `temperature`,
    `top_p`, `max_tokens` (also as slime's `max_new_tokens`) and `stop` when set.
    Without `:fn`, `generate` is used. The spec reaches a generator's process as
    the payload key `custom_generate_function_path`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from clawloop.plugins import PluginError, accepts, describe, is_async, load_callable

ROLLOUT_FLAG = "--rollout-function-path"
GENERATE_FLAG = "--custom-generate-function-path"
ROLLOUT_SIGNATURE = "def run_rollout(data) -> Any   (posts items to data['remote_buffer_url'] + '/buffer/write')"
GENERATE_SIGNATURES = ("[async] def generate(args, sample, sampling_params) -> sample   (slime)\n"
                       "    [async] def generate(messages, sampling_params) -> str | dict   (clawloop)")


@dataclass
class GenerateSample:
    """One prompt under slime's `Sample` field names, for slime-style generate functions."""

    prompt: list[dict[str, Any]]
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int | None = None
    response: str = ""
    tokens: list[int] = field(default_factory=list)
    response_length: int = 0
    rollout_log_probs: list[float] | None = None
    policy_version: int | None = None
    status: str = "pending"
    reward: Any = None


class GenerateFunction:
    """A user generate function behind one call: `(messages, label, sampling, data) -> result dict`."""

    def __init__(self, spec: str):
        self.spec = spec
        self.fn = load_callable(spec, default_name="generate", what=GENERATE_FLAG)
        if accepts(self.fn, 3):
            self.kind = "slime"
        elif accepts(self.fn, 2):
            self.kind = "clawloop"
        else:
            raise PluginError(f"{GENERATE_FLAG} {spec}: {describe(self.fn)} fits no accepted signature; expected one "
                              f"of:\n    {GENERATE_SIGNATURES}")
        self._async = is_async(self.fn)

    def _run(self, *args: Any) -> Any:
        out = self.fn(*args)
        if self._async or inspect.isawaitable(out):
            return asyncio.run(_await(out))  # generator threads have no event loop of their own
        return out

    def __call__(self, messages: list[dict[str, Any]], *, label: Any = None, sampling: dict[str, Any],
                 data: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """{"text", "finish_reason", "token_exact", and when exact "prompt_ids", "response_ids",
        "response_logprobs"; "policy_versions"}."""
        params = dict(sampling)
        if "max_tokens" in params:
            params.setdefault("max_new_tokens", params["max_tokens"])
        if self.kind == "slime":
            sample = GenerateSample(prompt=list(messages), label=label, metadata=dict(metadata or {}))
            out = self._run(argparse.Namespace(**data), sample, params)
            sample = out if out is not None else sample
            return self._from_sample(sample)
        return self._from_value(self._run(list(messages), params))

    def _from_sample(self, s: Any) -> dict[str, Any]:
        text = getattr(s, "response", None)
        if not isinstance(text, str):
            raise PluginError(f"{GENERATE_FLAG} {self.spec}: the sample's response is {text!r}; expected the "
                              "generated text (set sample.response)")
        tokens = list(getattr(s, "tokens", None) or [])
        n = int(getattr(s, "response_length", 0) or 0)
        lps = getattr(s, "rollout_log_probs", None)
        res: dict[str, Any] = {"text": text, "finish_reason": "stop", "token_exact": False,
                               "policy_versions": _versions(getattr(s, "policy_version", None))}
        if 0 < n < len(tokens) and lps is not None and len(lps) == n:
            res.update(token_exact=True, prompt_ids=tokens[:-n], response_ids=tokens[-n:],
                       response_logprobs=[float(x) for x in lps])
        return res

    def _from_value(self, out: Any) -> dict[str, Any]:
        if isinstance(out, str):
            return {"text": out, "finish_reason": "stop", "token_exact": False, "policy_versions": []}
        if not isinstance(out, dict) or not isinstance(out.get("text"), str):
            raise PluginError(f"{GENERATE_FLAG} {self.spec} returned {type(out).__name__}; expected the text or a "
                              "dict with 'text' (and optionally prompt_ids, response_ids, response_logprobs)")
        res = {"text": out["text"], "finish_reason": out.get("finish_reason", "stop"), "token_exact": False,
               "policy_versions": _versions(out.get("policy_version"))}
        p, r, lp = out.get("prompt_ids"), out.get("response_ids"), out.get("response_logprobs")
        if isinstance(p, list) and isinstance(r, list) and isinstance(lp, list) and len(r) == len(lp) and r:
            res.update(token_exact=True, prompt_ids=list(p), response_ids=list(r),
                       response_logprobs=[float(x) for x in lp])
        return res


async def _await(x: Any) -> Any:
    return await x


def _versions(v: Any) -> list[int]:
    return [] if v is None else [int(v)]


def rollout_function(spec: str) -> tuple[str, Path, str, Any]:
    """(task type, source file, child entry spec, module) of a `--rollout-function-path` spec."""
    fn = load_callable(spec, default_name="run_rollout", what=ROLLOUT_FLAG)
    if not accepts(fn, 1):
        raise PluginError(f"{ROLLOUT_FLAG} {spec}: {describe(fn)} cannot be called with the payload; expected:\n"
                          f"    {ROLLOUT_SIGNATURE}")
    module = inspect.getmodule(fn)
    try:
        source = Path(inspect.getsourcefile(fn) or "")
    except TypeError:
        source = Path("")
    if not source.is_file():
        raise PluginError(f"{ROLLOUT_FLAG} {spec}: {describe(fn)} has no source file to run in a child process")
    task_type = getattr(module, "TASK_TYPE", None) or getattr(fn, "__name__", None)
    if not isinstance(task_type, str) or not task_type:
        raise PluginError(f"{ROLLOUT_FLAG} {spec}: TASK_TYPE must be a non-empty string, got {task_type!r}")
    name = spec.rpartition(":")[2] if ":" in spec and len(spec.rpartition(":")[0]) > 1 else fn.__name__
    return task_type, source.resolve(), f"{source.resolve()}:{name}", module


def check_generate_function(spec: str) -> Callable[..., Any]:
    """Load and check a `--custom-generate-function-path` spec (at buffer start, to fail early)."""
    return GenerateFunction(spec)
