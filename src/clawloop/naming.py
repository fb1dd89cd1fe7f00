"""Names and paths that several layers derive from the config.

The judge writes verdicts under `judge_name(cfg)` and the trainer reads them by
it; both open the store at `store_path(cfg)`. They live here, below `judge/`,
`trainer/` and `runtime.py`, so neither loop imports the orchestration nor the
other loop: runtime -> judge, trainer -> naming -> config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import clawloop.store
from clawloop.store import Store

STORE_FILE = "clawloop.db"


def model_path(cfg: Any) -> str:
    """The served and trained weights: `model.path`, or the tiny model clawloop builds (the one place
    this default is resolved). `cfg` is the whole config or its model section."""
    m = getattr(cfg, "model", cfg)
    if m.path:
        return str(Path(m.path).expanduser())
    from clawloop.tinymodel.build import default_model_dir

    return str(default_model_dir())


def store_path(cfg: Any) -> Path:
    """The SQLite store of `cfg.data_dir`."""
    return Path(cfg.data_dir) / STORE_FILE


def open_store(cfg: Any) -> Store:
    """Open (create) the store of `cfg.data_dir` (through `clawloop.store.open_store`, which picks
    the implementation)."""
    Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
    return clawloop.store.open_store(store_path(cfg))


def url_judge_name(url: str, model: str) -> str:
    return f"url:{model or urlparse(url).netloc or url}"


def judge_name(cfg: Any) -> str:
    """The store key of the judge `cfg` configures (what the trainer reads judgements by).
    `cfg` is the whole config or its judge section."""
    j = getattr(cfg, "judge", cfg)
    if j.custom_rm_path:
        return f"custom:{j.custom_rm_path}"
    if j.kind == "url":
        return url_judge_name(j.url, j.model)
    return j.kind
