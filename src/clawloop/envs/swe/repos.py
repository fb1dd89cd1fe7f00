"""The SWE track's repos as git repos: where the shipped ones are, their files, and the commits built from them.

`init_pristine` commits a repo's files as its only commit and `build_base` the same
files with a bug patch applied, with fixed names and dates, so the same files give
the same sha everywhere: `SWEEnv.reset` rebuilds an instance's `base_commit` from
the shipped files and the instance's `bug_patch` (`clawloop.envs.swe.tasks` made it
the same way).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"
REPOS_DIR = DATA / "swe_repos"
INSTANCES_FILE = DATA / "swe_instances.jsonl"

GIT_DATE = "2024-01-01T00:00:00+0000"
BASE_MESSAGE = "Initial commit"
_SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


# ---- the repos as git repos --------------------------------------------------------------------

def git_env() -> dict[str, str]:
    """Git with no user or system config, fixed identities and dates: commits are reproducible, and the
    workspace may belong to another user (the sandbox's)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(), "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
            "GIT_AUTHOR_NAME": "clawloop", "GIT_AUTHOR_EMAIL": "swe@clawloop.invalid", "GIT_AUTHOR_DATE": GIT_DATE,
            "GIT_COMMITTER_NAME": "clawloop", "GIT_COMMITTER_EMAIL": "swe@clawloop.invalid",
            "GIT_COMMITTER_DATE": GIT_DATE}


def git(cwd: Path, *args: str, stdin: str | None = None, timeout_s: float = 120.0) -> str:
    """Run git on a repo the host made (never on one an agent touched); RuntimeError with git's message."""
    r = subprocess.run(["git", *args], cwd=str(cwd), env=git_env(), input=stdin, capture_output=True, text=True,
                       timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} in {cwd} failed: {(r.stderr or r.stdout).strip()[-1000:]}")
    return r.stdout


def repo_files(root: Path) -> list[str]:
    """The repo's files (relative, sorted): what gets committed. Caches and hidden folders are not."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for f in files:
            if not f.endswith((".pyc", ".pyo")):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def test_files(root: Path) -> list[str]:
    return [f for f in repo_files(root) if f.startswith("tests" + os.sep) and os.path.basename(f).startswith("test_")
            and f.endswith(".py")]


def source_files(root: Path) -> list[str]:
    return [f for f in repo_files(root) if f.endswith(".py") and not f.startswith("tests" + os.sep)
            and not os.path.basename(f).startswith(("test_", "conftest"))]


def copy_files(src: Path, dest: Path) -> None:
    """The repo's files into `dest`, bytes only: modes and times must not leak into the git tree."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in repo_files(src):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((src / rel).read_bytes())
        target.chmod(0o644)


def init_pristine(src: Path, dest: Path) -> str:
    """`src`'s files committed as a new git repo at `dest` (generation's scratch repo); the commit's sha."""
    copy_files(src, dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-verify", "-m", BASE_MESSAGE)
    return git(dest, "rev-parse", "HEAD").strip()


def build_base(src: Path, dest: Path, bug_patch: str) -> str:
    """The buggy tree as the only commit of a new git repo at `dest` (`src`'s files, `bug_patch` applied);
    its sha, the same every time. No parent: the history must not show the bug going in."""
    copy_files(src, dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "apply", "--whitespace=nowarn", "-", stdin=bug_patch)
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-verify", "-m", BASE_MESSAGE)
    return git(dest, "rev-parse", "HEAD").strip()

