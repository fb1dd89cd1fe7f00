import os
from pathlib import Path


def test_current_points_at_newest_stable():
    link = Path("releases/current")
    assert link.is_symlink()
    assert os.readlink(link).rstrip("/") == "v1.10.0"
    assert (link / "VERSION").read_text() == "v1.10.0\n"


def test_no_stray_link_inside_old_release():
    assert os.readlink("releases/current").rstrip("/") != "v1.2.0"
    assert not Path("releases/v1.2.0/v1.10.0").exists()


def test_current_version_file():
    assert Path("releases/CURRENT_VERSION").read_text().strip() == "v1.10.0"
