import subprocess
from pathlib import Path


def run(*cmd):
    return subprocess.run(list(cmd), cwd="calc", capture_output=True, text=True, timeout=60)


def test_program_was_built():
    assert Path("calc/calc").is_file()
    assert run("./calc", "hyp", "3", "4").stdout == "5.00\n"


def test_clean_rebuild():
    assert run("make", "clean").returncode == 0
    assert not Path("calc/calc").exists() and not list(Path("calc").glob("*.o"))
    r = run("make")
    assert r.returncode == 0, r.stdout + r.stderr
    assert run("./calc", "add", "2", "3.5").stdout == "5.50\n"
    assert run("./calc", "mul", "1.5", "4").stdout == "6.00\n"
