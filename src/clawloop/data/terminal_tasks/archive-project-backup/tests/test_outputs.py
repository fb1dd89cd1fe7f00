import tarfile
from pathlib import Path

ARCHIVE = Path("backup/project-backup.tar.gz")


def names():
    with tarfile.open(ARCHIVE, "r:gz") as t:
        return {m.name.rstrip("/") for m in t.getmembers()}


def test_archive_is_gzipped_tar():
    assert ARCHIVE.read_bytes()[:2] == b"\x1f\x8b"
    assert all(n == "project" or n.startswith("project/") for n in names())


def test_keeps_sources_and_hidden_files():
    want = {"project/src/app.py", "project/src/utils/text.py", "project/.env", "project/README.md",
            "project/docs/guide.md"}
    assert want <= names()


def test_leaves_out_logs_and_node_modules():
    got = names()
    assert "project/src/app.py" in got
    assert not [n for n in got if n.endswith(".log") or "node_modules" in n]
