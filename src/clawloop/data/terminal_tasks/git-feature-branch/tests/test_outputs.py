REPO = "api"

import subprocess
from pathlib import Path


def git(*args, repo=REPO):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_branch_checked_out():
    assert git("symbolic-ref", "--short", "HEAD") == "feature/rate-limit"


def test_branch_starts_at_main_and_main_unchanged():
    assert git("log", "--format=%s", "main") == "Add README\nAdd handler"
    assert git("rev-parse", "feature/rate-limit~1") == git("rev-parse", "main")


def test_module_committed_and_works():
    assert "ratelimit.py" in git("ls-tree", "--name-only", "feature/rate-limit").split()
    assert git("status", "--porcelain") == ""
    src = git("show", "feature/rate-limit:ratelimit.py")
    ns = {}
    exec(src, ns)
    assert ns["allow"](1, 2) is True and ns["allow"](2, 2) is False and ns["allow"](5, 2) is False
