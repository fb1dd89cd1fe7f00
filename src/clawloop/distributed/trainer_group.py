"""Data-parallel training on Ray: N trainer actors forming one torch.distributed process group.

Why plain actors and a process group, not Ray Train's `TorchTrainer`: clawloop's trainer is a
service, not a job. Its loop lives in the gateway process (it reads judged turns from the store on
the head node with the committed cursor, decides when a batch is ready, publishes to the engine
router, checkpoints), and it hands the workers one batch at a time. TorchTrainer runs a training
*function* to completion and restarts it from `ray.train` checkpoints on its own schedule; feeding
it batches would mean queues into a long-running function and a second checkpoint format beside
clawloop's. Plain actors give the same process group (`init_process_group` over TCP on rank 0's
node: gloo on CPU, nccl on GPU) with step-by-step calls, clawloop's own checkpoints, and a restart
policy that knows about served versions.

One step (`DPTrainer.step`): every rank gets the whole batch (one `ray.put`, read from the object
store) and runs `Trainer.step` on it, so everything computed per batch (the staleness bound, group
normalisation of the RL scores, the mini-batch split) is identical to the single-process step. Only
the heavy work is sharded: each mini-batch is cut into `world` contiguous shards and a rank builds
micro-batches, runs teacher forwards and the forward/backward for its own shard only. The loss of
every micro-batch is divided by the *whole* mini-batch's denominator (every mode of
`step_denominator` adds up over samples), so the gradients summed over ranks (one all-reduce per
update, in buckets, SUM) are exactly the single-process gradients; then every rank clips the same
gradient and takes the same AdamW step, and the replicas stay identical without a broadcast
(`tests/test_ray.py` checks the result against the single-process step). A parameter no rank has a
gradient for stays without one, as it would in one process. Stats are merged over ranks with the
trainer's own rules (`metrics.merge_stats`).

Weights out: rank 0 returns its merged full weights as a packed state dict from an actor call, so
the object lands in the object store owned by the driver (it outlives rank 0) and the router hands
the same object ref to every engine replica (`router.RayEngine.publish`). Checkpoints: rank 0
writes clawloop's usual checkpoint (`trainer/checkpoint.py`) to `--save-dir`; every rank loads it
on resume, so on more than one node `--save-dir` must be a shared filesystem.

Faults (`RayTrainerLoop`): a worker that dies or hangs (a step past `ray.step_timeout_s`, or a
failed liveness check while idle) takes the whole group down, since a process group cannot lose a
member. The group is started again (new actors, new process group, same placement group) up to
`ray.max_restarts` times and loads the latest checkpoint; the loop's cursor goes back to the
checkpoint's, so what was trained after it is trained again on the surviving lineage. Without a
checkpoint the new group loads the weights served now (full fine-tuning; a fresh optimizer) and the
batch that failed is put back. Either way the trainer's version is set past the version served, so
the next publish is newer than anything served: versions never go backwards.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from clawloop.engines.base import AcceptsLora, ReadsObjectStore
from clawloop.losses import step_denominator
from clawloop.records import Sample
from clawloop.store import Store
from clawloop.trainer.batch import TeacherSignal, split_even
from clawloop.trainer.core import Trainer
from clawloop.trainer.hints import hint_candidates, longest_hint
from clawloop.trainer.loop import TrainerLoop
from clawloop.trainer.metrics import merge_stats

log = logging.getLogger(__name__)

BUCKET_ELEMENTS = 32 * 1024 * 1024
"""Gradient elements per all-reduce call (128 MiB of float32)."""

_SAME_ON_EVERY_RANK = ("train/step", "train/policy_version", "train/samples", "train/updates", "train/lr",
                       "train/grad_norm", "train/grad_norm_max", "train/stale_dropped", "train/stale_tokens_masked",
                       "train/mixed_version_samples", "train/zero_adv_frac", "train/score_mean", "train/groups",
                       "train/skipped_step")
"""Stats of the whole batch (or of the all-reduced gradient): every rank computes the same value."""
_SUMMED = ("train/tokens", "train/micro_batches", "train/tempered_samples")


class WorkerLost(RuntimeError):
    """A trainer actor died, hung or failed: the process group is unusable."""


# -- the data-parallel trainer (inside each worker) ------------------------------------------------
class DPTrainer(Trainer):
    """`Trainer` as rank `rank` of `world` (see the module docstring); world 1 is exactly `Trainer`."""

    def __init__(self, cfg: Any, model_path: str, *, rank: int = 0, world: int = 1, **kw: Any):
        super().__init__(cfg, model_path, **kw)
        self.rank, self.world = int(rank), int(world)
        self._in_step = False
        self._denom: float | None = None
        self._denoms: dict[int, float] = {}
        self.comm_s = 0.0
        """Seconds spent in gradient all-reduces during the last step."""

    # which samples are this rank's
    def _shard(self, n: int) -> list[int]:
        chunks = split_even(n, self.world)
        return chunks[self.rank] if self.rank < len(chunks) else []

    def _mine(self, n: int) -> list[int]:
        """Indices (into the step's samples) this rank trains on: its shard of every mini-batch."""
        out: list[int] = []
        for idx in split_even(n, self.tc.num_steps_per_rollout):
            out.extend(idx[j] for j in self._shard(len(idx)))
        return out

    @property
    def _sharding(self) -> bool:
        return self.world > 1 and self._in_step

    def step(self, samples: list[Sample], served_version: int | None = None) -> dict[str, float]:
        if self.world == 1:
            return super().step(samples, served_version)
        import torch.distributed as dist

        self._in_step, self._denoms, self.comm_s = True, {}, 0.0
        before = self.tokens_trained
        try:
            stats = super().step(samples, served_version)
        finally:
            self._in_step = False
            self._denoms.clear()
        if stats.get("train/skipped_step"):  # decided on the whole batch: the same on every rank
            return stats
        mine = float(len(self._mine(int(stats.get("train/samples", 0)))))
        local = (stats, float(stats.get("train/tokens", 0.0)), mine)
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, local)
        merged = merge_stats(gathered, losses="sum")
        for k, v in stats.items():
            if k in _SAME_ON_EVERY_RANK or k.startswith("train/staleness_") or k.startswith("train/hint_"):
                merged[k] = v
        for k in _SUMMED:
            merged[k] = float(sum(s.get(k, 0.0) for s, _, _ in gathered))
        merged["train/step_s"] = max(s.get("train/step_s", 0.0) for s, _, _ in gathered)
        merged["train/tokens_per_s"] = merged["train/tokens"] / merged["train/step_s"] if merged["train/step_s"] else 0.0
        merged["train/allreduce_s"] = self.comm_s
        merged["train/world_size"] = float(self.world)
        self.tokens_trained = before + int(merged["train/tokens"])
        self.last = merged
        return merged

    # sharded pieces of Trainer.step
    def choose_hints(self, samples: list[Sample]) -> tuple[list[str | None], dict[str, float]]:
        if not self._sharding or self.tc.hint_selection != "overlap":
            return super().choose_hints(samples)  # longest: no forward, the whole batch is cheap
        mine = self._mine(len(samples))
        sub, stats = super().choose_hints([samples[i] for i in mine])
        hints = [longest_hint(hint_candidates(s)) if s.messages and s.prompt_len > 0 else None for s in samples]
        for i, h in zip(mine, sub):
            hints[i] = h
        return hints, stats

    def teacher_signals(self, samples: list[Sample], hints: list[str | None]) -> list[TeacherSignal | None]:
        if not self._sharding:
            return super().teacher_signals(samples, hints)
        mine = self._mine(len(samples))
        sub = super().teacher_signals([samples[i] for i in mine], [hints[i] for i in mine])
        out: list[TeacherSignal | None] = [None] * len(samples)
        own = set(mine)
        for i, s in enumerate(samples):  # another rank's sample: a stand-in (it only counts as "has a teacher")
            if i not in own and ((hints[i] and s.prompt_len > 0) or
                                 (self.token_opd and s.teacher_logprobs and len(s.teacher_logprobs) == len(s.tokens))):
                out[i] = TeacherSignal([])
        for i, sig in zip(mine, sub):
            out[i] = sig
        return out

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        if not self._sharding:
            return super()._micro_batches(samples)
        masks = [torch.tensor(s.loss_mask[1:], dtype=torch.long)[None] for s in samples]  # (1, T-1) each
        self._denom = step_denominator(masks, self.tc.loss_agg, tokens_per_sample=self.tc.fixed_denominator_tokens)
        mine = [samples[j] for j in self._shard(len(samples))]
        return super()._micro_batches(mine) if mine else []

    def _tensorize(self, samples, teacher, scores, ref):  # type: ignore[override]
        b = super()._tensorize(samples, teacher, scores, ref)
        if self._sharding:
            self._denoms[id(b)] = self._denom  # the whole mini-batch's denominator, not this shard's
        return b

    def _loss(self, b, lp, logits, denom, use_pg):  # type: ignore[override]
        return super()._loss(b, lp, logits, self._denoms.get(id(b), denom) if self._sharding else denom, use_pg)

    def _optimizer_step(self) -> torch.Tensor:
        if self.world > 1:
            self.allreduce_grads()
        return super()._optimizer_step()

    def allreduce_grads(self) -> None:
        """Sum every trainable parameter's gradient over the ranks, in buckets; a parameter that has no
        gradient on any rank keeps none."""
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        t0 = time.perf_counter()
        params = self.params
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=params[0].device)
        dist.all_reduce(has)
        bucket: list[torch.nn.Parameter] = []
        size = 0

        def flush() -> None:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            for p, g in zip(bucket, _unflatten_dense_tensors(flat, grads)):
                p.grad = g

        for p, h in zip(params, has.tolist()):
            if h == 0:
                p.grad = None
                continue
            bucket.append(p)
            size += p.numel()
            if size >= BUCKET_ELEMENTS:
                flush()
                bucket, size = [], 0
        if bucket:
            flush()
        self.comm_s += time.perf_counter() - t0


# -- the actor --------------------------------------------------------------------------------------
class TrainerWorker:
    """One rank. Created by `TrainerGroup`; its methods are called by the driver, one at a time."""

    def __init__(self, cfg: Any, model_path: str, rank: int, world: int):
        import ray

        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.rank, self.world = rank, world
        self.cuda = bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.trainer = DPTrainer(cfg, model_path, rank=rank, world=world, device=device)
        self.pid = os.getpid()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        self.group_ready = world == 1

    def info(self) -> dict[str, Any]:
        t = self.trainer
        return {"rank": self.rank, "pid": self.pid, "node_id": self.node_id, "node_ip": self.node_ip,
                "device": str(t.device), "step": t.step_count, "version": t.version}

    def endpoint(self) -> tuple[str, int]:
        """An address and a free port on this node for the process group's rendezvous (rank 0)."""
        s = socket.socket()
        s.bind((self.node_ip, 0))
        port = s.getsockname()[1]
        s.close()
        return self.node_ip, port

    def init_group(self, addr: str, port: int, timeout_s: float) -> bool:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("nccl" if self.cuda else "gloo", init_method=f"tcp://{addr}:{port}",
                                rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.group_ready = True
        return True

    def step(self, samples: list[Sample], served_version: int | None,
             reward_history: list[float] | None = None) -> dict[str, float]:
        if reward_history is not None:  # the driver's loop records every judged reward (the mean baseline)
            self.trainer.reward_history.clear()
            self.trainer.reward_history.extend(reward_history)
            self.trainer.rewards_observed = True
        return self.trainer.step(samples, served_version)

    def served_weights(self) -> tuple[dict[str, Any], bool]:
        from clawloop.distributed.weights import pack

        return pack(self.trainer.served_state_dict()), True

    def lora_adapter(self) -> Any:
        return self.trainer.lora_adapter()

    def fingerprint(self) -> float:
        from clawloop.trainer.checkpoint import weights_fingerprint

        return weights_fingerprint(self.trainer.model.state_dict())

    def save(self, save_dir: str, cursor: int, extra: dict[str, Any], pending: list[Sample] | None) -> str:
        from clawloop.trainer.checkpoint import save_checkpoint

        return str(save_checkpoint(self.trainer, save_dir, cursor=cursor, extra=extra, pending=pending))

    def load(self, path: str) -> dict[str, Any]:
        from clawloop.trainer.checkpoint import load_checkpoint

        state = load_checkpoint(self.trainer, Path(path))
        return {k: v for k, v in state.items() if k not in ("torch_rng", "cuda_rng", "py_rng")}

    def load_weights(self, packed: dict[str, Any]) -> bool:
        """Full weights (the served ones, packed) into the model; the optimizer starts afresh."""
        from clawloop.distributed.weights import unpack

        sd = unpack(packed)
        missing, unexpected = self.trainer.model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"load_weights: weights do not match (missing={missing[:3]}, unexpected={unexpected[:3]})")
        self.trainer.reload_masters()
        return True

    def set_counters(self, version: int, step: int, tokens: int) -> bool:
        t = self.trainer
        t.version, t.step_count, t.tokens_trained = int(version), int(step), int(tokens)
        return True

    def bench_allreduce(self, numel: int, iters: int) -> float:
        """Mean ms of one SUM all-reduce of `numel` float32 over the group (for bench/ray_scale.py)."""
        import torch.distributed as dist

        x = torch.ones(numel, device=self.trainer.device)
        dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if self.cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / iters * 1000.0

    def noop(self) -> int:
        return self.rank

    def close(self) -> bool:
        if self.world > 1 and self.group_ready:
            import torch.distributed as dist

            try:
                dist.destroy_process_group()
            except Exception:
                pass
        return True


# -- the driver's view of the group -----------------------------------------------------------------
class TrainerGroup:
    """N `TrainerWorker` actors in one placement group (PACK) and one process group. Duck-types what
    `TrainerLoop` uses of a `Trainer` (step, version, step_count, last, tokens_trained, use_lora)."""

    def __init__(self, cfg: Any, model_path: str, *, workers: int, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 step_timeout_s: float = 600.0, start_timeout_s: float = 300.0, max_restarts: int = 3,
                 name_prefix: str = ""):
        from clawloop.distributed.placement import reserve

        self.cfg, self.tc, self.model_path = cfg, cfg.train, str(model_path)
        self.world = int(workers)
        self.name_prefix = name_prefix
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.step_timeout_s, self.start_timeout_s, self.max_restarts = step_timeout_s, start_timeout_s, max_restarts
        self.use_lora = bool(cfg.train.use_lora)
        self.reward_history: deque[float] = deque(maxlen=cfg.train.baseline_window)
        self.rewards_observed = False
        self.version = 0
        self.step_count = 0
        self.tokens_trained = 0
        self.last: dict[str, float] = {}
        self.restarts = 0
        self.state = "starting"
        self.last_error = ""
        self.workers: list[Any] = []
        self.infos: list[dict[str, Any]] = []
        self.pg = reserve(self.world, num_cpus, num_gpus, "PACK", start_timeout_s, "trainer actor")
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def from_config(cls, cfg: Any) -> "TrainerGroup":
        from clawloop.distributed.router import actor_prefix
        from clawloop.naming import model_path

        r = cfg.ray
        return cls(cfg, model_path(cfg), workers=r.trainer_workers, num_cpus=r.trainer_num_cpus if r.trainer_num_cpus >= 0 else 1.0,
                   num_gpus=r.trainer_num_gpus, step_timeout_s=r.step_timeout_s, start_timeout_s=r.start_timeout_s,
                   max_restarts=r.max_restarts, name_prefix=actor_prefix(cfg))

    def ray_name(self, rank: int) -> str:
        return f"{self.name_prefix}trainer-{rank}" + (f"-r{self.restarts}" if self.restarts else "")

    def _start(self) -> None:
        import ray

        from clawloop.distributed.placement import in_bundle

        cls = ray.remote(TrainerWorker)
        self.workers = []
        for rank in range(self.world):
            opts = in_bundle(dict(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_restarts=0,
                                  max_concurrency=2), self.pg, rank)
            if self.name_prefix:  # a restarted group's actors get new names (the old ones may not be gone yet)
                opts["name"] = self.ray_name(rank)
            self.workers.append(cls.options(**opts).remote(self.cfg, self.model_path, rank, self.world))
        self.infos = self._get([w.info.remote() for w in self.workers], self.start_timeout_s)
        if self.world > 1:
            addr, port = self._get([self.workers[0].endpoint.remote()], self.start_timeout_s)[0]
            self._get([w.init_group.remote(addr, port, self.step_timeout_s) for w in self.workers],
                      self.start_timeout_s)
        self._set_counters()
        self.state = "up"
        log.info("trainer group up: %d worker(s) on %s", self.world,
                 ", ".join(sorted({i["node_ip"] for i in self.infos})))

    def _get(self, refs: list[Any], timeout: float) -> list[Any]:
        """Every result, or WorkerLost as soon as one call fails or the time is up (the others may be
        stuck in a collective waiting for the failed rank)."""
        import ray

        pending = list(refs)
        deadline = time.monotonic() + timeout
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise WorkerLost(f"no answer from {len(pending)} trainer worker(s) within {timeout:.0f} s")
            try:
                ray.get(ready[0])
            except Exception as e:
                raise WorkerLost(f"{type(e).__name__}: {str(e).splitlines()[0][:300]}") from e
        return ray.get(list(refs))

    def _set_counters(self) -> None:
        self._get([w.set_counters.remote(self.version, self.step_count, self.tokens_trained) for w in self.workers],
                  self.start_timeout_s)

    # what TrainerLoop calls
    def observe_reward(self, s: Sample) -> None:
        """`Trainer.observe_reward` on the driver: the window goes to every rank with each step."""
        Trainer.observe_reward(self, s)  # type: ignore[arg-type]

    def step(self, samples: list[Sample], served_version: int | None = None) -> dict[str, float]:
        import ray

        if self.state != "up":
            raise WorkerLost(f"the trainer group is {self.state}")
        ref = ray.put(samples)
        hist = list(self.reward_history) if self.rewards_observed else None
        try:
            stats = self._get([w.step.remote(ref, served_version, hist) for w in self.workers],
                              self.step_timeout_s)[0]
        except WorkerLost as e:
            self.state, self.last_error = "down", str(e)
            raise
        if not stats.get("train/skipped_step"):
            self.step_count = int(stats["train/step"])
            self.version = int(stats["train/policy_version"])
            self.tokens_trained += int(stats.get("train/tokens", 0))
        self.last = stats
        return stats

    def served_weights_ref(self) -> Any:
        """An object ref (owned by this process) of rank 0's packed full weights, checked to exist."""
        weights, ok = self.workers[0].served_weights.options(num_returns=2).remote()
        self._get([ok], self.step_timeout_s)
        return weights

    def publish_payload(self, adapters: bool) -> Any:
        """Rank 0's weights in this process: its LoRA adapter when the engine takes adapters and the
        trainer trains one, else the merged full state dict (for engines that are not actors)."""
        import ray

        from clawloop.distributed.weights import unpack

        if self.use_lora and adapters:
            return self._get([self.workers[0].lora_adapter.remote()], self.step_timeout_s)[0]
        return unpack(ray.get(self.served_weights_ref(), timeout=self.step_timeout_s))

    def save(self, save_dir: str | Path, cursor: int, extra: dict[str, Any], pending: list[Sample] | None) -> Path:
        return Path(self._get([self.workers[0].save.remote(str(save_dir), cursor, extra, pending)],
                              self.step_timeout_s)[0])

    def load(self, path: str | Path) -> dict[str, Any]:
        state = self._get([w.load.remote(str(path)) for w in self.workers], self.start_timeout_s)[0]
        self.step_count, self.version = int(state["step"]), int(state["policy_version"])
        self.tokens_trained = int(state.get("tokens_trained", 0))
        return state

    def load_weights(self, ref: Any) -> None:
        self._get([w.load_weights.remote(ref) for w in self.workers], self.start_timeout_s)

    def set_version(self, version: int) -> None:
        self.version = int(version)
        self._set_counters()

    def fingerprints(self) -> list[float]:
        return self._get([w.fingerprint.remote() for w in self.workers], self.start_timeout_s)

    def check(self, timeout: float = 10.0) -> None:
        """Liveness: every worker answers (raises WorkerLost otherwise)."""
        if self.state != "up":
            raise WorkerLost(f"the trainer group is {self.state}")
        try:
            self.infos = self._get([w.info.remote() for w in self.workers], timeout)
        except WorkerLost as e:
            self.state, self.last_error = "down", str(e)
            raise

    def restart(self, why: str) -> None:
        """New actors and a new process group in the same placement group (the caller loads weights)."""
        import ray

        self.state, self.last_error = "restarting", why
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:
                pass
        if self.restarts >= self.max_restarts:
            self.state = "failed"
            raise RuntimeError(f"trainer group: given up after {self.restarts} restarts (last: {why})")
        self.restarts += 1
        log.warning("trainer group: restarting (restart %d of %d): %s", self.restarts, self.max_restarts, why)
        self._start()

    def health(self) -> list[dict[str, Any]]:
        out = []
        for rank in range(self.world):
            info = self.infos[rank] if rank < len(self.infos) else {}
            out.append({"name": f"trainer-{rank}", "role": "trainer", "state": self.state, "rank": rank,
                        "node_id": info.get("node_id", ""), "node_ip": info.get("node_ip", ""),
                        "pid": info.get("pid"), "device": info.get("device"), "restarts": self.restarts,
                        "policy_version": self.version, "step": self.step_count,
                        "ray_name": self.ray_name(rank) if self.name_prefix else None,
                        "resources": {k: float(v) for k, v in (("CPU", self.num_cpus), ("GPU", self.num_gpus)) if v > 0},
                        "last_error": self.last_error or None})
        return out

    def shutdown(self) -> None:
        import ray

        from clawloop.distributed.placement import release

        for w in self.workers:
            try:
                ray.get(w.close.remote(), timeout=10)
            except Exception:
                pass
        release(self.workers, self.pg)
        self.workers, self.pg = [], None
        if self.state != "failed":
            self.state = "stopped"


# -- the loop in the driver -------------------------------------------------------------------------
class RayTrainerLoop(TrainerLoop):
    """`TrainerLoop` over a `TrainerGroup`: the same cursor, batching, publishing and checkpoint
    rules; steps, publishes and checkpoints go through the actors; worker failures recover."""

    def __init__(self, cfg: Any, group: TrainerGroup, store: Store | None, engine: Any | None, judge_name: str,
                 **kw: Any):
        super().__init__(cfg, group, store, engine, judge_name, **kw)  # type: ignore[arg-type]
        self.group = group
        self._taken: tuple[list[Sample], list[int], int] | None = None
        self._last_check = time.monotonic()
        self.check_every_s = max(5.0, 5 * cfg.ray.health_interval_s)
        self.recoveries: list[dict[str, Any]] = []

    def resume(self) -> None:
        from clawloop.trainer.checkpoint import load_pending_samples, resolve_checkpoint

        path = resolve_checkpoint(self.tc.resume_from_checkpoint, self.save_dir)
        if path is None:
            return
        state = self.group.load(path)
        self._restore(state, path)
        self.resumed_from = str(path)
        log.info("resumed from %s: step %d, policy v%d, cursor %d", path, self.group.step_count, self.group.version,
                 self.cursor)
        if self.buffer is not None:
            self.pending = load_pending_samples(path)

    def _restore(self, state: dict[str, Any], path: Path) -> None:
        self.cursor = self.read_cursor = int(state.get("cursor", 0))
        self.pending, self.pending_ids = [], []
        self.newest_version = max(self.newest_version, int(state.get("newest_version", 0)))
        self._saved_cursor = -1
        self._save_cursor()

    def take_batch(self) -> list[Sample]:
        self._taken = (list(self.pending), list(self.pending_ids), self.cursor)
        return super().take_batch()

    def run_once(self) -> bool:
        if time.monotonic() - self._last_check > self.check_every_s:
            self._last_check = time.monotonic()
            try:
                self.group.check()
            except WorkerLost as e:
                self._taken = (list(self.pending), list(self.pending_ids), self.cursor)
                self._recover(e)
        return super().run_once()

    def train_step(self, batch: list[Sample], served: int | None) -> dict[str, float]:
        try:
            return super().train_step(batch, served)
        except WorkerLost as e:
            self._recover(e)
            return {"train/skipped_step": 1.0}

    def _recover(self, e: BaseException) -> None:
        from clawloop.trainer.checkpoint import load_pending_samples, resolve_checkpoint

        log.error("trainer group failed: %s", e)
        t0 = time.perf_counter()
        self.group.restart(str(e))
        served = self.engine.policy_version if self.engine is not None else self.newest_version
        path = resolve_checkpoint("", self.save_dir)
        record: dict[str, Any] = {"error": str(e), "served_version": served}
        if path is not None:
            try:
                state = self.group.load(path)
            except Exception:  # a checkpoint this group cannot load: no step may run on other weights
                self.group.state = "failed"
                raise
            self._restore(state, path)
            if self.buffer is not None:
                self.pending = load_pending_samples(path)
            record.update(source=str(path), checkpoint_version=int(state["policy_version"]), cursor=self.cursor)
            log.warning("trainer group resumed from %s (v%d, cursor %d)", path, state["policy_version"], self.cursor)
        else:
            ref = self.engine.weights_ref if isinstance(self.engine, ReadsObjectStore) else None
            if ref is not None and not self.group.use_lora and not isinstance(ref, str):
                self.group.load_weights(ref)
                record["source"] = "served weights"
            else:
                record["source"] = "base weights"
                if served > 0:
                    log.warning("trainer group restarted with no checkpoint: training continues from the base "
                                "weights (use --save-interval to keep a checkpoint)")
            if self._taken is not None:  # the batch that failed goes back
                self.pending, self.pending_ids, self.cursor = self._taken
        # the next publish is newer than anything served, whatever the checkpoint's own version was
        self.group.set_version(max(self.group.version, served))
        record["version"] = self.group.version
        record["recover_s"] = time.perf_counter() - t0
        self.recoveries.append(record)

    def publish_payload(self) -> Any:
        if isinstance(self.engine, ReadsObjectStore):  # engine actors: they read the object store themselves
            return self.group.served_weights_ref()
        # the vLLM engine writes the weights to DATA_DIR/weights/vN for its servers
        return self.group.publish_payload(isinstance(self.engine, AcceptsLora) and self.engine.accepts_lora_adapters)

    def checkpoint(self) -> Path:
        p = self.group.save(self.save_dir, self.cursor, {"newest_version": self.newest_version},
                            self.pending if self.buffer is not None else None)
        self.counts["checkpoints"] += 1
        return p

    def stop(self, checkpoint: bool = True) -> None:
        try:
            super().stop(checkpoint=checkpoint and self.group.state == "up")
        except Exception as e:  # a group that died at shutdown: the latest checkpoint stands
            log.error("trainer group: no checkpoint at shutdown: %s", e)

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out["train/world_size"] = float(self.group.world)
        out["train/group_restarts"] = float(self.group.restarts)
        return out
