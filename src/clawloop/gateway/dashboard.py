"""The web dashboard: a page at `/` and the JSON API it reads, served by the gateway's own process.

    app = create_app(cfg, engine, store)      # gateway/app.py mounts it
    # then open http://127.0.0.1:8000/

The page (`clawloop/dashboard/`: index.html, app.js, style.css) is plain HTML and
JavaScript with hand-drawn SVG charts: no build step, no CDN, nothing from the
network but this server, and it reads nothing but the endpoints below. It shows the
served policy version and serving figures, the publish gate's last verdict (the
trainer's `gate/*` stats: candidate version, score against baseline, refusals),
the sessions (newest first) and each one's turns with the judge's verdict and
whether the trainer has consumed it,
judge and trainer charts over time, the rollout buffer (when `clawloop up --buffer
URL` attached one) and the learning curves `clawloop demo` / `clawloop eval` post.
`#/session/<id>` opens a session directly.

Auth: with API keys (`--api-key`), every /api endpoint wants a key exactly like /v1
(`Authorization: Bearer KEY`, 401 otherwise) and a tenant sees only its own
sessions; the status, history, verdict-count, buffer and results endpoints are
server-wide figures (what /metrics shows). The page and its files load without a
key; the page then asks for one and keeps it in the tab's sessionStorage. Errors
use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`. Only the
files shipped in `clawloop/dashboard/` are served, by name.

Endpoints:

    GET  /                      the page; GET /dashboard/{file}: its script and style sheet
    GET  /api/status            {"now", "started_at", "model", "policy_version", "auth", "tenant", "health",
                                 "serving": {"requests", "inflight", "queued", "slots_used", "capacity",
                                   "max_queued", "timeouts", "queue_full_refusals", "store_overload_refusals",
                                   "by_code": {code: n}, "errors_4xx", "errors_5xx",
                                   "latency": {"count", "mean_s", "p50_s", "p95_s"}},
                                 "capture", "judge", "train": {"method", "source", "cursor", "buffer_url"},
                                 "history_interval_s", "stats": {every stats key /metrics exports}}
    GET  /api/sessions?limit=20&offset=0[&judge=NAME]
                                {"total", "limit", "offset", "judge", "data": [{"session_id", "tenant",
                                 "turns", "rows", "main_turns", "created_at", "last_seen", "closed",
                                 "closed_at", "closed_reason", "judged", "score_pos", "score_zero",
                                 "score_neg", "last_version"}]}, most recently active first; verdict
                                 counts are those of `judge` (default: the judge the trainer reads)
    GET  /api/sessions/{id}?limit=200&offset=0
                                {"session": <a /api/sessions row>, "trainer": {"judge", "method",
                                 "source", "cursor"}, "total", "limit", "offset", "data": [turn]}, a turn:
                                 {"id", "index", "choice_index", "type", "created_at", "finish_reason",
                                 "policy_version", "versions": [oldest, newest], "prompt", "last_role",
                                 "messages", "response", "tool_calls", "next_state", "next_state_at",
                                 "final", "trainable", "prompt_tokens", "response_tokens", "truncated",
                                 "judgements": [{"id", "judge", "score", "reward", "votes", "hint",
                                 "hints", "malformed", "latency_s", "created_at"}],
                                 "train": {"state", "judgement_id", "at"}}; 404: unknown or another tenant's
    GET  /api/history?since=T   {"now", "interval_s", "keys", "t": [...], "series": {key: [value|null]}}:
                                 the stats sampled every interval_s since this process started (the last
                                 hour), those after unix time T
    GET  /api/judgements?since=T&bucket_s=60[&judge=NAME]
                                {"now", "judge", "bucket_s", "data": [{"t", "pos", "zero", "neg"}]}: verdicts
                                 stored per window since T (default: the last hour), from the store
    GET  /api/buffer            {"attached": false} or {"attached": true, "url", "ok", "error", "stats",
                                 "source": {buffer/* stats of this trainer}}: `stats` is the rollout
                                 buffer's own GET /buffer/stats answer (total_written, total_read,
                                 open_groups, ready_groups, dropped_*, per_task: {task: {written, read,
                                 open_groups, open_items, ready_groups, ready_items, group_size}},
                                 rollouts, current_task), fetched by this server
    GET  /api/results?limit=20  {"data": [result]}, newest `created_at` first
    POST /api/results           {"kind": "demo"|"eval", "name", "created_at": unix time,
                                 "curve": [{"updates": int, "score": float, ...}], "summary": {...}}:
                                 201 {"id"}; 400 naming the bad field; kept as one JSON file each under
                                 DATA_DIR/results/ (written atomically, the newest RESULTS_KEPT kept)

What "trained" means: the store records no per-turn consumption, only the trainer's
committed cursor (`kv` row `cursor:trainer`, trainer/loop.py): every verdict of the
trainer's judge whose judgement row id is <= the cursor has been consumed. A turn's
`train.state` is `trained` (consumed, and its verdict carries a signal for
`--method`: a non-zero reward for binary, a hint for opd, either for combine; a batch
the trainer dropped as stale reads `trained` too, the store cannot tell: only
`train/stale_dropped` counts those), `skipped` (consumed without a signal),
`waiting` (judged, not consumed yet), `unjudged`, `untrainable` (side, aborted or
still generating), or `buffer` (the trainer reads a rollout buffer, not the store).
`at` is when this process's history sampler first saw the cursor pass the verdict
(within `interval_s`; null when that happened before this process started).

The history is sampled, so a figure that changes faster than `interval_s` (a
trainer stepping several times between two samples) shows its value at the samples.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
import json
import logging
import math
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from clawloop.engines.base import ReportsHealth
from clawloop.gateway.protocol import APIError, parse_json_body
from clawloop.naming import judge_name
from clawloop.records import TURN_MAIN, Judgement, Turn

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent.parent / "dashboard"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
# The page may talk to this server only: no CDN, no inline script, nothing framed.
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                            "img-src 'self' data:; connect-src 'self'; form-action 'none'; "
                                            "frame-ancestors 'none'; base-uri 'none'",
                 "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache", "Referrer-Policy": "no-referrer"}

TRAINER_CURSOR = "trainer"
"""The store cursor the trainer commits (`clawloop.trainer.loop.CURSOR`; not imported: that pulls in torch)."""
SAMPLE_EVERY_S = 2.0
"""How often the history sampler records the stats."""
HISTORY_SAMPLES = 1800
"""Samples kept (an hour at 2 s)."""
HISTORY_KEYS = (
    "engine/policy_version", "gateway/requests", "gateway/inflight", "gateway/queued", "gateway/timeouts",
    "serve/ok_requests", "serve/latency_sum_s", "serve/errors_4xx", "serve/errors_5xx",
    "capture/turns_captured", "capture/open_sessions",
    "judge/judged", "judge/pending", "judge/score_pos", "judge/score_zero", "judge/score_neg",
    "judge/window_reward_mean",
    "train/steps", "train/loss", "train/pg_loss", "train/score_mean", "train/combine_adv_mean",
    "train/zero_adv_frac", "train/grad_norm", "train/pending_samples",
    "train/skipped_no_signal", "train/stale_dropped", "train/publishes", "train/publish_failures",
    "train/last_publish_s", "engine/last_publish_s", "train/kl", "train/entropy", "train/anchor_kl",
)
RESULTS_KEPT = 100
RESULT_MAX_BYTES = 2 * 1024 * 1024
TEXT_LIMIT = 20_000
"""Characters of one prompt / response / next state sent to the page (the store keeps everything)."""


# -- serving figures ---------------------------------------------------------------
def serving_figures(gw: Any) -> dict[str, Any]:
    """Requests by status code and the latency of successful ones, from the gateway's Prometheus metrics."""
    by_code: dict[str, float] = {}
    for metric in gw.metrics.requests.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                by_code[s.labels["code"]] = by_code.get(s.labels["code"], 0.0) + s.value
    buckets: list[tuple[float, float]] = []
    count = total = 0.0
    for metric in gw.metrics.latency.collect():
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                count = s.value
            elif s.name.endswith("_sum"):
                total = s.value
    buckets.sort()

    def quantile(q: float) -> float | None:
        # The upper bound of the bucket the q-th request falls in (what a histogram can tell).
        for le, n in buckets:
            if count and n >= q * count:
                return le if math.isfinite(le) else None
        return None

    def errors(lo: int, hi: int) -> float:
        return sum(v for c, v in by_code.items() if c.isdigit() and lo <= int(c) < hi)

    return {"by_code": by_code, "errors_4xx": errors(400, 500), "errors_5xx": errors(500, 600),
            "ok_requests": count, "latency_sum_s": total,
            "latency": {"count": count, "mean_s": total / count if count else None,
                        "p50_s": quantile(0.5), "p95_s": quantile(0.95)}}


class History:
    """The HISTORY_KEYS stats sampled every `every_s` into a ring buffer, plus the moments the trainer's
    cursor moved (what a turn's `train.at` is read from)."""

    def __init__(self, gw: Any, every_s: float, size: int = HISTORY_SAMPLES):
        self.gw, self.every_s = gw, every_s
        self.t: collections.deque[float] = collections.deque(maxlen=size)
        self.rows: collections.deque[tuple[float | None, ...]] = collections.deque(maxlen=size)
        self.cursor_moves: list[tuple[float, int]] = []
        """(when first seen, cursor), increasing; the first is the cursor when this process started."""

    def sample(self) -> None:
        stats = dict(self.gw.all_stats())
        fig = serving_figures(self.gw)
        for k in ("ok_requests", "latency_sum_s", "errors_4xx", "errors_5xx"):
            stats[f"serve/{k}"] = fig[k]
        now = time.time()
        self.t.append(now)
        self.rows.append(tuple(_num(stats.get(k)) for k in HISTORY_KEYS))
        store = self.gw.store
        if store is not None:
            cursor = store.get_cursor(TRAINER_CURSOR)
            if not self.cursor_moves or cursor > self.cursor_moves[-1][1]:
                self.cursor_moves.append((now, cursor))
                if len(self.cursor_moves) > 10_000:  # thin the middle, keep the start
                    del self.cursor_moves[1:5_001]

    def consumed_at(self, judgement_id: int) -> float | None:
        """When the cursor was first seen at or past `judgement_id` (None: before this process, or not yet)."""
        moves = list(self.cursor_moves)  # read from a worker thread while the sampler appends
        if not moves or judgement_id <= moves[0][1]:
            return None
        i = bisect.bisect_left([c for _, c in moves], judgement_id)
        return moves[i][0] if i < len(moves) else None

    def since(self, t: float) -> dict[str, Any]:
        ts, rows = list(self.t), list(self.rows)
        start = bisect.bisect_right(ts, t)
        ts, rows = ts[start:], rows[start:]
        return {"now": time.time(), "interval_s": self.every_s, "keys": list(HISTORY_KEYS), "t": ts,
                "series": {k: [r[i] for r in rows] for i, k in enumerate(HISTORY_KEYS)}}

    async def run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a failing source must not end the history
                log.exception("dashboard: sampling the stats failed")
            await asyncio.sleep(self.every_s)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


# -- results of `clawloop demo` / `clawloop eval` ---------------------------------
class Results:
    """Posted learning curves, one JSON file each under `folder`, named so that names sort by `created_at`."""

    def __init__(self, folder: Path, keep: int = RESULTS_KEPT):
        self.folder, self.keep = folder, keep
        self.lock = threading.Lock()

    @staticmethod
    def validate(body: dict[str, Any]) -> dict[str, Any]:
        """The result to store; APIError 400 naming the first bad field."""
        def bad(param: str, why: str) -> APIError:
            return APIError(400, f"Invalid '{param}': {why}.", param=param, code="invalid_value")

        kind = body.get("kind")
        if kind not in ("demo", "eval"):
            raise bad("kind", f"expected 'demo' or 'eval', got {kind!r}")
        name = body.get("name")
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise bad("name", "expected a non-empty string of at most 200 characters")
        created = body.get("created_at")
        if _num(created) is None or created <= 0:
            raise bad("created_at", f"expected a unix time in seconds, got {created!r}")
        curve = body.get("curve")
        if not isinstance(curve, list) or len(curve) > 10_000:
            raise bad("curve", "expected a list of at most 10000 points")
        for i, point in enumerate(curve):
            if not isinstance(point, dict):
                raise bad(f"curve[{i}]", "expected an object with 'updates' and 'score'")
            updates = point.get("updates")
            if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0:
                raise bad(f"curve[{i}].updates", f"expected an integer >= 0, got {updates!r}")
            if _num(point.get("score")) is None:
                raise bad(f"curve[{i}].score", f"expected a finite number, got {point.get('score')!r}")
        summary = body.get("summary", {})
        if not isinstance(summary, dict):
            raise bad("summary", "expected an object")
        for param, value in (("curve", curve), ("summary", summary)):
            try:  # Python's json reads NaN and Infinity; no JSON reader in a browser does
                json.dumps(value, allow_nan=False)
            except ValueError:
                raise bad(param, "NaN and Infinity are not JSON numbers") from None
        return {"kind": kind, "name": name.strip(), "created_at": float(created), "curve": curve, "summary": summary}

    def save(self, result: dict[str, Any]) -> str:
        """Write `result` atomically (temp file, fsync, rename); drop the oldest beyond `keep`. Its id."""
        rid = f"{int(result['created_at'] * 1000):015d}-{result['kind']}-{uuid.uuid4().hex[:8]}"
        data = json.dumps({"id": rid, **result}, separators=(",", ":"), allow_nan=False).encode()
        with self.lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{rid}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.folder / f"{rid}.json")
            for old in sorted(self.folder.glob("*.json"))[:-self.keep]:
                old.unlink(missing_ok=True)
        return rid

    def newest(self, limit: int) -> list[dict[str, Any]]:
        if not self.folder.is_dir():
            return []
        out = []
        for path in sorted(self.folder.glob("*.json"), reverse=True)[:limit]:
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError) as e:  # removed meanwhile, or written by hand
                log.warning("dashboard: skipping result %s: %s", path.name, e)
        return out


# -- turns as the page shows them ------------------------------------------------
def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)


def _clip(s: str, flags: list[str], what: str) -> str:
    if len(s) <= TEXT_LIMIT:
        return s
    flags.append(what)
    return s[:TEXT_LIMIT]


def _has_signal(method: str, turn: Turn, j: Judgement, negative_weight: float = 1.0) -> bool:
    """Whether the trainer trains on this verdict: trainer/loop.py's `has_signal` on the turn's sample,
    restated here so that serving never imports the trainer (and torch with it)."""
    if not turn.response_ids:
        return False
    rl = (method in ("binary", "combine") and math.isfinite(j.value) and j.value != 0
          and not (j.value <= -1 and negative_weight == 0))
    opd = method in ("opd", "combine") and any((h or "").strip() for h in [j.hint, *(j.hint_candidates or [])])
    return rl or opd


def turn_view(t: Turn, verdicts: list[tuple[int, Judgement]], *, trainer_judge: str, cursor: int, method: str,
              source: str, history: History, negative_weight: float = 1.0) -> dict[str, Any]:
    clipped: list[str] = []
    users = [m for m in t.messages if m.get("role") == "user"]
    mine = next(((jid, j) for jid, j in verdicts if j.judge == trainer_judge), None)
    if source == "buffer":
        train: dict[str, Any] = {"state": "buffer"}
    elif t.type != TURN_MAIN or not t.trainable:
        train = {"state": "untrainable"}
    elif mine is None:
        train = {"state": "unjudged"}
    elif mine[0] > cursor:
        train = {"state": "waiting", "judgement_id": mine[0]}
    else:
        train = {"state": "trained" if _has_signal(method, t, mine[1], negative_weight) else "skipped", "judgement_id": mine[0],
                 "at": history.consumed_at(mine[0])}
    ns = t.next_state
    versions = [int(v) for v in t.response_versions] if t.response_versions else [t.policy_version]
    return {
        "id": t.id, "index": t.index, "choice_index": t.choice_index, "type": t.type, "created_at": t.created_at,
        "finish_reason": t.finish_reason, "policy_version": t.policy_version,
        "versions": [min(versions), max(versions)], "tenant": t.tenant,
        "prompt": _clip(_text(users[-1].get("content")) if users else "", clipped, "prompt"),
        "last_role": t.messages[-1].get("role") if t.messages else None, "messages": len(t.messages),
        "response": _clip(t.response_text, clipped, "response"), "tool_calls": t.tool_calls,
        "next_state": None if ns is None else {"role": ns.get("role"),
                                               "content": _clip(_text(ns.get("content")), clipped, "next_state")},
        "next_state_at": t.next_state_at, "final": t.final, "trainable": t.trainable,
        "prompt_tokens": len(t.prompt_ids), "response_tokens": len(t.response_ids), "truncated": clipped,
        "judgements": [{"id": jid, "judge": j.judge, "score": j.score, "reward": j.reward, "votes": j.votes,
                        "hint": j.hint, "hints": j.hint_candidates, "malformed": j.malformed,
                        "latency_s": j.latency_s, "created_at": j.created_at} for jid, j in verdicts],
        "train": train,
    }


# -- the routes -------------------------------------------------------------------
def _int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise APIError(400, f"Invalid '{name}': expected an integer, got {raw!r}.", param=name,
                       code="invalid_value") from None
    if not lo <= v <= hi:
        raise APIError(400, f"Invalid '{name}': expected {lo}..{hi}, got {v}.", param=name, code="invalid_value")
    return v


def _float(request: Request, name: str, default: float) -> float:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise APIError(400, f"Invalid '{name}': expected a number, got {raw!r}.", param=name, code="invalid_value")
    return v


def _public_url(url: str) -> str:
    """`url` without its user:password, if it has them."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def _api(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """The route's APIErrors answered here: the app-wide handler would count them as /v1 requests on
    /metrics, and a page left open without a key must not read as failing clients."""
    @functools.wraps(fn)
    async def route(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return await fn(request, *args, **kwargs)
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)
    return route


def mount_dashboard(app: FastAPI, gw: Any) -> Callable[[], Awaitable[None]]:
    """Add the page and /api routes to `app`; returns the history sampler for the app's background tasks."""
    cfg, store, engine = gw.cfg, gw.store, gw.engine
    history = History(gw, SAMPLE_EVERY_S)
    results = Results(Path(cfg.data_dir) / "results")
    trainer_judge = judge_name(cfg)
    # Only files shipped in the folder, looked up by name: no path from a request ever reaches the disk.
    files = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in _TYPES}

    def static(name: str) -> Response:
        path = files.get(name)
        if path is None:
            return JSONResponse(APIError(404, f"No dashboard file {name!r}.", code="not_found").body(),
                                status_code=404)
        return Response(path.read_bytes(), media_type=_TYPES[path.suffix], headers=_PAGE_HEADERS)

    def tenant_of(request: Request) -> str | None:
        """The tenant whose sessions this request may read; None: all (a server without keys)."""
        return gw.check_auth(request) or None

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return static("index.html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    async def dashboard_file(name: str) -> Response:
        return static(name)

    @app.get("/api/status")
    @_api
    async def status(request: Request) -> Response:
        tenant = gw.check_auth(request)
        stats = gw.all_stats()
        fig = serving_figures(gw)
        health: dict[str, Any] = {"status": "ok"}
        if isinstance(engine, ReportsHealth):
            health.update(engine.health())
        return JSONResponse({
            "now": time.time(), "started_at": gw.started_at, "model": cfg.serve.served_model_name,
            "policy_version": engine.policy_version, "auth": bool(cfg.serve.api_keys), "tenant": tenant or None,
            "health": health,
            "serving": {"requests": gw.requests, "inflight": gw.inflight, "queued": len(gw.slots.waiters),
                        "slots_used": gw.slots.used, "capacity": gw.slots.capacity,
                        "max_queued": gw.slots.max_queued, "timeouts": gw.timeouts,
                        "queue_full_refusals": gw.slots.rejected, "store_overload_refusals": gw.store_refusals,
                        "by_code": fig["by_code"], "errors_4xx": fig["errors_4xx"], "errors_5xx": fig["errors_5xx"],
                        "latency": fig["latency"]},
            "capture": gw.capture is not None, "judge": trainer_judge,
            "train": {"method": cfg.train.method, "source": cfg.train.source,
                      "cursor": history.cursor_moves[-1][1] if history.cursor_moves else None,
                      "buffer_url": _public_url(cfg.train.buffer_url) or None},
            "history_interval_s": history.every_s,
            "stats": {k: v for k, v in stats.items() if _num(v) is not None},
        })

    @app.get("/api/sessions")
    @_api
    async def sessions(request: Request) -> Response:
        tenant = tenant_of(request)
        limit = _int(request, "limit", 20, 1, 500)
        offset = _int(request, "offset", 0, 0, 10**9)
        judge = request.query_params.get("judge") or trainer_judge
        if store is None:
            return JSONResponse({"total": 0, "limit": limit, "offset": offset, "judge": judge, "data": []})
        total, rows = await run_in_threadpool(store.list_sessions, limit, offset, tenant=tenant, judge=judge)
        for r in rows:
            r["closed"] = r["closed_at"] is not None
        return JSONResponse({"total": total, "limit": limit, "offset": offset, "judge": judge, "data": rows})

    @app.get("/api/sessions/{session_id:path}")
    @_api
    async def session(request: Request, session_id: str) -> Response:
        tenant = tenant_of(request)
        limit = _int(request, "limit", 200, 1, 1000)
        offset = _int(request, "offset", 0, 0, 10**9)

        def read() -> dict[str, Any] | None:
            summary = store.session_summary(session_id, tenant=tenant, judge=trainer_judge)
            if summary is None:
                return None
            summary["closed"] = summary["closed_at"] is not None
            turns = store.session_turns_page(session_id, limit, offset, tenant=tenant)
            verdicts = store.judgements_of([t.id for t in turns])
            cursor = store.get_cursor(TRAINER_CURSOR)
            return {"session": summary,
                    "trainer": {"judge": trainer_judge, "method": cfg.train.method, "source": cfg.train.source,
                                "cursor": cursor},
                    "total": summary["rows"], "limit": limit, "offset": offset,
                    "data": [turn_view(t, verdicts.get(t.id, []), trainer_judge=trainer_judge, cursor=cursor,
                                       method=cfg.train.method, source=cfg.train.source, history=history,
                                       negative_weight=cfg.train.negative_weight)
                             for t in turns]}

        body = await run_in_threadpool(read) if store is not None else None
        if body is None:
            raise APIError(404, f"No session {session_id!r}.", param="session_id", code="not_found")
        return JSONResponse(body)

    @app.get("/api/history")
    @_api
    async def get_history(request: Request) -> Response:
        gw.check_auth(request)
        return JSONResponse(history.since(_float(request, "since", 0.0)))

    @app.get("/api/judgements")
    @_api
    async def judgements(request: Request) -> Response:
        gw.check_auth(request)
        since = _float(request, "since", time.time() - 3600)
        bucket_s = _float(request, "bucket_s", 60.0)
        if bucket_s < 1:
            raise APIError(400, "Invalid 'bucket_s': expected at least 1 (seconds).", param="bucket_s",
                           code="invalid_value")
        judge = request.query_params.get("judge") or trainer_judge
        data = [] if store is None else await run_in_threadpool(store.judgement_counts, since, bucket_s, judge=judge)
        return JSONResponse({"now": time.time(), "judge": judge, "bucket_s": bucket_s, "data": data})

    @app.get("/api/buffer")
    @_api
    async def buffer(request: Request) -> Response:
        gw.check_auth(request)
        url = cfg.train.buffer_url
        if not url or cfg.train.source != "buffer":
            return JSONResponse({"attached": False})
        import httpx

        body: dict[str, Any] = {"attached": True, "url": _public_url(url), "ok": False, "error": None, "stats": None,
                                "source": {k: v for k, v in gw.all_stats().items() if k.startswith("buffer/")}}
        try:
            async with httpx.AsyncClient(timeout=3.0) as client:
                r = await client.get(url.rstrip("/") + "/buffer/stats")
            r.raise_for_status()
            body["stats"], body["ok"] = r.json()["data"]["data"][0], True
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
            # The buffer's own answer stays out: it could carry anything. Its kind and status do not.
            body["error"] = (f"the buffer answered {e.response.status_code}" if isinstance(e, httpx.HTTPStatusError)
                             else f"{type(e).__name__} reaching the buffer")
        return JSONResponse(body)

    @app.get("/api/results")
    @_api
    async def results_list(request: Request) -> Response:
        gw.check_auth(request)
        limit = _int(request, "limit", 20, 1, RESULTS_KEPT)
        return JSONResponse({"data": await run_in_threadpool(results.newest, limit)})

    @app.post("/api/results")
    @_api
    async def results_post(request: Request) -> Response:
        tenant = gw.check_auth(request)
        raw = await gw.read_body(request)
        if len(raw) > RESULT_MAX_BYTES:
            raise APIError(413, f"Result too large: {len(raw)} bytes (limit {RESULT_MAX_BYTES}).",
                           code="request_too_large")
        result = Results.validate(parse_json_body(raw))
        result.update(tenant=tenant or None, received_at=time.time())
        rid = await run_in_threadpool(results.save, result)
        return JSONResponse({"id": rid}, status_code=201)

    return history.run
