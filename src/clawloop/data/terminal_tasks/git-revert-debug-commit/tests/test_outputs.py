REPO = "service"

import subprocess
from pathlib import Path


def git(*args, repo=REPO):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_reverted():
    assert Path("service/settings.py").read_text() == "DEBUG = False\nWORKERS = 8\n"


def test_history_kept_and_extended():
    subjects = git("log", "--format=%s").splitlines()
    assert subjects[1:] == ["Add deploy config", "Log startup", "Turn on debugging to chase the login bug",
                            "Scale up workers", "Initial service"]
    assert subjects[0] != "Add deploy config"


def test_later_changes_kept():
    assert 'print("running")' in Path("service/app.py").read_text()
    assert Path("service/deploy.yaml").read_text() == "timeout: 30\n"
    assert git("status", "--porcelain") == ""
    assert "DEBUG = False" in git("show", "HEAD:settings.py")
