"""The resolved config as it leaves the process — written into the data dir, uploaded to W&B —
with every secret masked.

    write_resolved(cfg, cfg.data_dir)           # config.resolved.yaml
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import yaml

from clawloop.config import Config, parse_api_key

def _mask_key(entry: str) -> str:
    tenant, key = parse_api_key(entry)
    return "***" if key == entry else f"{tenant}=***"


_URL_USERINFO = re.compile(r"(://)[^/@\s]+@")


def redacted(cfg: Config) -> dict[str, Any]:
    """The config as a dict with every secret masked (tenant names kept, passwords in URLs
    too): what may be written to disk or uploaded (W&B)."""
    data = to_dict(cfg)
    data["serve"]["api_keys"] = [_mask_key(str(e)) for e in cfg.serve.api_keys]
    if data["judge"]["api_key"]:
        data["judge"]["api_key"] = "***"
    data["judge"]["url"] = _URL_USERINFO.sub(r"\1***@", data["judge"]["url"])
    data["train"]["buffer_url"] = _URL_USERINFO.sub(r"\1***@", data["train"]["buffer_url"])
    data["model"]["engine_urls"] = [_URL_USERINFO.sub(r"\1***@", u) for u in data["model"]["engine_urls"]]
    data["store"] = _URL_USERINFO.sub(r"\1***@", data["store"])
    return data


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def write_resolved(cfg: Config, data_dir: str | Path | None = None) -> Path:
    """Write the resolved config (secrets masked, see `redacted`) atomically into the data dir."""
    d = Path(data_dir or cfg.data_dir)
    d.mkdir(parents=True, exist_ok=True)
    data = redacted(cfg)
    out = d / "config.resolved.yaml"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, out)
    return out
