"""The agent tracks' environments: one `Env` protocol, one package per track, and what the tracks share.

Shared: `base.py` (the protocol, `Task`, `EnvOptions`, `get_track`), `sandbox.py`
(every command an agent or a check runs), `pool.py` (environments leased locally
or over HTTP), `rollout.py` (the episodes every track's generator runs through
the gateway), `prm.py` (the optional step judge), `check.py` (`clawloop env
check`: oracles and no-ops through each task) and `testrun.py` (the stdlib test
runner the tasks' checks run inside the sandbox, `python -m clawloop.envs.testrun`).

Tracks: `toolcall/`, `terminal/`, `swe/`, `gui/`; each package exports its
`TRACK` and the names its module always had (`from clawloop.envs.terminal import TRACK`).
"""
