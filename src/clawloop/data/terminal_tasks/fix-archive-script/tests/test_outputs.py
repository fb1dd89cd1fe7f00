import os
import subprocess
from pathlib import Path


def test_archive_made():
    assert sorted(p.name for p in Path("archive").iterdir()) == ["inventory.csv", "sales q1.csv", "sales q2.csv"]
    assert Path("archive/sales q1.csv").read_text() == "data for sales q1.csv\n"


def test_script_on_fresh_folders(tmp_path):
    src = tmp_path / "in dir"
    src.mkdir()
    for name in ("a b.csv", "c.csv", "d  e.csv", "skip.txt"):
        (src / name).write_text(name)
    dest = tmp_path / "out" / "nested"
    r = subprocess.run(["bash", os.path.abspath("archive_reports.sh"), str(src), str(dest)], capture_output=True,
                       text=True, timeout=30)
    assert r.stdout.strip() == "archived 3 files"
    assert sorted(p.name for p in dest.iterdir()) == ["a b.csv", "c.csv", "d  e.csv"]


def test_script_with_no_csv(tmp_path):
    (tmp_path / "src").mkdir()
    r = subprocess.run(["bash", os.path.abspath("archive_reports.sh"), str(tmp_path / "src"), str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "archived 0 files"
    assert (tmp_path / "d").is_dir()
