"""The rollout buffer: per-task generators write trajectories over HTTP, the
trainer pulls finished groups (slime's Rollout Buffer design, durable).

    clawloop buffer --generator-dir DIR --data-dir D     # the service (port 8889; clawloop.apps.buffer)
    clawloop buffer new-generator NAME                   # a commented template
    BufferSource(url, tokenizer).pull()                  # trainer side -> list[Sample]

Modules: `service` (HTTP API), `store` (SQLite group state), `discovery`
(generator files), `hooks` (the five optional hooks and their defaults),
`runner` (a generator's child process), `source` (Samples for the trainer).
"""

from clawloop.buffer.discovery import (
    Generator,
    GeneratorError,
    discover_generators,
    write_generator_template,
)
from clawloop.buffer.service import BufferThread, RolloutBuffer, create_buffer_app
from clawloop.buffer.source import BufferSource

__all__ = [
    "BufferSource",
    "BufferThread",
    "Generator",
    "GeneratorError",
    "RolloutBuffer",
    "create_buffer_app",
    "discover_generators",
    "write_generator_template",
]
