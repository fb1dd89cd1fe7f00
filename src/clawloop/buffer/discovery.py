"""Finding generator files, and writing a new one from the template.

A generator is a file named `*_generator.py` that defines `TASK_TYPE` (a
string, unique) and `run_rollout(data)`, and may define the five hooks of
`clawloop.buffer.hooks`; or a function named by `--rollout-function-path`
(`clawloop.buffer.custom`), found beside the files. The built-in generators (`clawloop/generators/`) are
always found; files in the user's `--generator-dir` are found beside them, and
a user file whose TASK_TYPE equals a built-in one replaces the built-in (so
slime's own `math` generator can be dropped in). Two user files with the same
TASK_TYPE, a file missing either name, a file that does not import, or a hook
that cannot take the arguments the buffer passes, is a `GeneratorError` that
names every offending file.

    gens = discover_generators("my_generators/")   # {task_type: Generator}
    gens = discover_generators(None, rollout_function_path="my_rollout.py:run")
    path = write_generator_template("coding", "my_generators/")
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from clawloop.buffer.hooks import DEFAULT_HOOKS, HOOK_ARITY, HOOK_NAMES
from clawloop.config import ConfigError

log = logging.getLogger(__name__)

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "generators"
TEMPLATE_PATH = Path(__file__).resolve().parent / "generator_template.py"
PATTERN = "*_generator.py"


class GeneratorError(ConfigError):
    """A generator file is broken; the message names the file(s)."""


@dataclass
class Generator:
    task_type: str
    path: Path
    run_rollout: Callable[[dict[str, Any]], Any]
    hooks: dict[str, Callable[..., Any]] = field(default_factory=lambda: dict(DEFAULT_HOOKS))
    custom_hooks: tuple[str, ...] = ()
    """Names of the hooks the file defines itself (the rest are defaults)."""
    builtin: bool = False
    entry: str | None = None
    """What the child process runs: a `--rollout-function-path` spec; None: the file's `run_rollout`."""


def load_module(path: Path) -> ModuleType:
    """Import a file under a unique module name (registered in sys.modules so
    multiprocessing inside a generator can pickle its functions)."""
    path = Path(path).resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"clawloop_gen_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _accepts(fn: Callable[..., Any], n_positional: int) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # builtins and C functions: trust them
    try:
        sig.bind(*([None] * n_positional))
    except TypeError:
        return False
    return True


def inspect_file(path: Path, builtin: bool = False) -> tuple[Generator | None, list[str]]:
    """Load one generator file: (generator, []) or (None, [problems])."""
    try:
        module = load_module(path)
    except Exception as e:  # noqa: BLE001 - any import failure is the file's problem
        return None, [f"{path}: import failed: {type(e).__name__}: {e}"]
    problems = []
    task_type = getattr(module, "TASK_TYPE", None)
    run = getattr(module, "run_rollout", None)
    if task_type is None:
        problems.append(f"{path}: does not define TASK_TYPE")
    elif not isinstance(task_type, str) or not task_type:
        problems.append(f"{path}: TASK_TYPE must be a non-empty string, got {task_type!r}")
    if run is None:
        problems.append(f"{path}: does not define run_rollout(data)")
    elif not callable(run) or not _accepts(run, 1):
        problems.append(f"{path}: run_rollout must be a function taking one argument (data)")
    hooks, custom = _hooks(module, path, problems)
    if problems:
        return None, problems
    return Generator(task_type, Path(path).resolve(), run, hooks, tuple(custom), builtin), []


def _hooks(module: Any, path: Path, problems: list[str]) -> tuple[dict[str, Callable[..., Any]], list[str]]:
    """The module's hooks over the defaults, and the names it defines itself; problems appended."""
    hooks = dict(DEFAULT_HOOKS)
    custom = []
    for name in HOOK_NAMES:
        fn = getattr(module, name, None)
        if fn is None:
            continue
        if not callable(fn) or not _accepts(fn, HOOK_ARITY[name]):
            problems.append(f"{path}: {name} must accept {HOOK_ARITY[name]} positional argument(s) "
                            f"(see clawloop.buffer.hooks for the signature)")
            continue
        hooks[name] = fn
        custom.append(name)
    return hooks, custom


def rollout_function_generator(spec: str) -> Generator:
    """A `--rollout-function-path` spec as a Generator (see clawloop.buffer.custom)."""
    from clawloop.buffer.custom import rollout_function

    task_type, source, entry, module = rollout_function(spec)
    problems: list[str] = []
    hooks, custom = _hooks(module, source, problems)
    if problems:
        raise GeneratorError("--rollout-function-path: " + "; ".join(problems))
    run = getattr(module, entry.rpartition(":")[2])
    return Generator(task_type, source, run, hooks, tuple(custom), False, entry)


def generator_files(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        raise GeneratorError(f"generator dir {d} does not exist or is not a folder")
    return sorted(d.glob(PATTERN))


def discover_generators(generator_dir: str | Path | None = None, *, include_builtin: bool = True,
                        rollout_function_path: str = "") -> dict[str, Generator]:
    """Every generator in the built-in folder and in `generator_dir`, plus the
    `rollout_function_path` function, by TASK_TYPE.

    Raises GeneratorError listing every broken file and every duplicate TASK_TYPE."""
    problems: list[str] = []
    found: dict[str, Generator] = {}

    def scan(files: list[Path], builtin: bool) -> dict[str, Generator]:
        tier: dict[str, Generator] = {}
        for f in files:
            gen, errs = inspect_file(f, builtin)
            problems.extend(errs)
            if gen is None:
                continue
            if gen.task_type in tier:
                problems.append(f"duplicate TASK_TYPE {gen.task_type!r} in {tier[gen.task_type].path} and {f}")
                continue
            tier[gen.task_type] = gen
        return tier

    if include_builtin:
        found.update(scan(generator_files(BUILTIN_DIR), True))
    if generator_dir:
        user_dir = Path(generator_dir).resolve()
        if include_builtin and user_dir == BUILTIN_DIR:
            user = {}
        else:
            user = scan(generator_files(user_dir), False)
        for task_type, gen in user.items():
            if task_type in found:
                log.info("generator %s replaces the built-in %r generator", gen.path, task_type)
            found[task_type] = gen
    if rollout_function_path:
        try:
            gen = rollout_function_generator(rollout_function_path)
        except ConfigError as e:  # PluginError or GeneratorError: say which flag
            problems.append(str(e))
        else:
            if gen.task_type in found and not found[gen.task_type].builtin:
                problems.append(f"duplicate TASK_TYPE {gen.task_type!r} in {found[gen.task_type].path} and "
                                f"--rollout-function-path {rollout_function_path}")
            else:
                found[gen.task_type] = gen
    if problems:
        raise GeneratorError("generator discovery failed:\n  " + "\n  ".join(problems))
    return found


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def write_generator_template(name: str, directory: str | Path = ".") -> Path:
    """Write `<directory>/<name>_generator.py`, a commented, working template with
    TASK_TYPE = name. Refuses to overwrite an existing file."""
    if name.endswith("_generator"):
        name = name[: -len("_generator")]
    if not _NAME_RE.match(name):
        raise ValueError(f"generator name {name!r}: use letters, digits and underscores (a Python identifier)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = d / f"{name}_generator.py"
    if out.exists():
        raise FileExistsError(f"{out} already exists; not overwriting it")
    text = TEMPLATE_PATH.read_text()
    text = text.replace('TASK_TYPE = "my_task"', f'TASK_TYPE = "{name}"', 1)
    out.write_text(text)
    return out
