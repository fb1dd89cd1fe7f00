"""`--ray ... --backend vllm`: vLLM replicas whose servers run on cluster nodes, one per Ray actor.

`RayVLLMEngine` is the vLLM engine (`engines/vllm.py`) unchanged in everything but where a replica's
server starts: instead of a child of the driver, `_spawn` asks the replica's `VLLMHost` actor (one
per placement-group bundle of `--engine-num-gpus/--engine-num-cpus`, so Ray picks the node and sets
CUDA_VISIBLE_DEVICES) to start the same command line on its node, bound to the node's address. The
engine then talks HTTP to it as to any replica: token-in/token-out generation, pause → reload →
version → resume publishes, the health monitor, restarts with backoff and catch-up to the current
weights before traffic.

What every node needs: the same checkout at the same path (the vLLM environment `.venv-vllm`, its
Python path is the driver's), and the driver's `--data-dir` readable at the same path (published
weights are written under `DATA_DIR/weights/vN` and the untied model copy under `DATA_DIR`: a
shared filesystem on more than one node). The servers listen on the cluster network with vLLM's
development endpoints on (`/collective_rpc`, `/pause`): a network Ray itself already has to trust.

Faults: a server that exits is restarted by the engine through its host actor; a host actor that
dies (its node, or `ray kill-actor`) is restarted by Ray (`--ray-max-restarts`) in its bundle, and
its server with it — the engine sees the replica gone (`exited()` answers -1 for a host that is
down or has no server), restarts it there and brings it to the current weights.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from clawloop.engines.vllm import WORKER_DIR, HTTPReplica, VLLMEngine, VLLMProcess

log = logging.getLogger(__name__)

GONE = -1
"""`exited()` of a replica whose host actor is down, restarting, or has no server running."""


class VLLMHost:
    """A Ray actor that runs one vLLM server on its node (see the module docstring)."""

    def __init__(self, name: str):
        import ray

        self.name = name
        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.proc: VLLMProcess | None = None
        self.started_at = time.time()

    def start(self, python: str, args_before_host: list[str], args_after_port: list[str], env: dict[str, str],
              log_path: str) -> dict[str, Any]:
        """Start the server on this node's address and a free port of it; returns url, pid, node."""
        self.stop(5.0)
        s = socket.socket()
        s.bind((self.node_ip, 0))
        port = s.getsockname()[1]
        s.close()
        full = dict(os.environ)
        full.update(env)
        full.pop("VIRTUAL_ENV", None)
        full.pop("PYTHONPATH", None)
        if "PYTHONPATH" in env:  # clawloop's vLLM modules (logits processor, worker extension) as on this node
            full["PYTHONPATH"] = str(WORKER_DIR)
        if not full.get("CUDA_VISIBLE_DEVICES"):
            full.pop("CUDA_VISIBLE_DEVICES", None)  # Ray sets it empty for a CPU-only actor
        args = [*args_before_host, "--host", self.node_ip, "--port", str(port), *args_after_port]
        self.proc = VLLMProcess(Path(python), args, full, Path(log_path))
        self.proc.start()
        return {"url": f"http://{self.node_ip}:{port}", "pid": self.proc.pid, "node_ip": self.node_ip,
                "node_id": self.node_id}

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "pid": os.getpid(), "node_ip": self.node_ip, "node_id": self.node_id,
                "server_pid": self.proc.pid if self.proc is not None else None}

    def exited(self) -> int | None:
        if self.proc is None:
            return GONE
        return self.proc.exited()

    def stop(self, grace_s: float = 20.0) -> bool:
        if self.proc is not None:
            self.proc.stop(grace_s)
            self.proc = None
        return True

    def log_tail(self, n: int = 30) -> str:
        return self.proc.log_tail(n) if self.proc is not None else ""


class RemoteVLLMProcess:
    """`VLLMProcess`'s interface over a `VLLMHost` actor (what the engine's replica holds). Nothing here
    blocks the event loop: `start` only submits the actor call (`started()` awaits it), and `exited()`
    answers from a background poll of the host."""

    POLL_S = 1.0

    def __init__(self, host: Any, python: str, args: list[str], env: dict[str, str], log_path: Path):
        self.host, self.python, self.args, self.env, self.log_path = host, python, args, env, log_path
        self.info: dict[str, Any] = {}
        self._ref: Any = None
        self._exit: int | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        i = self.args.index("--host")
        before, after = self.args[:i], self.args[i + 4:]  # drop "--host H --port P": the host picks them
        self._ref = self.host.start.remote(self.python, before, after, self.env, str(self.log_path))

    async def started(self, timeout_s: float) -> None:
        """Wait for the host to have started the server (its url, pid, node), then watch it."""
        self.info = await asyncio.wait_for(asyncio.wrap_future(self._ref.future()), timeout_s)
        threading.Thread(target=self._poll, name="vllm-host-poll", daemon=True).start()

    def _poll(self) -> None:
        import ray

        while not self._stop.wait(self.POLL_S):
            try:
                self._exit = ray.get(self.host.exited.remote(), timeout=10)
            except Exception:  # RayActorError, ActorUnavailableError, GetTimeoutError: the host is down
                self._exit = GONE

    @property
    def url(self) -> str:
        return self.info.get("url", "")

    @property
    def pid(self) -> int | None:
        return self.info.get("pid")

    def exited(self) -> int | None:
        """The server's exit code, None while it runs; GONE when its host actor cannot say (down,
        restarting: a restarted host has no server)."""
        return self._exit

    def stop(self, grace_s: float = 20.0) -> None:
        import ray

        self._stop.set()
        try:
            ray.get(self.host.stop.remote(grace_s), timeout=grace_s + 15)
        except Exception:
            pass  # the host is gone: so is its server (it dies with its actor's process)

    def log_tail(self, n: int = 30) -> str:
        import ray

        try:
            return ray.get(self.host.log_tail.remote(n), timeout=10)
        except Exception as e:
            return f"(log of {self.log_path} unavailable: {type(e).__name__})"


class RayVLLMEngine(VLLMEngine):
    """The vLLM engine with each replica's server on a Ray actor's node."""

    local_replicas = False  # servers on other nodes cannot open this process's shared memory: files

    def __init__(self, model_path: str | Path, *, replicas: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 placement: str = "PACK", ray_max_restarts: int = 3, name_prefix: str = "",
                 host_timeout_s: float = 300.0, **kw: Any):
        import ray

        from clawloop.distributed.placement import in_bundle, reserve

        super().__init__(model_path, replicas=replicas, **kw)
        self.actor_sources: list[Any] = []
        self.cluster_info: Any = None
        self.hosts: list[Any] = []
        self.host_names: list[str] = []
        self.resources = {k: float(v) for k, v in (("CPU", num_cpus), ("GPU", num_gpus)) if v > 0}
        self.pg = reserve(replicas, num_cpus, num_gpus, placement, host_timeout_s, "vLLM replica")
        cls = ray.remote(VLLMHost)
        for i in range(replicas):
            opts = in_bundle(dict(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=ray_max_restarts,
                                  max_task_retries=0, max_concurrency=4), self.pg, i)
            name = f"{name_prefix}engine-{i}" if name_prefix else ""
            if name:
                opts["name"] = name
            try:
                self.hosts.append(cls.options(**opts).remote(name or f"engine-{i}"))
            except ValueError as e:  # the name is taken
                self._remove_hosts()
                from clawloop.config import ConfigError

                raise ConfigError(f"ray.name: {e} (another clawloop on this cluster? give each its own --ray-name)"
                                  ) from None
            self.host_names.append(name)

    @classmethod
    def from_config(cls, cfg: Any) -> "RayVLLMEngine":  # type: ignore[override]
        from clawloop.config import ConfigError
        from clawloop.distributed.router import actor_prefix, cpu_reservation
        from clawloop.engines.vllm import find_vllm_python
        from clawloop.naming import model_path

        m, r = cfg.model, cfg.ray
        path = model_path(cfg)
        if not Path(path).exists():
            raise ConfigError(f"model.path: {path} does not exist (a local HF folder: clawloop never downloads)")
        return cls(path, replicas=m.engine_replicas, num_cpus=cpu_reservation(r.engine_num_cpus), num_gpus=r.engine_num_gpus,
                   placement=r.placement, ray_max_restarts=r.max_restarts, name_prefix=actor_prefix(cfg),
                   host_timeout_s=r.start_timeout_s, python=find_vllm_python(m.vllm_python),
                   data_dir=str(Path(cfg.data_dir).resolve()), max_model_len=m.max_model_len, dtype=m.dtype,
                   lora_rank=cfg.train.lora_rank if cfg.train.use_lora else 0,
                   gpu_memory_utilization=m.gpu_memory_utilization, kv_cache_gib=m.kv_cache_gib,
                   extra_args=list(m.vllm_args), start_timeout_s=m.start_timeout_s,
                   request_timeout_s=m.request_timeout_s, health_interval_s=m.health_interval_s,
                   max_restarts=m.max_restarts, keep_weights=m.keep_weights)

    def _spawn(self, r: HTTPReplica) -> None:
        assert self.python is not None
        proc = RemoteVLLMProcess(self.hosts[r.index], str(self.python), self._server_args("HOST", 0),
                                 self._server_env(r), self.data_dir / "logs" / f"vllm-{r.name}.log")
        r.process = proc  # type: ignore[assignment]
        proc.start()  # submitted; `_wait_healthy` waits for the address

    async def _wait_healthy(self, r: HTTPReplica, timeout_s: float, first: bool = False) -> None:
        p = r.process
        if isinstance(p, RemoteVLLMProcess) and not p.info:
            await p.started(timeout_s)
            r.url = p.url
            log.info("started vLLM %s on its Ray actor (pid %s, %s); log %s on that node", r.name, p.pid, r.url,
                     p.log_path)
        await super()._wait_healthy(r, timeout_s, first)

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self._remove_hosts()

    def _remove_hosts(self) -> None:
        from clawloop.distributed.placement import release

        release(self.hosts, self.pg)
        self.hosts, self.pg = [], None

    def health(self) -> dict[str, Any]:
        out = super().health()
        actors = []
        for r, name in zip(self.replicas, self.host_names):
            info = getattr(r.process, "info", {}) if r.process is not None else {}
            actors.append({"name": f"engine-{r.index}", "role": "engine", "state": r.state,
                           "policy_version": r.version, "node_ip": info.get("node_ip", ""),
                           "node_id": info.get("node_id", ""), "pid": info.get("pid"), "url": r.url,
                           "restarts": r.restarts, "ray_name": name or None, "resources": self.resources,
                           "last_error": r.last_error or None})
        for src in self.actor_sources:
            try:
                actors.extend(src())
            except Exception as e:  # reporting never breaks /health
                actors.append({"name": "?", "state": "unknown", "last_error": str(e)})
        out["actors"] = actors
        if self.cluster_info is not None:
            out["ray"] = self.cluster_info()
        return out
