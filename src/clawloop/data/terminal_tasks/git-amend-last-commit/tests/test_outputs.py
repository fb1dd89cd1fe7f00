REPO = "reports"

import subprocess
from pathlib import Path


def git(*args, repo=REPO):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_message_fixed():
    assert git("log", "-1", "--format=%s") == "Fix typo in report generator"
    assert git("rev-list", "--count", "HEAD") == "3"


def test_changelog_in_the_commit():
    changed = git("show", "--name-only", "--format=", "HEAD").split()
    assert sorted(changed) == ["CHANGELOG.md", "generator.py"]
    assert git("status", "--porcelain") == ""


def test_earlier_commits_untouched():
    assert git("log", "--format=%s", "HEAD~1") == "Add schedule\nAdd report generator"
    assert 'return "report"' in git("show", "HEAD:generator.py")
    assert git("log", "-1", "--format=%s") != "Fix tpyo in reprot generatr"
