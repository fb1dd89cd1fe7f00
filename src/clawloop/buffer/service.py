"""The rollout buffer service: slime's wire API over a durable SQLite store.

    clawloop buffer --generator-dir DIR --data-dir D       # clawloop.apps.buffer.run_buffer, port 8889
    app = create_buffer_app(cfg)                           # for tests and embedding

Routes (slime's names and shapes; every JSON answer is {"success", "message", "data"}
unless noted):
  POST /start_rollout     {task_type, remote_engine_url, remote_buffer_url, input_file,
                           num_repeat_per_sample, max_tokens, sampling_params, num_process,
                           num_epoch, skip_instance_ids, ...}: rediscover generators, start
                           that task's run_rollout(data) in a child process, return at once.
                           Also honoured: group_timeout_seconds, min_timeout_group_size_ratio.
  POST /buffer/write      one item with instance_id and reward; answered after it is committed.
  POST /buffer/write_batch  extension: a JSON list of items (or {"items": [...]}), all or none.
  POST /get_rollout_data  {batch_size?, task_type?}: every finished, valid group (or whole groups
                           until batch_size items), flattened, with meta_info; they are removed.
                           success=false with data {"data": [], "meta_info"} when nothing is ready.
  GET  /buffer/stats      written, read, pending groups, drops, per task; data={"data": [stats]}.
  GET  /health            {"status": "ok", ...}
  POST /stop_rollout      {task_type?}: stop that task's generator (all when omitted).

Where this departs from slime's buffer.py:
- Items live in SQLite, not in a dict: a restart loses nothing acknowledged, and a
  group is handed out once even with several readers.
- Groups are keyed by (task_type, instance_id); an item's task is its `task_type`
  field, else the task of the latest /start_rollout.
- /buffer/write does not echo the item back (data holds the group's progress), and bad
  input is a 4xx with the reason instead of a 500.
- meta_info describes the groups handed out in this response (raw rewards), plus
  `finished_groups`: the instance_ids finished since the last read (handed out, or
  dropped as invalid or stale), which slime's trainer feeds back as skip_instance_ids.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import deque
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from clawloop.buffer.discovery import Generator, GeneratorError, discover_generators
from clawloop.buffer.hooks import DEFAULT_HOOKS, is_number, validity
from clawloop.buffer.runner import RolloutProcess
from clawloop.buffer.store import BufferStore, GroupOutcome, ReadyGroup, TaskSpec, instance_key
from clawloop.config import Config

log = logging.getLogger("clawloop.buffer")

DEFAULT_TASK = "default"


class BadInput(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _answer(success: bool, message: str, data: Any = None, status: int = 200) -> JSONResponse:
    return JSONResponse({"success": success, "message": message, "data": data}, status_code=status)


def validate_item(item: Any) -> str | None:
    """Why an item cannot be stored, or None."""
    if not isinstance(item, dict):
        return f"an item must be a JSON object, got {type(item).__name__}"
    if "instance_id" not in item:
        return "missing instance_id (the group key every item of one prompt shares)"
    iid = item["instance_id"]
    if isinstance(iid, bool) or not (isinstance(iid, int) or (isinstance(iid, str) and iid)):
        return f"instance_id must be a non-empty string or an integer, got {iid!r}"
    if "reward" not in item:
        return "missing reward"
    if not is_number(item["reward"]):
        return f"reward must be a finite number, got {item['reward']!r}"
    tt = item.get("task_type")
    if tt is not None and not (isinstance(tt, str) and tt):
        return f"task_type must be a non-empty string, got {tt!r}"
    return None


def _int(payload: dict[str, Any], key: str, default: int, lo: int = 1) -> int:
    v = payload.get(key, default)
    try:
        if isinstance(v, bool):
            raise ValueError
        n = int(v)  # slime's trainer sends numbers as strings
        if n != float(v) or n < lo:
            raise ValueError
    except (TypeError, ValueError):
        raise BadInput(422, f"{key} must be an integer >= {lo}, got {v!r}") from None
    return n


def _float(payload: dict[str, Any], key: str, default: float, lo: float, hi: float | None = None) -> float:
    v = payload.get(key, default)
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
        if not (x >= lo and (hi is None or x <= hi)):
            raise ValueError
    except (TypeError, ValueError):
        rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise BadInput(422, f"{key} must be a number {rng}, got {v!r}") from None
    return x


class _Notifier:
    """Resolve asyncio futures from the writer thread with one loop wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.pending: deque[tuple[asyncio.Future, Any, BaseException | None]] = deque()
        self.scheduled = False
        self.lock = threading.Lock()

    def __call__(self, fut: asyncio.Future, res: Any, err: BaseException | None) -> None:
        with self.lock:
            self.pending.append((fut, res, err))
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self.lock:
            items, self.pending = self.pending, deque()
            self.scheduled = False
        for fut, res, err in items:
            if fut.done():
                continue
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(res)


class RolloutBuffer:
    """The buffer without HTTP: store, generators, running rollouts."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        b = cfg.buffer
        self.data_dir = Path(cfg.data_dir)
        self.generator_dir = b.generator_dir or None
        self.generators: dict[str, Generator] = self.discover()
        if b.custom_generate_function_path:  # a broken spec fails the start, not the first rollout
            from clawloop.buffer.custom import check_generate_function

            check_generate_function(b.custom_generate_function_path)
        self.default_spec = TaskSpec(max(1, cfg.train.n_samples_per_prompt), b.group_timeout_s, b.min_group_ratio)
        self.store = BufferStore(self.data_dir / "buffer.db", self.default_spec)
        self.rollouts: dict[str, RolloutProcess] = {}
        self._lock = threading.Lock()
        self._notifiers: dict[int, _Notifier] = {}
        self._warned: set[str] = set()
        log.info("rollout buffer: %s; generators: %s", self.store.path,
                 ", ".join(f"{t} ({g.path})" for t, g in sorted(self.generators.items())))

    # -- writes -------------------------------------------------------------------
    def task_of(self, item: dict[str, Any]) -> str:
        task = item.get("task_type") or self.store.current_task or DEFAULT_TASK
        if task not in self.store.tasks and task not in self._warned:
            self._warned.add(task)
            log.warning("buffer: items for task %r, but no /start_rollout gave its group size; using "
                        "train.n_samples_per_prompt = %d (--num-rollouts-per-prompt)", task,
                        self.default_spec.group_size)
        return task

    async def write(self, entries: list[tuple[str, str, bytes]]) -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        notifier = self._notifiers.get(id(loop))
        if notifier is None or notifier.loop is not loop:
            notifier = self._notifiers[id(loop)] = _Notifier(loop)
        fut = loop.create_future()
        self.store.write_async(entries, lambda res, err: notifier(fut, res, err))
        return await fut

    # -- rollouts -----------------------------------------------------------------
    def discover(self) -> dict[str, Generator]:
        return discover_generators(self.generator_dir, rollout_function_path=self.cfg.buffer.rollout_function_path)

    def start_rollout(self, payload: dict[str, Any], self_url: str) -> dict[str, Any]:
        task_type = payload.get("task_type")
        if not isinstance(task_type, str) or not task_type:
            raise BadInput(422, "task_type is required (the TASK_TYPE of a generator)")
        self.generators = self.discover()  # GeneratorError -> 500 by the caller
        gen = self.generators.get(task_type)
        if gen is None:
            raise BadInput(404, f"no generator for task_type {task_type!r}; available: "
                                f"{', '.join(sorted(self.generators)) or 'none'} (generator dir: "
                                f"{self.generator_dir or 'built-ins only'})")
        b = self.cfg.buffer
        from clawloop.envs.base import TRACKS

        if task_type in TRACKS and gen.builtin:  # agent tracks: the env section (ENV_TYPE, MAX_STEPS, ...) fills in
            env = self.cfg.env.payload()
            if self.cfg.ray.env_workers and self.cfg.env.track and task_type != self.cfg.env.track:
                env["env_pool_url"] = ""  # the env-pool actors serve --env-type's track only: others run locally
            payload = {**env, "num_repeat_per_sample": self.cfg.env.num_repeat_per_sample, **payload}
        spec = TaskSpec(
            _int(payload, "num_repeat_per_sample", self.default_spec.group_size),
            _float(payload, "group_timeout_seconds", b.group_timeout_s, 0.0),
            _float(payload, "min_timeout_group_size_ratio", b.min_group_ratio, 0.0, 1.0),
        )
        data = dict(payload)
        data.setdefault("remote_buffer_url", self_url)
        data.setdefault("remote_engine_url", f"http://{self.cfg.serve.host}:{self.cfg.serve.port}/v1")
        if task_type in TRACKS:  # what an episode leaves beside its item (the GUI track's screenshots)
            data.setdefault("artifact_dir", str(self.data_dir / "artifacts" / task_type))
            data.setdefault("images_dir", str(self.data_dir / "images"))  # the images items name, by sha256
        if b.custom_generate_function_path:
            data.setdefault("custom_generate_function_path", b.custom_generate_function_path)
        with self._lock:
            running = self.rollouts.get(task_type)
            if running is not None and running.running():
                raise BadInput(409, f"a {task_type!r} rollout is already running (pid {running.pid}); "
                                    "POST /stop_rollout first")
            masked = {k: ("***" if "key" in k.lower() else v) for k, v in data.items()}
            self.store.register_task(task_type, spec, masked)
            proc = RolloutProcess.start(task_type, gen.path, data, self.data_dir / "rollouts", entry=gen.entry)
            self.rollouts[task_type] = proc
        log.info("rollout %s started: %s pid %d group size %d, log %s", task_type, gen.path, proc.pid,
                 spec.group_size, proc.log_path)
        return proc.status() | {"group_size": spec.group_size}

    def stop_rollout(self, task_type: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            procs = [p for t, p in self.rollouts.items() if task_type is None or t == task_type]
        stopped = []
        for p in procs:
            was_running = p.running()
            p.stop()
            if was_running:
                stopped.append(p.status())
        return stopped

    # -- reads --------------------------------------------------------------------
    def hooks_for(self, task_type: str) -> dict[str, Any]:
        gen = self.generators.get(task_type)
        return gen.hooks if gen is not None else DEFAULT_HOOKS

    def decide(self, group: ReadyGroup) -> GroupOutcome:
        """Run the task's hooks on one finished group (slime's order: validity on the
        raw group, filter items, normalize, pad)."""
        hooks = self.hooks_for(group.task_type)
        spec = self.store.spec(group.task_type)
        need = spec.min_stale_size(group.group_size)
        iid = group.items[0]["instance_id"] if group.items else json.loads(group.instance_key)
        work = [dict(it) for it in group.items]  # hooks edit copies; the raw items feed meta_info
        name = "is_valid_group"
        try:
            min_size = need if group.stale else group.group_size
            if not validity(hooks[name]((iid, work), min_size, group.task_type)):
                return GroupOutcome(False, [], "is_valid_group said invalid")
            name = "filter_item"
            kept = [it for it in work if hooks[name](it, group.task_type)]
            counts = {"filtered_items": len(work) - len(kept)}
            if len(kept) < need:
                return GroupOutcome(False, [], f"{len(kept)} items passed filter_item, {need} needed", counts)
            name = "normalize_group_data"
            _, normed = hooks[name]((iid, kept))
            name = "pad_group_data"
            _, padded = hooks[name]((iid, list(normed)), group.group_size)
            counts["padded_items"] = len(padded) - len(normed)
            return GroupOutcome(True, list(padded), "", counts)
        except Exception as e:  # noqa: BLE001 - a broken hook drops the group, loudly, with a counter
            gen = self.generators.get(group.task_type)
            where = gen.path if gen else "defaults"
            log.error("buffer: %s (%s) failed on group %s/%s: %s: %s; group dropped", name, where,
                      group.task_type, iid, type(e).__name__, e)
            return GroupOutcome(False, [], f"{name} raised {type(e).__name__}: {e}", {"hook_errors": 1})

    def read(self, batch_size: int | None, task_type: str | None = None) -> dict[str, Any]:
        res = self.store.read(batch_size, self.decide, task_type)
        handed = [(g, o) for g, o in res["groups"] if o.handed]
        data = [it for _, o in handed for it in o.items]
        tasks = sorted({g.task_type for g, _ in handed})
        raw = {g.items[0]["instance_id"] if g.items else g.instance_key: g.items for g, _ in handed}
        meta_hook = self.hooks_for(tasks[0])["get_group_data_meta_info"] if len(tasks) == 1 else \
            DEFAULT_HOOKS["get_group_data_meta_info"]
        try:
            meta = dict(meta_hook(raw)) if handed else {}
        except Exception as e:  # noqa: BLE001
            log.error("buffer: get_group_data_meta_info failed: %s: %s", type(e).__name__, e)
            meta = {"meta_info_error": f"{type(e).__name__}: {e}"}
        dropped = [(g, o) for g, o in res["groups"] if not o.handed]
        meta["finished_groups"] = [json.loads(k) for _, k in res["finished"]]
        meta["task_types"] = tasks
        meta["dropped_invalid_groups"] = len(dropped)
        if dropped:
            meta["dropped_reasons"] = sorted({o.reason for _, o in dropped})
        if not data:
            msg = "No data available to read"
            if batch_size and not res["enough"]:
                msg = f"Not enough data. Requested {batch_size} items but only {res['available']} available."
            return {"success": False, "message": msg, "data": {"data": [], "meta_info": meta}}
        return {"success": True, "message": f"Successfully read {len(data)} items",
                "data": {"data": data, "meta_info": meta}}

    # -- stats --------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        s = self.store.stats()
        t = s["totals"]
        with self._lock:
            rollouts = [p.status() for p in self.rollouts.values()]
        return {
            "total_written": t.get("written", 0),
            "total_read": t.get("read", 0),
            "current_size": t.get("ready_items", 0),
            "pending_groups": t.get("open_groups", 0) + t.get("ready_groups", 0),
            "ready_groups": t.get("ready_groups", 0),
            "open_groups": t.get("open_groups", 0),
            "dropped_stale_groups": t.get("dropped_stale_groups", 0),
            "dropped_invalid_groups": t.get("dropped_invalid_groups", 0),
            "filtered_items": t.get("filtered_items", 0),
            "hook_errors": t.get("hook_errors", 0),
            "per_task": s["per_task"],
            "rollouts": rollouts,
            "generators": {k: {"path": str(g.path), "custom_hooks": list(g.custom_hooks), "builtin": g.builtin}
                           for k, g in sorted(self.generators.items())},
            "current_task": self.store.current_task,
        }

    def close(self) -> None:
        self.stop_rollout()
        self.store.close()


async def write_one(buf: RolloutBuffer, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST /buffer/write: (status, answer) for one raw body; stored once committed."""
    try:
        item = _parse(body)
    except BadInput as e:
        return e.status, {"success": False, "message": e.message, "data": None}
    why = validate_item(item)
    if why is not None:
        return 422, {"success": False, "message": why, "data": None}
    task = buf.task_of(item)
    (n, size), = await buf.write([(task, instance_key(item["instance_id"]), body)])
    return 200, {"success": True, "message": "Data has been successfully written to buffer",
                 "data": {"instance_id": item["instance_id"], "task_type": task, "group_items": n,
                          "group_size": size, "group_complete": n >= size}}


def serving_app(app: FastAPI) -> Any:
    """The ASGI app to serve: `app`, with POST /buffer/write answered before any
    framework layer (no Starlette request/response objects, routing or FastAPI
    middleware): on a small machine that per-request overhead, not SQLite, bounds
    ingest. Everything else, lifespan included, goes to `app`."""
    return _FastWrite(app, app.state.buffer, app.state.buffer.cfg.buffer.max_body_bytes)


class _FastWrite:
    def __init__(self, app: Any, buffer: RolloutBuffer, limit: int):
        self.app = app
        self.buf = buffer
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/buffer/write" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        status, answer = 413, None
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            msg = f"request body too large: {int(declared)} bytes (limit {self.limit}, buffer.max_body_bytes)"
            answer = {"success": False, "message": msg, "data": None}
        else:
            chunks, size, more = [], 0, True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.limit:
                    answer = {"success": False, "data": None,
                              "message": f"request body too large: over {self.limit} bytes (buffer.max_body_bytes)"}
                    break
                chunks.append(chunk)
                more = message.get("more_body", False)
            if answer is None:
                status, answer = await write_one(self.buf, b"".join(chunks))
        data = json.dumps(answer, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadInput(413, f"request body too large: {declared} bytes (limit {limit}, buffer.max_body_bytes)")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadInput(413, f"request body too large: over {limit} bytes (buffer.max_body_bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(body: bytes, *, empty_ok: bool = False) -> Any:
    if empty_ok and not body.strip():
        return {}
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(400, f"body is not valid JSON: {e}") from None


def create_buffer_app(cfg: Config) -> FastAPI:
    """The buffer as a FastAPI app (state.buffer is the RolloutBuffer). Raises
    GeneratorError when the generator folder holds a broken file."""
    buf = RolloutBuffer(cfg)
    limit = cfg.buffer.max_body_bytes

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await run_in_threadpool(buf.close)

    app = FastAPI(title="clawloop rollout buffer", lifespan=lifespan)
    app.state.buffer = buf

    @app.exception_handler(BadInput)
    async def bad_input(request: Request, exc: BadInput) -> JSONResponse:
        return _answer(False, exc.message, None, exc.status)

    @app.exception_handler(GeneratorError)
    async def generator_error(request: Request, exc: GeneratorError) -> JSONResponse:
        return _answer(False, str(exc), None, 500)

    async def buffer_write(request: Request) -> JSONResponse:
        # apps.buffer.run_buffer and BufferThread serve this path from serving_app()'s fast path; this
        # route answers the same when the app is mounted some other way.
        status, answer = await write_one(buf, await _read_body(request, limit))
        return JSONResponse(answer, status_code=status)

    async def buffer_write_batch(request: Request) -> JSONResponse:
        body = await _read_body(request, limit)
        items = _parse(body)
        if isinstance(items, dict) and isinstance(items.get("items"), list):
            items = items["items"]
        if not isinstance(items, list):
            raise BadInput(422, "write_batch expects a JSON list of items (or {\"items\": [...]})")
        entries = []
        for i, item in enumerate(items):
            why = validate_item(item)
            if why is not None:
                raise BadInput(422, f"item {i}: {why}; nothing was written")
            entries.append((buf.task_of(item), instance_key(item["instance_id"]),
                            json.dumps(item, separators=(",", ":")).encode()))
        if entries:
            await buf.write(entries)
        return _answer(True, f"wrote {len(entries)} items", {"written": len(entries)})

    app.router.add_route("/buffer/write", buffer_write, methods=["POST"])
    app.router.add_route("/buffer/write_batch", buffer_write_batch, methods=["POST"])

    @app.post("/get_rollout_data")
    async def get_rollout_data(request: Request) -> JSONResponse:
        payload = _parse(await _read_body(request, limit), empty_ok=True)
        if not isinstance(payload, dict):
            raise BadInput(422, "get_rollout_data expects a JSON object like {\"batch_size\": 64}")
        bs = payload.get("batch_size")
        batch_size = None if bs in (None, -1, "-1", 0, "0") else _int(payload, "batch_size", 0)
        task_type = payload.get("task_type")
        res = await run_in_threadpool(buf.read, batch_size, task_type)
        return JSONResponse(res)

    @app.post("/start_rollout")
    async def start_rollout(request: Request) -> JSONResponse:
        payload = _parse(await _read_body(request, limit))
        if not isinstance(payload, dict):
            raise BadInput(422, "start_rollout expects a JSON object")
        self_url = str(request.base_url).rstrip("/")
        status = await run_in_threadpool(buf.start_rollout, payload, self_url)
        return _answer(True, "Rollout started", status)

    @app.post("/stop_rollout")
    async def stop_rollout(request: Request) -> JSONResponse:
        payload = _parse(await _read_body(request, limit), empty_ok=True)
        task_type = payload.get("task_type") if isinstance(payload, dict) else None
        stopped = await run_in_threadpool(buf.stop_rollout, task_type)
        return _answer(True, f"stopped {len(stopped)} rollout(s)", {"stopped": stopped})

    @app.get("/buffer/stats")
    async def buffer_stats() -> JSONResponse:
        stats = await run_in_threadpool(buf.stats)
        return _answer(True, "Buffer stats retrieved successfully", {"data": [stats], "meta_info": {}})

    @app.get("/health")
    async def health() -> JSONResponse:
        running = sum(1 for p in list(buf.rollouts.values()) if p.running())
        body = {"status": "ok", "db": str(buf.store.path), "generators": sorted(buf.generators),
                "rollouts_running": running, "current_task": buf.store.current_task}
        pools = getattr(app.state, "env_pools", None)
        if pools is not None:  # `--ray --env-workers N`: the env-pool actors, their nodes and leases
            body["actors"] = await run_in_threadpool(pools.health)
        return JSONResponse(body)

    @app.get("/")
    async def root() -> JSONResponse:
        return JSONResponse({"message": "Rollout Buffer Server is running"})

    return app


class BufferThread:
    """The buffer served by a real uvicorn server on a thread of this process (tests,
    benchmarks, embedding). Port 0 in the config picks a free port.

        srv = BufferThread(cfg).start(); srv.url; srv.buffer; srv.stop()
    """

    def __init__(self, cfg: Config):
        import socket

        import uvicorn

        self.app = create_buffer_app(cfg)
        self.buffer: RolloutBuffer = self.app.state.buffer
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((cfg.buffer.host, cfg.buffer.port))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(serving_app(self.app), log_level="warning", access_log=False,
                                                    proxy_headers=False, timeout_graceful_shutdown=10))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="clawloop-buffer-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "BufferThread":
        import time

        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("rollout buffer server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving; the lifespan shutdown stops rollouts and closes the store."""
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()
