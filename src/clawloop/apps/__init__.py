"""The one place that composes clawloop's parts for each way of running it.

Components — the gateway, the judge loop, the trainer loop, the rollout buffer, the engines and the
store — know nothing of how they are deployed. The modules here build them from the config, wire
them together and inject the Ray-backed variants (engine actors, a data-parallel trainer group,
env-pool actors, judge actors) where `--ray` asks for them:

    serve.py    `clawloop up` / `clawloop serve`: engine + store + gateway (+ judge + trainer)
    train.py    `clawloop train`: the trainer alone, on a store or a rollout buffer
    judge.py    `clawloop judge`: the judge loop alone, on a store
    buffer.py   `clawloop buffer`: the rollout buffer service (+ env-pool actors)
    services.py the judge and trainer as background services of one process
    observe.py  metrics export (TensorBoard, W&B) and the live terminal status

Nothing below this package imports it (tests/test_structure.py checks it).
"""
