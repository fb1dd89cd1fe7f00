"""Plugins named by path: the one loader behind every plugin flag.

    flag                              contract and adapters            default names
    --custom-loss-function-path       clawloop.losses.plugins          custom_loss, compute_loss
    --custom-rm-path                  clawloop.judge.custom            reward, get_reward_model
    --rollout-function-path           clawloop.buffer.custom           run_rollout
    --custom-generate-function-path   clawloop.buffer.custom           generate

Spellings (ours, and what slime and OpenClaw-RL users already type):

    path/to/file.py:fn     the function `fn` of a Python file
    path/to/file.py        the kind's default name (the first of them the file defines)
    pkg.module:fn          the function `fn` of an importable module
    pkg.module.fn          slime's spelling: when `pkg.module.fn` is not itself a module,
                           the last dotted name is the function
    pkg.module             the kind's default name

A dotted module that is not importable is looked for in the current directory
as well (slime launches with its working directory importable, so
`--custom-rm-path my_rm.reward_func` finds `./my_rm.py`). Everything that goes
wrong is a `PluginError` (a `ConfigError`, so the CLI prints it as a config
error) that names the flag, the spec and what was expected. The contracts of
each kind (and which signatures are accepted) live with the code that calls the
plugin, listed above.

This module imports neither torch nor any clawloop layer above `config`, so the
judge, the buffer and generator child processes can use it cheaply.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from clawloop.config import ConfigError


class PluginError(ConfigError):
    """A plugin spec does not load, or what it names has the wrong shape."""


def _split_spec(spec: str) -> tuple[str, str]:
    """(file or module, function name or "")."""
    target, sep, name = spec.rpartition(":")
    if not sep or len(target) == 1:  # no ":fn", or a Windows drive letter ("C:\\dir\\f.py")
        return spec, ""
    if name and not name.isidentifier():
        raise PluginError(f"plugin spec {spec!r}: {name!r} is not a function name; write file.py:fn or pkg.module:fn")
    return target, name


def _looks_like_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _load_file(target: str, spec: str, what: str) -> Any:
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise PluginError(f"{what} {spec!r}: no such file {str(path)!r}")
    # Unique per path, so two plugins both called loss.py do not collide.
    mod_name = f"clawloop_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"{what} {spec!r}: cannot import {str(path)!r} as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look modules up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[mod_name]
        raise PluginError(f"{what} {spec!r}: importing {str(path)!r} failed: {type(e).__name__}: {e}") from e
    return module


class _NotFound(Exception):
    """The module itself does not exist (as opposed to one of its imports failing)."""


def _import(name: str, spec: str, what: str) -> Any:
    def attempt() -> Any:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if name == missing or name.startswith(missing + "."):
                raise _NotFound(str(e)) from None
            raise PluginError(f"{what} {spec!r}: importing {name!r} failed: {type(e).__name__}: {e}") from e
        except Exception as e:
            raise PluginError(f"{what} {spec!r}: importing {name!r} failed: {type(e).__name__}: {e}") from e

    try:
        return attempt()
    except _NotFound:
        cwd = os.getcwd()
        if cwd in sys.path:
            raise
        sys.path.insert(0, cwd)  # slime's launch folder is importable; ours too, for the import only
        try:
            return attempt()
        finally:
            sys.path.remove(cwd)


def load_callable(spec: str, *, default_name: str | Sequence[str] | None = None,
                  what: str = "plugin") -> Callable[..., Any]:
    """The callable `spec` names (spellings in the module docstring).

    Without a function name, the first of `default_name` the module defines is
    used (a `PluginError` if None). `what` names the flag in messages. Raises
    `PluginError` for a missing file or module, an import that fails (the
    original exception chained), a missing or non-callable name.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"{what}: a plugin spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    target, name = _split_spec(spec)
    if not target:
        raise PluginError(f"{what} {spec!r} names no file or module; write file.py:fn or pkg.module:fn")
    if _looks_like_file(target):
        module = _load_file(target, spec, what)
    else:
        try:
            module = _import(target, spec, what)
        except _NotFound as e:
            parent, _, attr = target.rpartition(".")
            if name or not parent or not attr.isidentifier():
                raise PluginError(f"{what} {spec!r}: cannot import module {target!r}: {e}") from None
            try:  # slime's pkg.module.fn
                module = _import(parent, spec, what)
            except _NotFound as e2:
                raise PluginError(f"{what} {spec!r}: cannot import module {target!r} (nor {parent!r}): {e2}") from None
            name = attr
    if not name:
        defaults = [default_name] if isinstance(default_name, str) else list(default_name or ())
        if not defaults:
            raise PluginError(f"{what} {spec!r} names no function; write file.py:fn or pkg.module:fn")
        name = next((d for d in defaults if hasattr(module, d)), defaults[0])
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items()
                           if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        raise PluginError(f"{what} {spec!r}: {target!r} has no attribute {name!r}; "
                          f"callables defined there: {', '.join(available) or 'none'}")
    fn = getattr(module, name)
    if not callable(fn):
        raise PluginError(f"{what} {spec!r}: {name!r} is a {type(fn).__name__}, not a function")
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
    if accepts(fn, len(expected_params), keywords):
        return
    params = ", ".join([*expected_params, *([f"*, {', '.join(keywords)} (or **kwargs)"] if keywords else [])])
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        found = f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        found = name
    raise PluginError(f"{what}: {found} does not match the expected signature fn({params})")


def accepts(fn: Callable[..., Any], n_positional: int, keywords: Sequence[str] = ()) -> bool:
    """Whether `fn` can be called with `n_positional` positional arguments and these keywords.
    Builtins without a signature are trusted (their first call will tell)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        sig.bind(*([None] * n_positional), **{k: None for k in keywords})
    except TypeError:
        return False
    return True


def positional_names(fn: Callable[..., Any]) -> list[str]:
    """Names of the parameters `fn` takes positionally, in order ([] when it has no signature)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def describe(fn: Callable[..., Any]) -> str:
    """`name(signature)` for messages."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return str(name)


def is_async(fn: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
