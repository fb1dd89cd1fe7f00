"""One replica set: the engines with several replicas route, watch, restart and publish through it.

    replicas = ReplicaSet([HTTPReplica(0, "replica0"), ...], transport=engine, health_interval_s=2.0, ...)
    r = replicas.route(session_id)                       # or `await replicas.wait_route(...)`
    await replicas.fan_out("publish", version, call)      # every replica that is up, at once

Two engines use it, each its own transport: the vLLM engine (`engines/vllm.py`: HTTP to vLLM
server processes it starts or attaches to) and the Ray engine (`distributed/router.py`: hf
engines in Ray actors, called through their handles). What a replica set decides is the same for
both, so it is written here once:

- **Routing.** A session sticks to one replica that is up (rendezvous hashing of the session id
  over the up replicas: its prefix cache stays warm, and losing a replica moves only that
  replica's sessions); a request without a session goes to the least busy one.
- **Health.** A monitor probes every replica each `health_interval_s`: a replica that is gone
  (exited, died) is taken down at once; one that misses `HUNG_AFTER` probes in a row (hung) too;
  one that answers while down is caught up to the served weights and version, under the publish
  lock (no publish can slip between catching up and taking traffic), and only then routed to.
- **Restart.** A replica whose process the transport starts itself is restarted with bounded
  exponential backoff, at most `max_restarts` times; one whose runtime restarts it (Ray's
  `max_restarts`) is waited for, and given up once it stays down `down_timeout_s`.
- **Publish fan-out.** A call on every replica that is up, at once; a replica that fails is
  taken down (it catches up when it is back); the publish fails only if every replica did.

What differs is the transport (`ReplicaTransport`): how a replica is probed, caught up, launched
and halted. Version labels stay with the engines: each replica records the version it serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Protocol

from clawloop.engines.base import EngineUnavailable

log = logging.getLogger(__name__)

HUNG_AFTER = 3
"""Probes in a row an up replica may miss (no answer, or not healthy) before it is taken down."""


@dataclass
class Replica:
    """What the replica set knows of one replica; each transport adds its own fields."""

    index: int
    name: str
    state: str = "starting"
    """starting · up · down (failed a probe or a request; back once it answers) · restarting · failed
    (given up)."""
    version: int | None = None
    """The weight version this replica serves to new requests."""
    inflight: int = 0
    requests: int = 0
    restarts: int = 0
    failures: int = 0
    """Probes missed in a row."""
    last_error: str = ""
    suspicion: str = ""
    """Why a request suspected it (see `ReplicaSet.suspect`): what it is taken down for if the next probe fails."""
    down_since: float = 0.0
    down: asyncio.Future | None = None
    """Resolved when the replica leaves `up`: wakes every request waiting on it."""
    restart_task: asyncio.Task | None = None

    def health(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "policy_version": self.version,
                "inflight": self.inflight, "requests": self.requests, "restarts": self.restarts,
                "last_error": self.last_error or None}


@dataclass
class Counters:
    """What an engine in front of a replica set counts of its requests and publishes (each adds its own)."""

    requests: int = 0
    retries: int = 0
    """Requests that a failed replica left and another one took (unseen by the client)."""
    publishes: int = 0
    publish_failures: int = 0
    last_publish_s: float = 0.0

    def stats(self) -> dict[str, float]:
        return {"engine/requests": float(self.requests), "engine/retries": float(self.retries),
                "engine/publishes": float(self.publishes), "engine/publish_failures": float(self.publish_failures),
                "engine/last_publish_s": self.last_publish_s}


@dataclass
class Probe:
    """One health probe's answer: `ok` (serving as it should), `fresh` (answers, but must be caught
    up first: a new incarnation), `missed` (no answer, or not healthy), `gone` (exited or died; `state`
    says what it is now: down, restarting, failed)."""

    kind: str
    why: str = ""
    state: str = "down"


class ReplicaTransport(Protocol):
    """How an engine reaches its replicas (HTTP to vLLM servers, Ray actor handles)."""

    def owns_process(self, r: Any) -> bool:
        """True: the set restarts `r` when it goes down (`halt_replica`, `launch_replica`); False: it
        cannot (a server someone else runs) or its runtime does (Ray restarts a dead actor)."""

    async def probe_replica(self, r: Any) -> Probe: ...

    async def catch_up_replica(self, r: Any) -> None:
        """Serve the current weights under the current version (called under the publish lock); sets `r.version`."""

    async def launch_replica(self, r: Any) -> None:
        """Start a replica's process again and wait until it answers (only where `owns_process`)."""

    async def halt_replica(self, r: Any) -> None: ...

    def replica_down(self, r: Any) -> None:
        """`r` just left service: end what waits on it (open streams)."""


class ReplicaSet(Sequence):
    """The replicas of one engine (a sequence of them) and what is decided about them; see the module docstring."""

    def __init__(self, replicas: Iterable[Replica], transport: ReplicaTransport, *, version: int,
                 health_interval_s: float, max_restarts: int, down_timeout_s: float | None = None):
        self._replicas = list(replicas)
        self.version = int(version)
        """The version label of the weights served to new requests (what `publish` last made current)."""
        self.transport = transport
        self.health_interval_s = health_interval_s
        self.max_restarts = max_restarts
        self.down_timeout_s = down_timeout_s
        """A replica down (or restarting) longer than this is given up; None: never (it may come back)."""
        self.unavailable = 0
        """Requests refused because no replica was up."""
        self.lock: asyncio.Lock | None = None
        """The publish lock: publishes and catch-ups take it, one at a time."""
        self._changed: asyncio.Event | None = None
        self._monitor: asyncio.Task | None = None
        self._running = False

    def __getitem__(self, i: Any) -> Any:
        return self._replicas[i]

    def __len__(self) -> int:
        return len(self._replicas)

    def append(self, r: Replica) -> None:
        self._replicas.append(r)

    def relabel(self, version: int) -> None:
        """Name the weights served now `version` (before the replicas start; see HFEngine.relabel)."""
        if self._running:
            raise RuntimeError("relabel before start")
        self.version = int(version)

    def up(self) -> list[Replica]:
        return [r for r in self._replicas if r.state == "up"]

    def open(self) -> None:
        """Make the loop-bound parts (call on the engine's event loop, before bringing replicas up)."""
        self.lock = asyncio.Lock()
        self._changed = asyncio.Event()

    # -- routing -------------------------------------------------------------------
    def route(self, session_id: str | None, exclude: Iterable[int] = ()) -> Replica:
        """The replica for a request now (sticky by session, else least busy), or `EngineUnavailable`."""
        excluded = set(exclude)
        up = [r for r in self._replicas if r.state == "up" and r.index not in excluded]
        if not up:
            raise self._refuse()
        if session_id:
            def score(r: Replica) -> bytes:
                return hashlib.blake2b(f"{session_id}\0{r.index}".encode(), digest_size=8).digest()

            return max(up, key=score)
        return min(up, key=lambda r: (r.inflight, r.index))

    async def wait_route(self, session_id: str | None, deadline: float) -> Replica:
        """`route`, but while no replica is up and one may come back (not failed), wait for it until
        `deadline` (the loop's clock)."""
        loop = asyncio.get_running_loop()
        while True:
            if any(r.state == "up" for r in self._replicas):
                return self.route(session_id)
            left = deadline - loop.time()
            if left <= 0 or all(r.state == "failed" for r in self._replicas):
                raise self._refuse()
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, self.health_interval_s))
            except asyncio.TimeoutError:
                pass

    def _refuse(self) -> EngineUnavailable:
        self.unavailable += 1
        states = ", ".join(f"{r.name} {r.state}" for r in self._replicas)
        return EngineUnavailable(f"no inference engine replica is available ({states}); retry shortly",
                                 retry_after_s=5.0)

    # -- up and down ---------------------------------------------------------------
    async def bring_up(self, r: Replica) -> None:
        """Catch `r` up to the served weights and version under the publish lock, then route to it."""
        async with self.lock:
            await self.transport.catch_up_replica(r)
            r.failures = 0
            r.suspicion = ""
            if r.state == "starting":
                r.last_error = ""
            r.state = "up"
            r.down = asyncio.get_running_loop().create_future()
        self._changed.set()

    def suspect(self, r: Replica, why: str) -> None:
        """A request failed on `r` in a way a hung server would cause: the next missed probe takes it down."""
        r.last_error = r.suspicion = why
        r.failures = max(r.failures, HUNG_AFTER - 1)

    def mark_down(self, r: Replica, why: str, state: str = "down") -> None:
        """Stop routing to `r`, end what waits on it, and restart it if that is ours to do."""
        r.last_error = why
        if r.state == "failed":
            return
        leaving = r.state in ("up", "starting")
        if leaving:
            r.down_since = time.time()
        r.state = state
        if state == "failed":
            log.error("%s given up: %s", r.name, why)
        if r.down is not None and not r.down.done():
            r.down.set_result(None)
        if leaving:
            self.transport.replica_down(r)
            if self._running and state == "down" and self.transport.owns_process(r):
                r.restart_task = asyncio.get_running_loop().create_task(self._restart(r))

    async def _restart(self, r: Replica) -> None:
        r.state = "restarting"
        while self._running:
            if r.restarts >= self.max_restarts:
                r.state = "failed"
                log.error("%s: giving up after %d restarts (%s)", r.name, r.restarts, r.last_error)
                return
            delay = min(60.0, 2.0 ** r.restarts)
            r.restarts += 1
            await self.transport.halt_replica(r)
            await asyncio.sleep(delay)
            try:
                await self.transport.launch_replica(r)
                await self.bring_up(r)
                log.warning("%s restarted (restart %d) serving v%s", r.name, r.restarts, r.version)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                r.last_error = f"restart failed: {e}"
                log.error("%s restart failed: %s", r.name, e)

    # -- the monitor ---------------------------------------------------------------
    def start_monitor(self) -> None:
        self._running = True
        self._monitor = asyncio.get_running_loop().create_task(self._monitor_loop())

    async def stop(self) -> None:
        """Stop watching and restarting (the engine stops its replicas' processes itself)."""
        self._running = False
        tasks = [t for t in [self._monitor] + [r.restart_task for r in self._replicas] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._monitor = None

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._check(r) for r in self._replicas
                                   if r.state != "failed" and (r.restart_task is None or r.restart_task.done())),
                                 return_exceptions=True)

    async def _check(self, r: Replica) -> None:
        p = await self.transport.probe_replica(r)
        if p.kind == "gone":
            if r.state in ("up", "starting"):
                log.error("%s is gone (%s)", r.name, p.why)
            self.mark_down(r, p.why, p.state)
        elif p.kind == "missed":
            r.failures += 1
            if r.failures >= HUNG_AFTER and r.state == "up":
                log.error("%s missed %d health checks; marking it down", r.name, r.failures)
                self.mark_down(r, r.suspicion or p.why)
        elif p.kind == "ok" and r.state == "up":
            r.failures = 0
            r.suspicion = ""
        else:  # it answers but is not serving: a new incarnation, or back after being down
            if r.state == "up":
                self.mark_down(r, "restarted")
            try:
                await self.bring_up(r)
                log.warning("%s is back, serving v%s", r.name, r.version)
            except Exception as e:
                r.last_error = f"coming back: {e}"
        if (self.down_timeout_s is not None and r.state in ("down", "restarting") and r.down_since
                and time.time() - r.down_since > self.down_timeout_s):
            r.state = "failed"
            log.error("%s has been %s for %.0f s; given up", r.name, r.last_error, time.time() - r.down_since)

    # -- publish fan-out -----------------------------------------------------------
    async def fan_out(self, what: str, version: int, call: Callable[[Any], Awaitable[Any]],
                      timeout_s: float | None = None) -> None:
        """`call(replica)` on every replica that is up, at once, then label them and the set `version`.
        A replica that fails is taken down (it catches up when it is back); raises only if every one failed."""
        up = self.up()
        results = await asyncio.gather(*(asyncio.wait_for(call(r), timeout_s) for r in up), return_exceptions=True)
        failed = [(r, e) for r, e in zip(up, results) if isinstance(e, BaseException)]
        for r, e in failed:
            log.error("%s v%d to %s failed: %s; it catches up when it is back", what, version, r.name, e)
            self.mark_down(r, f"{what} failed: {e}")
        for r, e in zip(up, results):
            if not isinstance(e, BaseException):
                r.version = version
        if up and len(failed) == len(up):
            raise RuntimeError(f"{what} of v{version} failed on every replica: {failed[0][1]}")
        self.version = version

    # -- reporting -----------------------------------------------------------------
    def health(self, backend: str) -> dict[str, Any]:
        up = len(self.up())
        status = "ok" if up == len(self._replicas) else ("degraded" if up else "unavailable")
        return {"status": status, "backend": backend, "replicas": [r.health() for r in self._replicas]}

    def stats(self) -> dict[str, float]:
        out = {"engine/replicas": float(len(self._replicas)), "engine/replicas_up": float(len(self.up())),
               "engine/active_rows": float(sum(r.inflight for r in self._replicas)),
               "engine/unavailable": float(self.unavailable),
               "engine/restarts": float(sum(r.restarts for r in self._replicas)),
               "engine/policy_version": float(self.version)}
        for r in self._replicas:
            out[f"engine/{r.name}_up"] = 1.0 if r.state == "up" else 0.0
            out[f"engine/{r.name}_inflight"] = float(r.inflight)
            out[f"engine/{r.name}_restarts"] = float(r.restarts)
            out[f"engine/{r.name}_policy_version"] = float(r.version if r.version is not None else -1)
        return out

