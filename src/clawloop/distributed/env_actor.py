"""Env-pool actors: the rollout buffer's environments on the nodes that offer the env resource.

    clawloop buffer --ray auto --env-type toolcall --env-workers 4     # clawloop.apps.buffer.run_buffer does:
    pools = start_env_pools(cfg)        # 4 EnvPoolActor, each {env: 1, CPU: --env-num-cpus}
    cfg.env.pool_url = ",".join(pools.urls)   # generators build a SpreadPool over them
    ...; pools.close()

Each `EnvPoolActor` builds an `EnvPool` of the buffer's track (ENV_TYPE) with the options a local
pool would get, and serves its lease API (`create_pool_app`) with uvicorn on a thread of the actor,
bound to its node's address (127.0.0.1 on a loopback cluster). Ray places the actors only on nodes
started with the custom resource (`ray start --resources '{"env": 8}'`), so agent commands run on
CPU nodes and never beside an engine. Generators stay in the buffer's process tree and talk HTTP
to the pools; nothing Ray-specific reaches them. `--parallel-envs` stays the number of
environments at once: each actor holds its share (rounded up).

Faults. Actors are created with `max_restarts`: when one dies Ray starts it again, and it binds
the port its first incarnation was given (free again once the old process is gone), so the URL
generators hold stays valid. If that port is taken (or the actor came back on another node) the
URL changes: `EnvPools` notices within `ray.health_interval_s`, calls `on_change` (the buffer puts
the new URLs in the next rollouts' payload), and running generators' SpreadPools pass over the
dead URL. Leases held on a pool that died are lost: those episodes fail and are counted
(`env_failed`) as with any environment crash, never written with a made-up reward.

Exposure: on a real cluster the pools listen on node addresses, reachable by anything that can
reach the cluster's own ports (which already run arbitrary code); keep the cluster's network private.
The env nodes need clawloop's environment and the track's requirements (a sandbox: bwrap or unshare;
--task-dir at the same path).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable

from clawloop.envs.base import EnvOptions

log = logging.getLogger(__name__)


class EnvPoolActor:
    """One EnvPool served over HTTP from inside a Ray actor (wrapped with ray.remote at use)."""

    def __init__(self, name: str, track: str, opts: EnvOptions, capacity: int, lease_ttl_s: float, port: int = 0):
        import ray
        import uvicorn

        from clawloop.envs.pool import EnvPool, create_pool_app

        self.name = name
        self.incarnation = uuid.uuid4().hex[:12]
        self.pid = os.getpid()
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.resources = dict(ctx.get_assigned_resources())
        self.node_ip = ray.util.get_node_ip_address()
        self.pool = EnvPool(track, opts, capacity=capacity, lease_ttl_s=lease_ttl_s)
        self.pool.task_ids()  # a bad --task-dir fails the actor's start, with the reason
        self.sock = _bind(self.node_ip, port)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_pool_app(self.pool), log_level="warning",
                                                    access_log=False, proxy_headers=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name=f"envpool-http-{name}")
        self.thread.start()
        deadline = time.monotonic() + 30.0
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the env pool server did not start on {self.node_ip}:{self.port}")
            time.sleep(0.02)

    def url(self) -> str:
        host = f"[{self.node_ip}]" if ":" in self.node_ip else self.node_ip
        return f"http://{host}:{self.port}"

    def info(self) -> dict[str, Any]:
        """Who and where this actor is, and its pool's lease counts."""
        st = self.pool.status()
        return {"name": self.name, "incarnation": self.incarnation, "url": self.url(), "node_ip": self.node_ip,
                "node_id": self.node_id, "pid": self.pid, "resources": self.resources, "leases": st["active"],
                "capacity": st["capacity"]}

    def status(self) -> dict[str, Any]:
        return {**self.pool.status(), **self.info()}

    def stop(self) -> None:
        self.pool.shutdown()
        self.server.should_exit = True
        self.thread.join(timeout=10.0)


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on `port`, or on any free port when that one is taken (or 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for p in ([port, 0] if port else [0]):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, p))
        except OSError:
            sock.close()
            if p == 0:
                raise
            log.warning("env pool: port %d is taken on %s; using a free one (the pool's URL changes)", p, host)
            continue
        return sock
    raise AssertionError("unreachable")


def _free_ports(n: int) -> list[int]:
    """n distinct ports free on this node now: the ports the actors ask for first (and again on a
    restart). On another node one may be taken; the actor then takes any."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EnvPools:
    """The env-pool actors of one buffer: their URLs, their health, and stopping them.

    A watcher thread asks every actor for its `info` each `interval_s`: it counts restarts (a new
    incarnation), and when an actor's URL changed it updates `urls` and calls `on_change(urls)`."""

    def __init__(self, handles: list[Any], infos: list[dict[str, Any]], *, ray_names: list[str],
                 interval_s: float = 1.0, ping_timeout_s: float = 10.0):
        self.handles = handles
        self.ray_names = ray_names
        self.ping_timeout_s = ping_timeout_s
        self.on_change: Callable[[list[str]], None] | None = None
        self._state = [{"name": f"env-{i}", "role": "env", "state": "up", "restarts": 0, "last_error": None,
                        **info} for i, info in enumerate(infos)]
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, args=(interval_s,), daemon=True,
                                         name="clawloop-env-pools")
        self._watcher.start()

    @property
    def urls(self) -> list[str]:
        with self._lock:
            return [s["url"] for s in self._state]

    def refresh(self) -> list[dict[str, Any]]:
        """Ask every actor for its info now; the actors' states (the `health` rows)."""
        with self._refreshing:  # one at a time: older answers never overwrite newer ones
            return self._refresh()

    def _refresh(self) -> list[dict[str, Any]]:
        import ray

        refs = [h.info.remote() for h in self.handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.ping_timeout_s)
        done = set(ready)
        results: list[Any] = []
        for ref in refs:
            if ref not in done:
                results.append(TimeoutError(f"no answer within {self.ping_timeout_s:g} s"))
                continue
            try:
                results.append(ray.get(ref))
            except Exception as e:  # dead, restarting: the actor's state says which
                results.append(e)
        changed = False
        with self._lock:
            for s, res in zip(self._state, results):
                if isinstance(res, BaseException):
                    first = (str(res).strip().splitlines() or [""])[0]
                    s["state"], s["last_error"] = _down_state(res), f"{type(res).__name__}: {first[:200]}"
                    continue
                if res["incarnation"] != s["incarnation"]:
                    s["restarts"] += 1
                    log.warning("%s restarted (restart %d, pid %s) at %s; its open leases were lost", s["name"],
                                s["restarts"], res["pid"], res["url"])
                changed |= res["url"] != s["url"]
                s.update(res, state="up")
            urls = [s["url"] for s in self._state]
            rows = [dict(s) for s in self._state]
        if changed and self.on_change is not None:
            self.on_change(urls)
        return rows

    def health(self) -> list[dict[str, Any]]:
        """One row per actor: name (env-<i>), role, state (up | restarting | dead | unreachable), url,
        node_ip, node_id, pid, restarts, leases (open now), capacity, resources, last_error."""
        rows = self.refresh()
        for row, ray_name in zip(rows, self.ray_names):
            row.pop("incarnation", None)
            row["ray_name"] = ray_name
        return rows

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001 - watching never takes the buffer down
                log.warning("env pools: %s", e)

    def close(self) -> None:
        """Stop every pool (its environments closed) and its actor; never raises."""
        import ray

        self._stop.set()
        self._watcher.join(timeout=self.ping_timeout_s + 5.0)
        stops = [h.stop.remote() for h in self.handles]
        try:
            ray.wait(stops, num_returns=len(stops), timeout=15.0)
        except Exception as e:  # noqa: BLE001
            log.warning("env pools: stopping: %s", e)
        for h in self.handles:
            try:
                ray.kill(h, no_restart=True)
            except Exception as e:  # noqa: BLE001
                log.warning("env pools: ray.kill: %s", e)


def _down_state(e: BaseException) -> str:
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    if isinstance(e, ActorUnavailableError):
        return "restarting"
    if isinstance(e, ActorDiedError):
        return "dead"
    return "unreachable"


def start_env_pools(cfg: Any) -> EnvPools:
    """Start `cfg.ray.env_workers` EnvPoolActor on nodes offering `cfg.ray.env_resource` and wait for
    their URLs (up to `cfg.ray.start_timeout_s`). Needs a connected Ray (`ray_runtime.connect`)."""
    import ray
    from ray.exceptions import GetTimeoutError

    from clawloop.config import ConfigError
    from clawloop.envs.rollout import env_options

    r, e = cfg.ray, cfg.env
    if not e.track:
        raise ConfigError("env.track: --env-workers starts env pools for one track; name it with --env-type "
                          "(or ENV_TYPE): toolcall, terminal, swe or gui")
    n = int(r.env_workers)
    offered = float(ray.cluster_resources().get(r.env_resource, 0.0))
    if offered < 1.0:
        raise ConfigError(f"ray.env_workers: {n} env-pool actor(s) ask for {{{r.env_resource!r}: 1}} each, but no "
                          f"node of the cluster offers the custom resource {r.env_resource!r}. Start the env nodes "
                          f"with `ray start ... --resources '{{\"{r.env_resource}\": 8}}'`, name the resource they "
                          "offer with --env-resource, or pass --env-workers 0 (environments in the generators)")
    if offered < n:
        log.warning("ray: %d env-pool actor(s) need %d %r, the cluster offers %g; the rest wait for nodes up to "
                    "--ray-start-timeout-s %.0f s", n, n, r.env_resource, offered, r.start_timeout_s)
    opts = env_options(e.payload())
    capacity = max(1, math.ceil(e.parallel_envs / n))
    cls = ray.remote(EnvPoolActor)
    prefix = f"clawloop-buffer-{cfg.buffer.port}-"
    names = [f"{prefix}env-{i}" for i in range(n)]
    ports = _free_ports(n)
    handles = [cls.options(name=names[i], resources={r.env_resource: 1}, num_cpus=r.env_num_cpus,
                           max_restarts=r.max_restarts, max_task_retries=0)
               .remote(f"env-{i}", e.track, opts, capacity, e.lease_ttl_s, ports[i])
               for i in range(n)]
    try:
        infos = ray.get([h.info.remote() for h in handles], timeout=r.start_timeout_s)
    except GetTimeoutError:
        _kill(handles)
        raise RuntimeError(f"ray: {n} env-pool actor(s) of {{{r.env_resource!r}: 1, 'CPU': {r.env_num_cpus:g}}} did "
                           f"not start within {r.start_timeout_s:.0f} s (cluster resources: "
                           f"{ray.cluster_resources()}); lower --env-workers / --env-num-cpus, or add nodes offering "
                           f"--env-resource {r.env_resource}") from None
    except BaseException:
        _kill(handles)
        raise
    return EnvPools(handles, infos, ray_names=names, interval_s=r.health_interval_s)


def _kill(handles: list[Any]) -> None:
    import ray

    for h in handles:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - cleaning up after a failed start
            pass
