import re
import subprocess
import sys
from pathlib import Path


def sources():
    return {str(p): p.read_text() for p in Path("pyapp").rglob("*.py") if "vendor" not in p.parts}


def test_no_old_name_left():
    # vendor's own get_user is still imported under its name
    left = {p: re.findall(r"\bget_user\b", s.replace("import get_user as legacy_get_user", ""))
            for p, s in sources().items()}
    assert not any(left.values()), left
    assert "def fetch_user(user_id):" in Path("pyapp/users/repo.py").read_text()


def test_similar_names_and_vendor_untouched():
    text = "".join(sources().values())
    assert "def get_user_list():" in text and "def get_username(user):" in text
    assert Path("pyapp/vendor/legacy.py").read_text() == 'def get_user(user_id):\n    return f"legacy-{user_id}"\n'
    assert "repo.fetch_user(1)" in Path("pyapp/users/names.py").read_text()


def test_program_still_runs():
    r = subprocess.run([sys.executable, "pyapp/main.py"], capture_output=True, text=True, timeout=30)
    assert r.stdout == "ada 2 Linus legacy-3\n", r.stderr
    assert "fetch_user" in Path("pyapp/main.py").read_text()
