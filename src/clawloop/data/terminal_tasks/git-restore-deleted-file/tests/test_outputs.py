REPO = "handbook"

import subprocess
from pathlib import Path


def git(*args, repo=REPO):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_file_restored():
    assert Path("handbook/docs/api.md").read_text() == "# API\n\nGET /items\nPOST /items\nDELETE /items/{id}\n"


def test_restored_in_new_commit():
    assert git("log", "--format=%s").splitlines() == ["Restore docs/api.md", "Add FAQ", "Reorganize docs",
                                                       "Document DELETE", "Document POST", "Start handbook"]
    assert "docs/api.md" in git("ls-tree", "-r", "--name-only", "HEAD").split()


def test_other_docs_and_clean():
    assert Path("handbook/docs/intro.md").read_text() == "# Intro\n\nWelcome.\n"
    assert git("status", "--porcelain") == ""
    assert git("log", "-1", "--format=%s") == "Restore docs/api.md"
