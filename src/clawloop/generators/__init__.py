"""Built-in rollout-buffer generators (`*_generator.py`), always discovered.

`math_generator.py` is the built-in `math` task. A file with the same
TASK_TYPE in the user's `--generator-dir` replaces a built-in.
"""

from pathlib import Path

BUILTIN_DIR = Path(__file__).resolve().parent
