import shutil
import subprocess
import sys
import zipfile
from pathlib import Path


def test_is_zip_application():
    assert zipfile.is_zipfile("dist/greeter.pyz")
    names = zipfile.ZipFile("dist/greeter.pyz").namelist()
    assert "__main__.py" in names and any(n.endswith("greeter/text.py") for n in names)


def test_runs_anywhere(tmp_path):
    shutil.copy("dist/greeter.pyz", tmp_path / "g.pyz")
    def run(*args):
        return subprocess.run([sys.executable, "g.pyz", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=30).stdout
    assert run("World") == "Hello, World!\n"
    assert run("Ada", "--shout") == "HELLO, ADA!\n"
