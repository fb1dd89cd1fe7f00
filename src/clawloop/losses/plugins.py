"""Plugins named by path: `file.py:fn` or `pkg.module:fn`, with a clear error on a bad one.

Used for `--custom-loss-function-path` (here) and by the other plugin flags
(`--custom-rm-path`, ...) through `load_callable` and `check_signature`.

Custom loss contract (what `load_custom_loss` checks and the trainer calls):

    def my_loss(logprobs, old_logprobs, advantages, mask, **kwargs):
        # logprobs      (B, T) float, requires grad: the policy's logprobs of the sampled tokens
        # old_logprobs  (B, T) float: the trainer's logprobs before this step (no grad)
        # advantages    (B, T) float: per-token advantages the chosen --method built (no grad)
        # mask          (B, T) bool: True on response tokens that train
        # kwargs        exactly the knobs `ppo_clip_loss` takes, by keyword (CUSTOM_LOSS_KWARGS):
        #               eps_clip, eps_clip_high, dual_clip, agg, denominator (the
        #               step-wide one when micro-batching: use it, see aggregation.py),
        #               is_weights (TIS weights or None). Prefer **kwargs, so knobs
        #               added later do not break your function.
        return loss, stats  # loss: scalar tensor with grad; stats: dict[str, float]

`clawloop.losses.ppo_clip_loss` itself satisfies the contract. With no
`:fn` in the spec, the function named `custom_loss` is used.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

CUSTOM_LOSS_PARAMS: tuple[str, ...] = ("logprobs", "old_logprobs", "advantages", "mask")
CUSTOM_LOSS_KWARGS: tuple[str, ...] = ("eps_clip", "eps_clip_high", "dual_clip", "agg", "denominator", "is_weights")
CUSTOM_LOSS_DEFAULT_NAME = "custom_loss"
CUSTOM_LOSS_SIGNATURE = "fn(logprobs, old_logprobs, advantages, mask, **kwargs) -> (loss, stats)"


class PluginError(ValueError):
    """A plugin spec does not load, or what it names has the wrong shape."""


def _split_spec(spec: str, default_name: str | None) -> tuple[str, str]:
    target, sep, name = spec.rpartition(":")
    if not sep or len(target) == 1:  # no ":fn", or a Windows drive letter ("C:\\dir\\f.py")
        target, name = spec, ""
    elif name and not name.isidentifier():
        raise PluginError(f"plugin spec {spec!r}: {name!r} is not a function name; "
                          "write file.py:fn or pkg.module:fn")
    if not name:
        if default_name is None:
            raise PluginError(f"plugin spec {spec!r} names no function; write file.py:fn or pkg.module:fn")
        name = default_name
    if not target:
        raise PluginError(f"plugin spec {spec!r} names no file or module; write file.py:fn or pkg.module:fn")
    return target, name


def _load_module(target: str, spec: str) -> Any:
    looks_like_file = target.endswith(".py") or "/" in target or "\\" in target
    if looks_like_file:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"plugin {spec!r}: no such file {str(path)!r}")
        # Unique per path, so two plugins both called loss.py do not collide.
        mod_name = f"clawloop_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise PluginError(f"plugin {spec!r}: cannot import {str(path)!r} as a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module  # dataclasses and pickling look modules up here
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[mod_name]
            raise PluginError(f"plugin {spec!r}: importing {str(path)!r} failed: {type(e).__name__}: {e}") from e
        return module
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise PluginError(f"plugin {spec!r}: cannot import module {target!r}: {e}") from e
    except Exception as e:
        raise PluginError(f"plugin {spec!r}: importing {target!r} failed: {type(e).__name__}: {e}") from e


def load_callable(spec: str, *, default_name: str | None = None) -> Callable[..., Any]:
    """The callable `spec` names: `path/to/file.py:fn` or `pkg.module:fn`.

    Without `:fn`, `default_name` is looked up (error if None). Raises
    `PluginError` naming the spec and what went wrong: missing file, import
    failure (with the original exception chained), missing or non-callable name.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin spec must be a non-empty string, got {spec!r}")
    target, name = _split_spec(spec.strip(), default_name)
    module = _load_module(target, spec)
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise PluginError(f"plugin {spec!r}: {target!r} has no attribute {name!r}; "
                          f"callables defined there: {', '.join(available) or 'none'}")
    fn = getattr(module, name)
    if not callable(fn):
        raise PluginError(f"plugin {spec!r}: {name!r} is a {type(fn).__name__}, not a function")
    return fn


def check_signature(
    fn: Callable[..., Any],
    expected_params: Sequence[str],
    what: str,
    *,
    keywords: Sequence[str] = (),
) -> None:
    """Raise `PluginError` unless `fn(*expected_params, **{k: ... for k in keywords})` would bind.

    Positional parameter names need not match, only how many there are;
    `keywords` must be accepted by name or by a `**kwargs`. The message shows
    the expected signature and the one found.
    """
    params = ", ".join([*expected_params, *([f"*, {', '.join(keywords)} (or **kwargs)"] if keywords else [])])
    expected = f"fn({params})"
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C callables: nothing to check, the first call will tell
    try:
        sig.bind(*expected_params, **{k: None for k in keywords})
    except TypeError as e:
        raise PluginError(f"{what}: {name}{sig} does not match the expected signature {expected} ({e})") from None


def load_custom_loss(spec: str) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    """Load and check a custom loss (see the module docstring for the contract).

    Returns a wrapper with the same call signature that also checks what the
    function returns, so a wrong return type fails on the first step with a
    message instead of deep inside `backward()`.
    """
    fn = load_callable(spec, default_name=CUSTOM_LOSS_DEFAULT_NAME)
    check_signature(fn, CUSTOM_LOSS_PARAMS, f"custom loss {spec!r}", keywords=CUSTOM_LOSS_KWARGS)

    def custom_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, dict[str, float]]:
        out = fn(logprobs, old_logprobs, advantages, mask, **kwargs)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise PluginError(f"custom loss {spec!r} returned {type(out).__name__}; "
                              f"expected {CUSTOM_LOSS_SIGNATURE}")
        loss, stats = out
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise PluginError(f"custom loss {spec!r}: loss must be a scalar tensor, got {shape}")
        if not isinstance(stats, dict):
            raise PluginError(f"custom loss {spec!r}: stats must be a dict[str, float], got {type(stats).__name__}")
        try:
            return loss, {str(k): float(v) for k, v in stats.items()}
        except (TypeError, ValueError) as e:
            raise PluginError(f"custom loss {spec!r}: stats values must be numbers ({e})") from None

    custom_loss.__wrapped__ = fn  # type: ignore[attr-defined]
    custom_loss.__doc__ = fn.__doc__
    return custom_loss
