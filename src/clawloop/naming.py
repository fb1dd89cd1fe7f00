"""Names and paths that several layers derive from the config.

The judge writes verdicts under `judge_name(cfg)` and the trainer reads them by
it; both open the store at `store_path(cfg)`. They live here, below `judge/`,
`trainer/` and `runtime.py`, so neither loop imports the orchestration nor the
other loop: runtime -> judge, trainer -> naming -> config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import clawloop.store
from clawloop.config import ConfigError
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
    """The SQLite store `cfg` names: `store` when it is a file, else the one of `cfg.data_dir`."""
    st = getattr(cfg, "store", "")
    if st and not clawloop.store.is_postgres_url(st):
        return Path(st).expanduser()
    return Path(cfg.data_dir) / STORE_FILE


def store_name(cfg: Any) -> str:
    """The store `cfg` names, for messages: its file, or its URL without the password."""
    st = getattr(cfg, "store", "")
    if clawloop.store.is_postgres_url(st):
        return _URL_PASSWORD.sub(r"\1:***@", st)
    return str(store_path(cfg))


_URL_PASSWORD = re.compile(r"(://[^/:@\s]*):[^/@\s]*@")


def store_exists(cfg: Any) -> bool:
    """Whether there is a store to read (a server is always there to ask; `open_store` says if it is not)."""
    return clawloop.store.is_postgres_url(getattr(cfg, "store", "")) or store_path(cfg).exists()


def open_store(cfg: Any) -> Store:
    """Open (create) the store `cfg` names: `store` (a PostgreSQL URL or a SQLite file), else the SQLite
    file of `cfg.data_dir` (through `clawloop.store.open_store`, which picks the implementation). A server
    that cannot be reached, or a URL it refuses, is a ConfigError naming `store`."""
    Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
    st = getattr(cfg, "store", "")
    if not clawloop.store.is_postgres_url(st):
        return clawloop.store.open_store(store_path(cfg))
    try:
        return clawloop.store.open_store(st, spill_path=Path(cfg.data_dir) / "spill.jsonl")
    except ImportError as e:
        raise ConfigError(f"store: {store_name(cfg)} needs the psycopg driver: pip install 'clawloop[postgres]' "
                          f"({e})") from None
    except Exception as e:  # psycopg.OperationalError (refused, no such database, auth), a malformed URL
        if type(e).__module__.split(".")[0] not in ("psycopg", "psycopg_binary") and not isinstance(e, ValueError):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"store: cannot open {store_name(cfg)}: {first}") from None


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
