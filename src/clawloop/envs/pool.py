"""Environment pool: leases on a bounded set of live environments, in-process or over HTTP.

    clawloop envpool --track terminal --port 8890 [--parallel-envs 8]   # serve one track's pool
    pool = EnvPool("terminal", EnvOptions(), capacity=8)                # the same, in-process
    pool = connect_pool(url or None, track, opts, capacity)             # what generators call
    pool = connect_pool("http://a:8890,http://b:8890", ...)             # SpreadPool over several servers

The reference's lease API, JSON in and out:
  POST /allocate   {"task_id"?}            -> {"lease_id", "task_id", "track", "expires_at"}; 429 at capacity
  POST /reset      {"lease_id"}            -> {"messages", "tools", "describe"}
  POST /step       {"lease_id", "message"} -> {"messages", "done", "info"}     (alias: /exec_tool)
  POST /evaluate   {"lease_id"}            -> {"reward", "success", "details"}
  POST /oracle     {"lease_id"}            -> {"messages"}: the task's reference solution (env check, scripted agent)
  POST /close      {"lease_id"}            -> {"closed": true}
  POST /heartbeat  {"lease_id"}            -> {"expires_at"}
  GET  /status                             -> capacity, active leases, counters, sandbox level
  GET  /tasks                              -> {"track", "task_ids"}
  GET  /health                             -> {"status": "ok"}

A lease lives `lease_ttl_s` after its last call or heartbeat; a reaper thread
closes expired ones (`reaped`). An environment whose call raises is closed at
once and its lease answers 410 with the reason afterwards (`crashed`): a
broken environment never takes the pool down with it. At capacity `/allocate`
answers 429 with `Retry-After` rather than waiting. Calls on one lease are
serialised; different leases run in parallel (each env call is blocking
subprocess work, so they run on threads).

Several pool servers (one per env node, e.g. the Ray env-pool actors of `clawloop buffer --ray`)
are used through `SpreadPool`: each allocation goes to the server holding the fewest of this
client's leases, lease ids carry the server's index (`"1:9f3c..."`) so every later call goes back
to it, and a full (429) or unreachable (503) server is passed over for the next.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from clawloop.envs.base import Env, EnvOptions, Task, get_track

log = logging.getLogger(__name__)


class PoolError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class _Lease:
    def __init__(self, lease_id: str, env: Env, slot: int, ttl: float):
        self.id = lease_id
        self.env = env
        self.slot = slot
        self.ttl = ttl
        self.expires_at = time.time() + ttl
        self.lock = threading.Lock()

    def touch(self) -> None:
        self.expires_at = time.time() + self.ttl


class EnvPool:
    """A bounded set of environments of one track, handed out by lease."""

    def __init__(self, track: str, opts: EnvOptions | None = None, *, capacity: int = 8, lease_ttl_s: float = 600.0,
                 reap_interval_s: float = 5.0, tasks: list[Task] | None = None):
        self.track_name = track
        self.track = get_track(track)
        self.opts = opts or EnvOptions()
        self.capacity = max(1, int(capacity))
        self.lease_ttl_s = lease_ttl_s
        self._tasks: dict[str, Task] | None = {t.task_id: t for t in tasks} if tasks is not None else None
        self._leases: dict[str, _Lease] = {}
        self._building: set[int] = set()
        self._dead: dict[str, str] = {}  # lease id -> why it ended (crashed / reaped / closed)
        self._lock = threading.Lock()
        self.counts = {"allocated": 0, "closed": 0, "reaped": 0, "crashed": 0, "refused_full": 0}
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,), daemon=True,
                                        name=f"envpool-reaper-{track}")
        self._reaper.start()

    # -- tasks ------------------------------------------------------------------------
    @property
    def tasks(self) -> dict[str, Task]:
        if self._tasks is None:
            self._tasks = {t.task_id: t for t in self.track.load_tasks(self.opts)}
        return self._tasks

    def task_ids(self) -> list[str]:
        return list(self.tasks)

    # -- leases -----------------------------------------------------------------------
    def allocate(self, task_id: str | None = None) -> dict[str, Any]:
        if task_id is None:
            task_id = next(iter(self.tasks), None)
            if task_id is None:
                raise PoolError(404, f"track {self.track_name!r} has no tasks")
        task = self.tasks.get(str(task_id))
        if task is None and hasattr(self.track, "get_task"):  # listed or not (gui: a page without a solver)
            try:
                task = self.track.get_task(str(task_id))
            except ValueError:
                task = None
        if task is None:
            raise PoolError(404, f"no task {task_id!r} in track {self.track_name!r}")
        with self._lock:
            used = {le.slot for le in self._leases.values()} | self._building
            if len(used) >= self.capacity:
                self.counts["refused_full"] += 1
                raise PoolError(429, f"pool at capacity ({self.capacity} environments leased); retry later")
            slot = next(i for i in range(self.capacity) if i not in used)
            self._building.add(slot)  # reserved while the environment is built
        lease_id = uuid.uuid4().hex
        try:
            env = self.track.make_env(task, self.opts, slot=slot)
        except Exception as e:
            with self._lock:
                self._building.discard(slot)
            raise PoolError(500, f"could not build an environment for {task_id!r}: {type(e).__name__}: {e}") from e
        lease = _Lease(lease_id, env, slot, self.lease_ttl_s)
        with self._lock:
            self._building.discard(slot)
            stopped = self._stop.is_set()
            if not stopped:
                self._leases[lease_id] = lease
                self.counts["allocated"] += 1
        if stopped:  # shut down while this one was built: nobody would close it (its workspace would stay)
            env.close()
            raise PoolError(503, f"the {self.track_name!r} pool is shutting down")
        return {"lease_id": lease_id, "task_id": task.task_id, "track": self.track_name,
                "expires_at": lease.expires_at}

    def _get(self, lease_id: str) -> _Lease:
        with self._lock:
            lease = self._leases.get(lease_id)
            why = self._dead.get(lease_id)
        if lease is None:
            if why:
                raise PoolError(410, f"lease {lease_id} is gone: {why}")
            raise PoolError(404, f"no lease {lease_id!r}")
        return lease

    def _call(self, lease_id: str, what: str, fn) -> Any:
        lease = self._get(lease_id)
        with lease.lock:
            if lease_id not in self._leases:  # closed or reaped while we waited
                return self._get(lease_id)
            lease.touch()
            try:
                out = fn(lease.env)
            except PoolError:
                raise
            except Exception as e:  # noqa: BLE001 - one env's failure must not take the pool down
                why = f"{what} crashed: {type(e).__name__}: {e}"
                log.warning("env pool: lease %s (%s) %s", lease_id, lease.env.task.task_id, why)
                self._end(lease_id, why, "crashed")
                raise PoolError(500, why) from e
            lease.touch()
            return out

    def reset(self, lease_id: str) -> dict[str, Any]:
        def go(env: Env) -> dict[str, Any]:
            obs = env.reset()
            return {"messages": obs.messages, "tools": obs.tools, "describe": env.describe(),
                    "info": dict(getattr(obs, "info", None) or {})}
        return self._call(lease_id, "reset", go)

    def step(self, lease_id: str, message: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            raise PoolError(422, "message must be an assistant message object")
        return self._call(lease_id, "step", lambda env: asdict(env.step(message)))

    def evaluate(self, lease_id: str) -> dict[str, Any]:
        return self._call(lease_id, "evaluate", lambda env: asdict(env.evaluate()))

    def oracle(self, lease_id: str) -> dict[str, Any]:
        return self._call(lease_id, "oracle", lambda env: {"messages": env.oracle()})

    def heartbeat(self, lease_id: str) -> dict[str, Any]:
        lease = self._get(lease_id)
        lease.touch()
        return {"expires_at": lease.expires_at}

    def close(self, lease_id: str) -> dict[str, Any]:
        lease = self._get(lease_id)
        with lease.lock:
            self._end(lease_id, "closed", "closed")
        return {"closed": True}

    def _end(self, lease_id: str, why: str, counter: str) -> None:
        with self._lock:
            lease = self._leases.pop(lease_id, None)
            self._dead[lease_id] = why
            if len(self._dead) > 10000:  # keep the memory of old leases bounded
                for k in list(self._dead)[:5000]:
                    del self._dead[k]
            if lease is not None:
                self.counts[counter] += 1
        if lease is not None:
            try:
                lease.env.close()
            except Exception as e:  # noqa: BLE001
                log.warning("env pool: closing lease %s failed: %s", lease_id, e)

    def reap(self) -> int:
        now = time.time()
        with self._lock:
            expired = [le for le in self._leases.values() if le.expires_at < now]
        n = 0
        for le in expired:
            if le.lock.acquire(blocking=False):  # a lease in the middle of a call is not idle
                try:
                    if le.expires_at < time.time():
                        self._end(le.id, f"expired after {self.lease_ttl_s:g} s without a call or heartbeat",
                                  "reaped")
                        n += 1
                finally:
                    le.lock.release()
        if n:
            log.info("env pool: reaped %d idle lease(s)", n)
        return n

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.reap()
            except Exception as e:  # noqa: BLE001
                log.warning("env pool: reaper: %s", e)

    def status(self) -> dict[str, Any]:
        with self._lock:
            leases = [{"lease_id": le.id, "task_id": le.env.task.task_id, "slot": le.slot, "steps": le.env.steps,
                       "expires_in_s": round(le.expires_at - time.time(), 1)}
                      for le in self._leases.values()]
        return {"track": self.track_name, "capacity": self.capacity, "active": len(leases), "leases": leases,
                "lease_ttl_s": self.lease_ttl_s, "sandbox": self.opts.sandbox, **self.counts}

    def shutdown(self) -> None:
        with self._lock:  # an environment still being built closes itself when it finds the pool stopped
            self._stop.set()
            leases = list(self._leases)
        for lease_id in leases:
            self._end(lease_id, "pool shut down", "closed")


# -- HTTP ---------------------------------------------------------------------------
def create_pool_app(pool: EnvPool) -> FastAPI:
    app = FastAPI(title=f"clawloop env pool ({pool.track_name})")

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError:
            raise PoolError(400, "body must be JSON") from None
        if not isinstance(data, dict):
            raise PoolError(400, "body must be a JSON object")
        return data

    def lease_of(data: dict[str, Any]) -> str:
        lid = data.get("lease_id")
        if not isinstance(lid, str) or not lid:
            raise PoolError(422, "lease_id is required")
        return lid

    @app.exception_handler(PoolError)
    async def _pool_error(request: Request, e: PoolError) -> JSONResponse:
        headers = {"Retry-After": "1"} if e.status == 429 else None
        return JSONResponse({"error": {"message": e.message, "code": e.status}}, status_code=e.status,
                            headers=headers)

    @app.post("/allocate")
    async def allocate(request: Request) -> Any:
        data = await body_of(request)
        tid = data.get("task_id")
        return await run_in_threadpool(pool.allocate, None if tid is None else str(tid))

    for name in ("reset", "evaluate", "oracle", "close", "heartbeat"):
        def route(fn=getattr(pool, name)):
            async def handler(request: Request) -> Any:
                data = await body_of(request)
                return await run_in_threadpool(fn, lease_of(data))
            return handler
        app.post("/" + name)(route())

    async def step(request: Request) -> Any:
        data = await body_of(request)
        message = data.get("message") or data.get("action")
        if message is None:
            raise PoolError(422, "message is required (the assistant message to act on)")
        return await run_in_threadpool(pool.step, lease_of(data), message)

    app.post("/step")(step)
    app.post("/exec_tool")(step)

    @app.get("/status")
    async def status() -> Any:
        return pool.status()

    @app.get("/tasks")
    async def tasks() -> Any:
        return {"track": pool.track_name, "task_ids": await run_in_threadpool(pool.task_ids)}

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok", "track": pool.track_name}

    return app


class HTTPPool:
    """The pool API over HTTP, with EnvPool's method names (what a generator uses for a remote pool)."""

    def __init__(self, url: str, timeout_s: float = 900.0, retries: int = 3, connect_timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        # env calls may run for minutes, but a server that does not even accept the connection
        # (its node gone) must fail fast so a SpreadPool can move on
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s))
        self.retries = retries

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                r = self.client.post(self.url + path, json=body)
            except httpx.TransportError as e:
                if attempt == self.retries:
                    raise PoolError(503, f"env pool {self.url} unreachable: {e}") from e
                time.sleep(0.5 * 2 ** attempt)
                continue
            if r.status_code == 200:
                return r.json()
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text[:300]
            raise PoolError(r.status_code, msg)
        raise AssertionError("unreachable")

    def allocate(self, task_id: str | None = None) -> dict[str, Any]:
        return self._post("/allocate", {} if task_id is None else {"task_id": task_id})

    def reset(self, lease_id: str) -> dict[str, Any]:
        return self._post("/reset", {"lease_id": lease_id})

    def step(self, lease_id: str, message: dict[str, Any]) -> dict[str, Any]:
        return self._post("/step", {"lease_id": lease_id, "message": message})

    def evaluate(self, lease_id: str) -> dict[str, Any]:
        return self._post("/evaluate", {"lease_id": lease_id})

    def oracle(self, lease_id: str) -> dict[str, Any]:
        return self._post("/oracle", {"lease_id": lease_id})

    def heartbeat(self, lease_id: str) -> dict[str, Any]:
        return self._post("/heartbeat", {"lease_id": lease_id})

    def close(self, lease_id: str) -> dict[str, Any]:
        return self._post("/close", {"lease_id": lease_id})

    def task_ids(self) -> list[str]:
        r = self.client.get(self.url + "/tasks")
        r.raise_for_status()
        return list(r.json()["task_ids"])

    def status(self) -> dict[str, Any]:
        r = self.client.get(self.url + "/status")
        r.raise_for_status()
        return r.json()

    def shutdown(self) -> None:
        self.client.close()


class SpreadPool:
    """Several pool servers of one track behind EnvPool's method names.

    `allocate` asks the server holding the fewest of this client's open leases (ties rotate), and
    passes over one that is full (429) or unreachable (503): it answers 429 only when every server
    is full, 503 when none can be reached. An unreachable server is skipped for `cooldown_s` so
    allocations do not pay its connection retries every time. Lease ids are `"<index>:<id>"`; every
    other call goes to the server the index names. A lease on a server that died is lost (its calls
    answer 503, or 404/410 once the server is back): the episode fails as with one pool.
    """

    def __init__(self, urls: list[str], *, cooldown_s: float = 10.0, retries: int = 1):
        if not urls:
            raise ValueError("SpreadPool needs at least one pool URL")
        self.pools = [HTTPPool(u, retries=retries) for u in urls]
        self.cooldown_s = cooldown_s
        self._open: list[set[str]] = [set() for _ in urls]
        self._down_until = [0.0] * len(urls)
        self._turn = 0
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.pools]

    def allocate(self, task_id: str | None = None) -> dict[str, Any]:
        n = len(self.pools)
        with self._lock:
            now = time.monotonic()
            turn, self._turn = self._turn, self._turn + 1
            order = sorted(range(n), key=lambda i: (self._down_until[i] > now, len(self._open[i]), (i - turn) % n))
        refused: list[PoolError] = []
        for i in order:
            try:
                lease = self.pools[i].allocate(task_id)
            except PoolError as e:
                if e.status not in (429, 503):
                    raise
                if e.status == 503:
                    with self._lock:
                        self._down_until[i] = time.monotonic() + self.cooldown_s
                refused.append(e)
                continue
            with self._lock:
                self._open[i].add(lease["lease_id"])
                self._down_until[i] = 0.0
            return {**lease, "lease_id": f"{i}:{lease['lease_id']}"}
        if any(e.status == 429 for e in refused):
            raise PoolError(429, f"all {n} env pools are at capacity; retry later")
        raise PoolError(503, f"no env pool reachable: {'; '.join(e.message for e in refused)}")

    def _route(self, lease_id: str) -> tuple[int, str]:
        head, sep, rest = str(lease_id).partition(":")
        if not sep or not head.isdigit() or int(head) >= len(self.pools) or not rest:
            raise PoolError(404, f"no lease {lease_id!r} (not one of this spread pool's)")
        return int(head), rest

    def reset(self, lease_id: str) -> dict[str, Any]:
        i, lid = self._route(lease_id)
        return self.pools[i].reset(lid)

    def step(self, lease_id: str, message: dict[str, Any]) -> dict[str, Any]:
        i, lid = self._route(lease_id)
        return self.pools[i].step(lid, message)

    def evaluate(self, lease_id: str) -> dict[str, Any]:
        i, lid = self._route(lease_id)
        return self.pools[i].evaluate(lid)

    def oracle(self, lease_id: str) -> dict[str, Any]:
        i, lid = self._route(lease_id)
        return self.pools[i].oracle(lid)

    def heartbeat(self, lease_id: str) -> dict[str, Any]:
        i, lid = self._route(lease_id)
        return self.pools[i].heartbeat(lid)

    def close(self, lease_id: str) -> dict[str, Any]:
        i, lid = self._route(lease_id)
        with self._lock:  # the lease is over for this client whatever the server answers
            self._open[i].discard(lid)
        return self.pools[i].close(lid)

    def task_ids(self) -> list[str]:
        """The track's task ids, from the first server that answers (all serve the same track)."""
        errors = []
        for p in self.pools:
            try:
                return p.task_ids()
            except httpx.HTTPError as e:
                errors.append(f"{p.url}: {e}")
        raise PoolError(503, f"no env pool reachable: {'; '.join(errors)}")

    def status(self) -> dict[str, Any]:
        """Every server's /status (or its error), and the totals of the ones that answered."""
        pools: list[dict[str, Any]] = []
        for p, mine in zip(self.pools, self._open):
            try:
                pools.append({"url": p.url, "open_here": len(mine), **p.status()})
            except httpx.HTTPError as e:
                pools.append({"url": p.url, "open_here": len(mine), "error": str(e)})
        keys = ("capacity", "active", "allocated", "closed", "reaped", "crashed", "refused_full")
        return {**{k: sum(int(s.get(k, 0)) for s in pools) for k in keys},
                "reachable": sum("error" not in s for s in pools), "pools": pools}

    def shutdown(self) -> None:
        for p in self.pools:
            p.shutdown()


def connect_pool(url: str | None, track: str, opts: EnvOptions, capacity: int) -> EnvPool | HTTPPool | SpreadPool:
    """A remote pool when `url` is given (several, comma-separated: a SpreadPool over them), else a
    local one (the default for generators)."""
    urls = [u.strip() for u in (url or "").split(",") if u.strip()]
    if len(urls) > 1:
        return SpreadPool(urls)
    if urls:
        return HTTPPool(urls[0])
    return EnvPool(track, opts, capacity=capacity)


def run_pool_server(track: str, opts: EnvOptions, *, host: str, port: int, capacity: int,
                    lease_ttl_s: float) -> None:
    pool = EnvPool(track, opts, capacity=capacity, lease_ttl_s=lease_ttl_s)
    n = len(pool.task_ids())
    log.info("env pool: track %s, %d task(s), capacity %d, sandbox %s, on http://%s:%d", track, n, capacity,
             opts.sandbox, host, port)
    try:
        uvicorn.run(create_pool_app(pool), host=host, port=port, log_level="warning")
    finally:
        pool.shutdown()
