REPO = "project"

import subprocess
from pathlib import Path


def git(*args, repo=REPO):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_repository_on_main():
    assert Path("project/.git").is_dir()
    assert git("symbolic-ref", "--short", "HEAD") == "main"


def test_single_initial_commit():
    assert git("rev-list", "--count", "HEAD") == "1"
    assert git("log", "-1", "--format=%s") == "Initial commit"


def test_tracked_files():
    tracked = set(git("ls-files").splitlines())
    assert tracked == {".gitignore", "README.md", "src/calc/__init__.py", "src/calc/core.py", "tests/test_core.py"}


def test_clean_status():
    assert Path("project/.gitignore").is_file()
    assert git("status", "--porcelain") == ""
