"""Custom reward functions: `--custom-rm-path file.py:fn` or `pkg.module:fn`.

The function receives the stored Turn and returns a float or a Judgement,
synchronously or as a coroutine:

    def reward(turn: clawloop.records.Turn) -> float | clawloop.records.Judgement

Accepted spellings: `path/to/file.py:fn`, `pkg.module:fn`, `pkg.module.fn`
(slime style: the last dotted name is the function when the whole path is
not a module), and `file.py` or `pkg.module` alone (the function is then
named `reward`). The signature is checked when the judge is built, so a
wrong one fails at start, showing the expected signature.

A float becomes its sign (score +1, -1 or 0: the store keeps integer
scores). A returned Judgement keeps its votes and hint; its turn id and
judge name are set by clawloop. Sync functions run in a worker thread (they
may be called concurrently from `num_workers` threads). Anything else
returned (None, NaN, a string) raises `JudgeUnavailable`: the turn stays
pending and the error is logged, rather than a wrong score being stored.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from clawloop.config import ConfigError
from clawloop.judge.base import JudgeUnavailable
from clawloop.records import Judgement, Turn

DEFAULT_NAME = "reward"
EXPECTED = ("def reward(turn: clawloop.records.Turn) -> float | clawloop.records.Judgement"
            "   (or `async def`)")


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"--custom-rm-path: no such file {str(path)!r}")
    mod_name = f"clawloop_custom_rm_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--custom-rm-path: cannot import {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise ConfigError(f"--custom-rm-path: importing {str(path)!r} failed: {type(e).__name__}: {e}") from e
    return module


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise
    except Exception as e:
        raise ConfigError(f"--custom-rm-path: importing {name!r} failed: {type(e).__name__}: {e}") from e


def load_callable(spec: str) -> Callable[..., Any]:
    """Resolve `spec` (see the module docstring) to the function, without checking its signature."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("--custom-rm-path: empty")
    target, _, fn_name = spec.rpartition(":") if ":" in spec and not _is_drive(spec) else (spec, "", "")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(Path(target))
    else:
        try:
            module = _import(target)
        except ModuleNotFoundError as e:
            mod_name, _, attr = target.rpartition(".")
            if fn_name or not mod_name:
                raise ConfigError(f"--custom-rm-path: no module {target!r} ({e})") from e
            try:
                module = _import(mod_name)
            except ModuleNotFoundError as e2:
                raise ConfigError(f"--custom-rm-path: no module {target!r} or {mod_name!r} ({e2})") from e2
            fn_name = attr
    fn_name = fn_name or DEFAULT_NAME
    fn = getattr(module, fn_name, None)
    if fn is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"--custom-rm-path {spec}: no function {fn_name!r} (found: {', '.join(found) or 'none'}); "
                          f"expected:\n    {EXPECTED}")
    return fn


def _is_drive(spec: str) -> bool:
    """`C:\\rm.py` is a Windows path, not `module:fn`."""
    return len(spec) > 2 and spec[1] == ":" and spec[0].isalpha() and spec[2] in "\\/" and spec.count(":") == 1


def check_signature(fn: Any, spec: str) -> None:
    """Fail unless `fn` can be called as `fn(turn)`."""
    if not callable(fn):
        raise ConfigError(f"--custom-rm-path {spec}: {fn!r} is not callable; expected:\n    {EXPECTED}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        sig.bind(object())
    except TypeError:
        name = getattr(fn, "__name__", "fn")
        raise ConfigError(f"--custom-rm-path {spec}: {name}{sig} cannot be called with one argument (the turn); "
                          f"expected:\n    {EXPECTED}") from None


def to_score(value: Any) -> int | None:
    """A reward as a store score: its sign; None when it is not a finite number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return (value > 0) - (value < 0)
    try:
        import numbers

        if isinstance(value, numbers.Real) and math.isfinite(float(value)):
            f = float(value)
            return (f > 0) - (f < 0)
    except (TypeError, ValueError):
        pass
    return None


class CustomJudge:
    """Wraps a user reward function as a Judge; see the module docstring."""

    def __init__(self, spec: str):
        self.spec = spec
        self.fn = load_callable(spec)
        check_signature(self.fn, spec)
        self.name = f"custom:{spec}"
        self._is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None))

    async def judge(self, turn: Turn) -> Judgement:
        t0 = time.perf_counter()
        if self._is_async:
            out = await self.fn(turn)
        else:
            out = await asyncio.to_thread(self.fn, turn)
            if inspect.isawaitable(out):
                out = await out
        turn_id = turn.id if turn.id is not None else -1
        latency = time.perf_counter() - t0
        if isinstance(out, Judgement):
            score = to_score(out.score)
            if score is None:
                raise JudgeUnavailable(f"custom reward {self.spec}: Judgement.score={out.score!r} is not a number")
            out.turn_id, out.judge, out.score = turn_id, self.name, score
            out.votes = out.votes or [score]
            out.latency_s = out.latency_s or latency
            return out
        score = to_score(out)
        if score is None:
            raise JudgeUnavailable(f"custom reward {self.spec} returned {out!r}; expected:\n    {EXPECTED}")
        return Judgement(turn_id=turn_id, score=score, votes=[score], judge=self.name, latency_s=latency)

    async def close(self) -> None:
        return None
