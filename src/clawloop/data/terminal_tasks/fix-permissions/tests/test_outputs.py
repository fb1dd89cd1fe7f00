import os
import stat
from pathlib import Path


def mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_scripts_executable():
    scripts = sorted(Path("bin").glob("*.sh"))
    assert len(scripts) == 3
    assert all(mode(p) == 0o755 for p in scripts)
    assert mode("bin/README") == 0o644


def test_secrets_private():
    assert mode("secrets") == 0o700
    assert {mode(p) for p in Path("secrets").iterdir()} == {0o600}


def test_shared_not_world_writable():
    want = {"shared": 0o775, "shared/uploads": 0o775, "shared/tmp": 0o775,
            "shared/uploads/a.txt": 0o664, "shared/tmp/b.txt": 0o664, "shared/index.html": 0o664}
    assert {p: mode(p) for p in want} == want
