import subprocess
import sys


def stats(tmp_path, text):
    p = tmp_path / "nums.txt"
    p.write_text(text)
    r = subprocess.run([sys.executable, "stats.py", str(p)], capture_output=True, text=True, timeout=30)
    return r.stdout.strip()


def test_blank_lines_ignored(tmp_path):
    assert stats(tmp_path, "3\n\n1\n2\n\n") == "count=3 mean=2.00 median=2.00 max=3"


def test_even_count_median(tmp_path):
    assert stats(tmp_path, "10\n4\n1\n7\n") == "count=4 mean=5.50 median=5.50 max=10"


def test_decimals_and_negatives(tmp_path):
    assert stats(tmp_path, "-2.5\n  \n4.25\n1\n-7\n9.5\n0\n") == "count=6 mean=0.88 median=0.50 max=9.5"
