#!/bin/bash
set -euo pipefail
mkdir -p project/src/calc project/build/lib project/tests
printf 'def add(a, b):\n    return a + b\n' > project/src/calc/core.py
printf '' > project/src/calc/__init__.py
printf 'from calc.core import add\n\ndef test_add():\n    assert add(1, 2) == 3\n' > project/tests/test_core.py
printf 'compiled' > project/src/calc/core.cpython-311.pyc
printf 'compiled' > project/tests/test_core.pyc
printf 'artifact' > project/build/lib/core.so
printf '# calc\n' > project/README.md
