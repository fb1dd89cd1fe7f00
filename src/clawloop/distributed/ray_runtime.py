"""`clawloop up --ray auto|local`: connect to Ray and build the roles as actors.

    --ray auto    ray.init(address="auto"): attach to the cluster `ray start --head` runs on this node
                  (or RAY_ADDRESS); clawloop's actors live on it, the gateway, the store (SQLite, the
                  single source of truth) and the judge stay in this process on the head node.
    --ray local   start a private single-node cluster in this process: bound to 127.0.0.1, no
                  dashboard, an object store of --ray-object-store-mb, --ray-num-cpus CPUs and as many
                  of the --env-resource custom resource, its own session folder (--ray-temp-dir, else
                  a fresh one under /tmp) so it never meets another cluster on the machine; stopped at exit.

Roles: `--engine-replicas` engine replicas in a placement group of {CPU: --engine-num-cpus, GPU:
--engine-num-gpus} bundles (--ray-placement): hf engine actors behind `router.RayEngine`, or with
`--backend vllm` vLLM servers started on the bundles' nodes by `vllm_actor.VLLMHost` actors behind
`vllm_actor.RayVLLMEngine`; `--trainer-workers` data-parallel trainer actors (`trainer_group`, one
PACK placement group); `--judge-workers` judge engine actors for `--judge frozen` (`router.RayEngine`
with role judge, never published to); env-pool actors on the --env-resource custom resource are
started by `clawloop buffer --ray` (`env_actor`).

Every actor needs clawloop importable on its node: the same environment on every node (as with
`ray start` run from this project's .venv), and for resumes on more than one node a --save-dir
every node can read.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from clawloop.config import Config

log = logging.getLogger(__name__)


def loopback_only() -> None:
    """Make a cluster started from this process bind 127.0.0.1 only. Ray binds the machine's address
    unless it believes clusters are disabled (its Windows/macOS switch, read when `ray` is imported,
    and inherited by the GCS, raylet and workers through the environment)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def connect(cfg: Config) -> dict[str, Any]:
    """ray.init for `cfg.ray.mode`; returns what was done (for the startup line and `close`)."""
    import ray

    r = cfg.ray
    if ray.is_initialized():  # (a test, or a host program that connected first: it disconnects, not us)
        return {"mode": r.mode, "started": False, "owned": False, "address": "(already connected)"}
    env_vars = {"TOKENIZERS_PARALLELISM": "false"}
    for k in ("HF_HUB_OFFLINE", "CLAWLOOP_CACHE"):
        if os.environ.get(k):
            env_vars[k] = os.environ[k]
    if r.mode == "local":
        loopback_only()
        temp = r.temp_dir or tempfile.mkdtemp(prefix="clawloop-ray-", dir="/tmp")
        ctx = ray.init(num_cpus=r.num_cpus, num_gpus=None, resources={r.env_resource: float(r.num_cpus)},
                       include_dashboard=False, object_store_memory=r.object_store_mb * 1024 * 1024,
                       _temp_dir=temp, _node_ip_address="127.0.0.1", namespace="clawloop",
                       configure_logging=False, log_to_driver=True, runtime_env={"env_vars": env_vars})
        return {"mode": "local", "started": True, "address": ctx.address_info.get("gcs_address", ""),
                "temp_dir": temp, "own_temp_dir": not r.temp_dir}
    # The cluster's address: RAY_ADDRESS, else the `ray_current_cluster` file `ray start` wrote in its
    # --temp-dir (--ray-temp-dir here; default /tmp/ray). Ray picks up the cluster's auth token
    # (~/.ray/auth_token) only when it finds the address itself, so "auto" is what is passed; an
    # explicit RAY_ADDRESS to a token-auth cluster needs RAY_AUTH_MODE=token as well.
    addr = os.environ.get("RAY_ADDRESS") or _read_address(r.temp_dir or "/tmp/ray")
    if addr.startswith("127.") or addr.startswith("localhost"):
        loopback_only()  # a loopback head: this driver's node address is 127.0.0.1 too
    ctx = ray.init(address="auto", namespace="clawloop", _temp_dir=r.temp_dir or None,
                   configure_logging=False, log_to_driver=True, runtime_env={"env_vars": env_vars})
    return {"mode": "auto", "started": False, "address": ctx.address_info.get("gcs_address", "")}


def _read_address(temp_dir: str) -> str:
    try:
        return (Path(temp_dir) / "ray_current_cluster").read_text().strip()
    except OSError:
        return ""


class RayRuntime:
    """The Ray side of `clawloop up --ray`: the connection, the engine router, the trainer group."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.info = connect(cfg)
        self.engine: Any = None

    def roles(self, *, judge: bool, train: bool, engine: bool = True) -> list[tuple[str, int, str]]:
        """(role, actors, config key prefix) of what this process starts."""
        r, m = self.cfg.ray, self.cfg.model
        out = [("engine", m.engine_replicas, "engine")] if engine else []
        if train and r.trainer_workers:
            out.append(("trainer", r.trainer_workers, "trainer"))
        if judge and r.judge_workers:
            out.append(("judge", r.judge_workers, "judge"))
        return out

    def check_fit(self, *, judge: bool, train: bool, engine: bool = True) -> None:
        """Resolve the CPU reservations left on auto (-1), then check every reservation against the
        cluster's total: a local cluster that cannot hold them is a ConfigError naming the flags; an
        attached one may grow (autoscaler), so a warning.

        Auto: 1 CPU per actor when the cluster has one free for each (after the fixed reservations),
        else the free CPUs shared evenly (`ray start --head --num-cpus 2` holds an engine actor and two
        trainer actors at 2/3 CPU each). A reservation only places actors; threads are set apart."""
        import ray

        from clawloop.config import ConfigError

        r = self.cfg.ray
        roles = self.roles(judge=judge, train=train, engine=engine)
        if not roles:
            return
        total = ray.cluster_resources()
        cpus = min(float(total.get("CPU", 0.0)), float(ray.available_resources().get("CPU", 0.0)))
        autos = [(role, n) for role, n, key in roles if getattr(r, f"{key}_num_cpus") < 0]
        fixed = sum(n * getattr(r, f"{key}_num_cpus") for role, n, key in roles if getattr(r, f"{key}_num_cpus") >= 0)
        if autos:
            count = sum(n for _, n in autos)
            per = min(1.0, (cpus - fixed) / count) if count else 1.0
            per = int(per * 100) / 100.0
            if per < 0.01:
                raise ConfigError(f"ray.engine_num_cpus: the cluster has {cpus:g} CPU free, the fixed reservations take "
                                  f"{fixed:g}; nothing is left for {count} actor(s) on auto (-1). Set "
                                  "--engine-num-cpus / --trainer-num-cpus / --judge-num-cpus, or add nodes")
            for role, _ in autos:
                setattr(r, f"{role}_num_cpus", per)
        for kind in ("CPU", "GPU"):
            need = sum(n * getattr(r, f"{key}_num_{kind.lower()}s") for _, n, key in roles)
            have = float(total.get(kind, 0.0))
            if need <= have + 1e-9:
                continue
            parts = " + ".join(f"{n} {role} actor(s) x {getattr(r, f'{key}_num_{kind.lower()}s'):g}"
                               for role, n, key in roles)
            why = (f"{parts} = {need:g} {kind}, the cluster has {have:g}; lower --engine-num-{kind.lower()}s / "
                   f"--trainer-num-{kind.lower()}s / --judge-num-{kind.lower()}s (fractions are fine) or add nodes")
            if self.info.get("started"):
                raise ConfigError(f"ray.{roles[-1][2]}_num_{kind.lower()}s: {why}")
            log.warning("ray: %s; the actors wait for room up to --ray-start-timeout-s %.0f s", why,
                        r.start_timeout_s)

    def cluster(self) -> dict[str, Any]:
        """The cluster's nodes and resources (for /health and `clawloop status`), cached for 5 s."""
        import time

        import ray

        now = time.monotonic()
        cached = getattr(self, "_cluster", None)
        if cached is not None and now - cached[0] < 5.0:
            return cached[1]
        try:
            nodes = [{"node_id": n.get("NodeID", ""), "node_ip": n.get("NodeManagerAddress", ""),
                      "alive": bool(n.get("Alive")), "resources": n.get("Resources", {})}
                     for n in ray.nodes()]
            out = {"mode": self.info.get("mode"), "address": self.info.get("address"), "nodes": nodes,
                   "resources": ray.cluster_resources(), "available": ray.available_resources()}
        except Exception as e:  # reporting never breaks /health
            out = {"mode": self.info.get("mode"), "address": self.info.get("address"), "error": str(e)}
        self._cluster = (now, out)
        return out

    def make_engine(self) -> Any:
        if self.cfg.model.backend == "vllm":
            from clawloop.distributed.vllm_actor import RayVLLMEngine

            self.engine = RayVLLMEngine.from_config(self.cfg)
            return self.engine
        from clawloop.distributed.router import RayEngine

        self.engine = RayEngine.from_config(self.cfg)
        return self.engine

    def register(self, engine: Any, judge_loop: Any = None) -> None:
        """/health: the cluster's nodes and resources, and the judge actors beside the engine's."""
        engine.cluster_info = self.cluster
        judge = getattr(judge_loop, "judge", None)
        jengine = getattr(getattr(judge, "backend", None), "engine", None)
        if jengine is not None and jengine is not engine and hasattr(jengine, "replicas"):
            engine.actor_sources.append(lambda: [r.health() for r in jengine.replicas])
            self.judge_engine = jengine

    def describe(self, engine: bool = True) -> str:
        import ray

        res = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        r = self.cfg.ray
        return (f"ray {self.info['mode']} cluster at {self.info['address']} ({nodes} node(s), "
                f"{res.get('CPU', 0):g} CPU, {res.get('GPU', 0):g} GPU): "
                + (f"{self.cfg.model.engine_replicas} engine actor(s) x {r.engine_num_cpus:g} CPU, " if engine else "")
                + (f"{r.trainer_workers} trainer actor(s) x {r.trainer_num_cpus:g} CPU" if r.trainer_workers
                   else "the trainer in this process")
                + (f", {r.judge_workers} judge actor(s) x {r.judge_num_cpus:g} CPU" if r.judge_workers else ""))

    def close(self) -> None:
        """Leave the cluster (a local one stops with it). Actors were stopped by their owners."""
        import ray

        if ray.is_initialized() and self.info.get("owned", True):
            try:
                ray.shutdown()
            except Exception as e:  # never turn a clean exit into a crash
                log.warning("ray.shutdown: %s", e)
                return
            if self.info.get("own_temp_dir"):  # a clean stop: the local cluster's session folder goes too
                import shutil

                shutil.rmtree(self.info["temp_dir"], ignore_errors=True)
