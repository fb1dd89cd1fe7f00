REPO = "webapp"

import subprocess
from pathlib import Path


def git(*args, repo=REPO):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_commit_hash():
    want = git("log", "--diff-filter=A", "--format=%H", "--", "config/secrets.env")
    assert len(want) == 40
    assert Path("leak_commit.txt").read_text().strip() == want


def test_key():
    assert Path("leaked_key.txt").read_text().strip() == "sk_live_9f8e7d6c5b4a"
