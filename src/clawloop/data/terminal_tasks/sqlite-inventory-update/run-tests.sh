#!/bin/bash
# Runs this task's checks on the workspace (the current directory); TEST_DIR holds tests/.
# -P: the workspace (the cwd) must not shadow clawloop with a package of the agent's making.
python3 -P -m clawloop.envs.testrun "$TEST_DIR/test_outputs.py" --json "$TEST_DIR/results.json"
