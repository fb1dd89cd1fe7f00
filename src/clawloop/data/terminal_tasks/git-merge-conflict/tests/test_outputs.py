REPO = "site"

import subprocess
from pathlib import Path


def git(*args, repo=REPO):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_merge_commit_on_main():
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    parents = git("log", "-1", "--format=%P").split()
    assert len(parents) == 2
    assert parents[1] == git("rev-parse", "translations")


def test_conflict_resolved():
    assert Path("site/greeting.txt").read_text() == "Hello, world!\nHola, mundo!\nSee you soon\n"
    assert git("show", "HEAD:greeting.txt") == "Hello, world!\nHola, mundo!\nSee you soon"


def test_branch_files_merged_and_clean():
    assert Path("site/index.es.html").read_text() == "<h1>Inicio</h1>\n"
    assert git("status", "--porcelain") == ""
    assert len(git("log", "-1", "--format=%P").split()) == 2
