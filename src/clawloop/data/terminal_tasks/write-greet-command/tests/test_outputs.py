import os
import subprocess


def greet(*args):
    return subprocess.run([os.path.abspath("bin/greet"), *args], capture_output=True, text=True, timeout=10)


def test_executable_greets():
    assert os.access("bin/greet", os.X_OK)
    assert greet("Ada").stdout == "Hello, Ada!\n"
    assert greet("Grace Hopper").stdout == "Hello, Grace Hopper!\n"


def test_upper_case():
    assert greet("-u", "Ada").stdout == "HELLO, ADA!\n"


def test_usage_error():
    r = greet()
    assert r.returncode == 2 and r.stdout == "" and "usage: greet [-u] NAME" in r.stderr
