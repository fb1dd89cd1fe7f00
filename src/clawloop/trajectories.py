"""Export and import sessions in the public trajectory shape, plus token fields.

One session per line:

    {"session_id": "s1", "turns": [
      {"type": "main", "prompt": [...messages...], "response": "19",
       "next_state": {"role": "user", "content": "thanks"}, "trainable": true,
       "prompt_ids": [...], "response_ids": [...], "response_logprobs": [...],
       "policy_version": 0, "response_versions": null, "tenant": "",
       "sampling": {"temperature": 1.0, "top_p": 1.0, "seed": null, "logprobs": "raw"}}]}

On import `prompt` may be a string (one user message) or a list of messages,
`next_state` a string (a user message) or `{"role", "content"}`, and the token
fields may be missing: then the prompt is rendered with the model's chat
template and the response encoded (counted and reported, because those ids
are not the ones a model sampled). `response_versions` (one policy version per
response id, present when a publish fell mid-response) is optional; it needs
`response_ids` beside it, and `policy_version` is then the oldest of them.
`tenant` (the API key's tenant that was served, "" without keys) and `sampling`
(how the response was sampled; null when unknown) are optional too, and so are a thinking model's
`reasoning` (its text, as the client got it) and `reasoning_end` (how many of `response_ids` are
reasoning, the end marker included; it needs `response_ids` beside it). The whole
file is validated before anything is written; an error names the line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from clawloop.records import TURN_MAIN, TURN_SIDE, Turn
from clawloop.store import Store
from clawloop.config import Config


def turn_to_export(t: Turn) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": t.type, "prompt": t.messages, "response": t.response_text, "next_state": t.next_state,
        "trainable": t.trainable, "prompt_ids": t.prompt_ids, "response_ids": t.response_ids,
        "response_logprobs": t.response_logprobs, "policy_version": t.policy_version,
        "response_versions": t.response_versions, "index": t.index, "choice_index": t.choice_index,
        "finish_reason": t.finish_reason, "final": t.final, "tenant": t.tenant, "sampling": t.sampling,
    }
    if t.tools:
        d["tools"] = t.tools
    if t.tool_calls:
        d["tool_calls"] = t.tool_calls
    if t.reasoning is not None or t.reasoning_end is not None:
        d["reasoning"], d["reasoning_end"] = t.reasoning, t.reasoning_end
    return d


def iter_export(store: Store, tenant: str | None = None) -> Iterator[dict[str, Any]]:
    """Sessions in the export shape; with `tenant`, only the sessions of that API key's tenant."""
    for sid, turns in store.iter_sessions():
        if tenant is not None:
            turns = [t for t in turns if (t.tenant or "") == tenant]
            if not turns:
                continue
        yield {"session_id": sid, "turns": [turn_to_export(t) for t in turns]}


def export_sessions(data_dir: str | Path, out: str, tenant: str | None = None, *, store_url: str = "") -> int:
    """Write the sessions of the store of `data_dir` (or `store_url`, a PostgreSQL store: config key `store`)."""
    from types import SimpleNamespace

    from clawloop.naming import open_store as open_named_store
    from clawloop.naming import store_exists, store_path

    named = SimpleNamespace(data_dir=str(data_dir), store=store_url)
    if not store_exists(named):
        from clawloop.config import ConfigError

        raise ConfigError(f"data_dir: no store at {store_path(named)}")
    store = open_named_store(named)
    n = 0
    from clawloop.progress import Progress

    bar = Progress(int(store.stats()["sessions"]), "export", every_s=10.0)
    try:
        if out == "-":
            for s in iter_export(store, tenant):
                sys.stdout.write(json.dumps(s) + "\n")
                n += 1
                bar.update(1)
            return n
        dest = Path(out)
        tmp = dest.with_name(dest.name + ".tmp")
        with tmp.open("w") as f:
            for s in iter_export(store, tenant):
                f.write(json.dumps(s) + "\n")
                n += 1
                bar.update(1)
        tmp.replace(dest)
        return n
    finally:
        bar.close()
        store.close()


class ImportError_(ValueError):
    pass


def _messages_of(prompt: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        from clawloop.gateway.protocol import APIError, normalize_messages

        try:
            return normalize_messages(prompt)
        except APIError as e:
            raise ImportError_(f"{where}.prompt: {e.message}") from None
    raise ImportError_(f"{where}.prompt: expected a string or a list of messages")


def parse_sessions(path: str | Path) -> list[tuple[str, list[dict[str, Any]]]]:
    sessions = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ImportError_(f"{where}: not JSON: {e}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("session_id"), str) or not obj["session_id"]:
                raise ImportError_(f"{where}: needs a non-empty string 'session_id'")
            turns = obj.get("turns")
            if not isinstance(turns, list):
                raise ImportError_(f"{where}: 'turns' must be a list")
            out = []
            for k, t in enumerate(turns):
                tw = f"{where} turns[{k}]"
                if not isinstance(t, dict):
                    raise ImportError_(f"{tw}: must be an object")
                ttype = t.get("type", TURN_MAIN)
                if ttype not in (TURN_MAIN, TURN_SIDE):
                    raise ImportError_(f"{tw}.type: {ttype!r} (main or side)")
                if not isinstance(t.get("response"), str):
                    raise ImportError_(f"{tw}.response: must be a string")
                ns = t.get("next_state")
                if isinstance(ns, str):
                    ns = {"role": "user", "content": ns}
                elif ns is not None and not (isinstance(ns, dict) and isinstance(ns.get("content"), str)):
                    raise ImportError_(f"{tw}.next_state: a string or {{'role', 'content'}}")
                for key in ("prompt_ids", "response_ids"):
                    v = t.get(key)
                    if v is not None and not (isinstance(v, list) and all(isinstance(x, int) for x in v)):
                        raise ImportError_(f"{tw}.{key}: must be a list of ints")
                lps = t.get("response_logprobs")
                if lps is not None:
                    if not (isinstance(lps, list) and all(isinstance(x, (int, float)) for x in lps)):
                        raise ImportError_(f"{tw}.response_logprobs: must be a list of numbers")
                    if t.get("response_ids") is not None and len(lps) != len(t["response_ids"]):
                        raise ImportError_(f"{tw}.response_logprobs: one per response id "
                                           f"({len(lps)} vs {len(t['response_ids'])})")
                versions = t.get("response_versions")
                if versions is not None:
                    if not (isinstance(versions, list) and all(isinstance(x, int) for x in versions)):
                        raise ImportError_(f"{tw}.response_versions: must be a list of ints")
                    if t.get("response_ids") is None or len(versions) != len(t["response_ids"]):
                        raise ImportError_(f"{tw}.response_versions: one per response id, and response_ids "
                                           "must be given beside them")
                    if versions and t.get("policy_version") is not None and t["policy_version"] != min(versions):
                        raise ImportError_(f"{tw}.policy_version: must be the oldest of response_versions "
                                           f"({min(versions)}), got {t['policy_version']}")
                tenant = t.get("tenant", "")
                if tenant is None:
                    tenant = ""
                if not isinstance(tenant, str):
                    raise ImportError_(f"{tw}.tenant: must be a string")
                sampling = t.get("sampling")
                if sampling is not None and not isinstance(sampling, dict):
                    raise ImportError_(f"{tw}.sampling: must be an object")
                reasoning, r_end = t.get("reasoning"), t.get("reasoning_end")
                if reasoning is not None and not isinstance(reasoning, str):
                    raise ImportError_(f"{tw}.reasoning: must be a string")
                if r_end is not None and not (isinstance(r_end, int) and t.get("response_ids") is not None
                                              and 0 <= r_end <= len(t["response_ids"])):
                    raise ImportError_(f"{tw}.reasoning_end: an index into response_ids (given beside it)")
                version = t.get("policy_version")
                if version is None and versions:
                    version = min(versions)
                out.append({
                    "type": ttype, "messages": _messages_of(t.get("prompt"), tw), "response": t["response"],
                    "next_state": ns, "trainable": bool(t.get("trainable", ttype == TURN_MAIN)),
                    "prompt_ids": t.get("prompt_ids"), "response_ids": t.get("response_ids"),
                    "response_logprobs": lps, "policy_version": int(version or 0), "response_versions": versions,
                    "tools": t.get("tools"), "tool_calls": t.get("tool_calls"),
                    "tenant": tenant, "sampling": sampling, "reasoning": reasoning, "reasoning_end": r_end,
                })
            sessions.append((obj["session_id"], out))
    return sessions


def import_sessions(cfg: Config, path: str | Path) -> tuple[int, int]:
    """Validate `path` whole, then write its sessions (closed, last main turn
    final). Returns (sessions, turns). Refuses session ids already stored."""
    from clawloop.config import ConfigError

    try:
        sessions = parse_sessions(path)
    except FileNotFoundError:
        raise ConfigError(f"--file: no such file {path!r}") from None
    except ImportError_ as e:
        raise ConfigError(str(e)) from None
    from clawloop.naming import open_store as open_data_dir_store  # the store of cfg.data_dir (created)

    store = open_data_dir_store(cfg)
    tok = None
    retokenized = 0
    try:
        dup = [sid for sid, _ in sessions if store.session_turns(sid)]
        if dup:
            raise ConfigError(f"{path}: session {dup[0]!r} is already in the store ({len(dup)} duplicate(s)); "
                              "nothing imported")
        rows: list[tuple[str, list[Turn], int | None]] = []
        for sid, turns in sessions:
            built, last_main = [], None
            for i, t in enumerate(turns):
                if t["prompt_ids"] is None or t["response_ids"] is None:
                    if tok is None:
                        tok = _tokenizer(cfg)
                    retokenized += 1
                from clawloop.gateway.render import render_prompt

                prompt_ids = t["prompt_ids"] if t["prompt_ids"] is not None else render_prompt(
                    tok, t["messages"], t["tools"])
                if t["response_ids"] is not None:
                    response_ids = t["response_ids"]
                else:
                    response_ids = list(tok.encode(t["response"], add_special_tokens=False)) + [tok.eos_token_id]
                built.append(Turn(
                    session_id=sid, index=i, type=t["type"], messages=t["messages"], tools=t["tools"],
                    prompt_ids=prompt_ids, response_ids=response_ids,
                    response_logprobs=t["response_logprobs"] or [], response_text=t["response"],
                    tool_calls=t["tool_calls"], policy_version=t["policy_version"],
                    response_versions=t["response_versions"], next_state=t["next_state"],
                    trainable=t["trainable"] and t["type"] == TURN_MAIN, request_id="import",
                    tenant=t["tenant"], sampling=t["sampling"], reasoning=t["reasoning"],
                    reasoning_end=t["reasoning_end"],
                    next_state_at=time.time() if t["next_state"] is not None else None,
                ))
                if t["type"] == TURN_MAIN:
                    last_main = i
            rows.append((sid, built, last_main))
        from clawloop.progress import Progress

        with Progress(len(rows), "import", every_s=10.0) as bar:
            for sid, built, last_main in rows:
                for t in built:
                    store.add_turn(t)
                store.close_session(sid, "import", last_main)
                bar.update(1)
        store.flush()
    finally:
        store.close()
    if retokenized:
        print(f"warning: {retokenized} turn(s) had no token ids and were tokenized with the chat template",
              file=sys.stderr)
    return len(sessions), sum(len(t) for _, t in sessions)


def _tokenizer(cfg: Config):
    from transformers import AutoTokenizer

    from clawloop.naming import model_path

    return AutoTokenizer.from_pretrained(model_path(cfg))
