import subprocess
from pathlib import Path

CASES = ["one two three\n", "  leading and   several   blanks\t\tand tabs\n", "", "\n\n   \n", "no-newline-at-end",
         "a\nb\nc d\te\n"]


def count(exe, text):
    return subprocess.run([exe], input=text, capture_output=True, text=True, timeout=10).stdout.strip()


def test_source_compiles(tmp_path):
    r = subprocess.run(["gcc", "-Wall", "-o", str(tmp_path / "w"), "wc_lite.c"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [count(str(tmp_path / "w"), t) for t in CASES] == [str(len(t.split())) for t in CASES]


def test_built_executable_counts():
    assert Path("wc_lite").is_file()
    assert [count("./wc_lite", t) for t in CASES] == [str(len(t.split())) for t in CASES]
