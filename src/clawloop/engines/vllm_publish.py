"""Full-weight publishes to vLLM servers on this machine through shared memory.

    images = WeightImages(root, model_dir_has_untied_head)
    staged = images.stage(state_dict, version)     # serialize + transfer: one copy into /dev/shm
    manifest = staged.manifest()                   # what changed, for the worker extension
    ... every replica: pause -> clawloop_load_weights(manifest) + version + cache reset -> resume
    images.commit(staged)                          # now current; the image before it is deleted

The publish path it replaces wrote a safetensors folder per version and had every replica
`reload_weights(weights_path)` from it: a clone of the state dict, safetensors' own copy, a file
write, then inside the pause a read of the files and a reload of every tensor.

Here the trainer's tensors are copied once into one anonymous shared-memory file (`memfd`:
memory, no disk, gone when clawloop exits, even by SIGKILL), each tensor at a 64-byte aligned
offset; vLLM's worker extension (`vllm_worker/clawloop_weight_sync.py`) opens it as
`/proc/<clawloop pid>/fd/<fd>`, maps it and loads in place. While copying, each tensor is
compared with the served image: a *group* (a decoder layer `…layers.N`, else the tensor's
module: embedding, final norm, head) whose tensors are all bit-equal is not sent. Staging runs
before the pause, off the event loop, so serving goes on while the bytes move; the pause covers
the in-memory load only. The load is not split further with serving resumed between parts: a
request decoding between two parts would run on a model that is neither version, and its tokens
could not carry one version each.

Tied-embedding models are served from an untied copy (`untied_model_dir`), so every publish
carries the head as its own tensor.

The current image stays open: a replica that restarts is caught up from it. Each image is a
whole model (unchanged groups are copied too), so one file always suffices; two exist during a
publish. Replicas on other machines (Ray) cannot open it and get files, as before.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

ALIGN = 64
_LAYER = re.compile(r"^(.*?\.\d+)\.")


def group_of(name: str) -> str:
    """The group a tensor is sent with: up to its first numeric component (a decoder layer,
    `model.layers.3`), else its module (`model.embed_tokens`, `lm_head`)."""
    m = _LAYER.match(name)
    return m.group(1) if m else name.rpartition(".")[0] or name


@dataclass
class Staged:
    """One version's image: its file, every tensor's place in it, and which groups changed."""

    version: int
    path: str
    entries: list[list[Any]]
    """[name, dtype, shape, offset, nbytes] per tensor, in the order staged."""
    groups: dict[str, list[int]]
    """group -> indices into `entries`."""
    changed: set[str]
    bytes_total: int
    stage_s: float
    """Serialize + transfer: copying (and comparing) every tensor into the file."""

    @property
    def bytes_changed(self) -> int:
        return sum(self.entries[i][4] for g in self.changed for i in self.groups[g])

    def manifest(self, everything: bool = False) -> str:
        """What `clawloop_load_weights` gets: the file and the tensors to load (changed groups only,
        scoped to their modules, unless `everything` or every group changed)."""
        if everything or len(self.changed) == len(self.groups):
            return json.dumps({"path": self.path, "tensors": self.entries, "scopes": None})
        idx = sorted(i for g in self.changed for i in self.groups[g])
        return json.dumps({"path": self.path, "tensors": [self.entries[i] for i in idx],
                           "scopes": sorted(self.changed)})


def shared_memory_available() -> bool:
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


@dataclass
class _Slot:
    fd: int
    size: int = 0
    map: mmap.mmap | None = None

    @property
    def path(self) -> str:
        return _path(self.fd)

    def bytes(self) -> Any:
        import numpy as np

        return np.frombuffer(self.map, dtype=np.uint8)


@dataclass
class WeightImages:
    """The staged weight images of one engine (see the module docstring): two memfds used in turn,
    each mapped once, so a publish writes into pages that are already there and mapped (first-touch
    page faults cost more than the copy itself: 4-16 ms against 0.5 ms for 5 MB, measured here)."""

    current: Staged | None = None
    slots: list[_Slot] = field(default_factory=list)

    def _slot(self, nbytes: int) -> _Slot:
        busy = self.current.path if self.current is not None else None
        for slot in self.slots:
            if slot.path != busy:
                break
        else:
            slot = _Slot(os.memfd_create("clawloop-weights", os.MFD_CLOEXEC))
            self.slots.append(slot)
        if slot.size != nbytes:
            if slot.map is not None:
                slot.map.close()
            os.ftruncate(slot.fd, nbytes)  # growing adds zero pages; shrinking frees the tail
            slot.size = nbytes
            slot.map = mmap.mmap(slot.fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        return slot

    def stage(self, weights: Mapping[str, Any], version: int) -> Staged:
        """Copy `weights` (CPU or device tensors) into a new image, comparing each with the current one.
        Bytes move with numpy (one thread, memcpy/memcmp): torch's copy on a busy machine wakes its
        OpenMP pool for every tensor (measured 40x slower for a 5 MB model on 2 loaded cores)."""
        import numpy as np
        import torch

        t0 = time.perf_counter()
        layout, offset = [], 0
        for name, t in weights.items():
            nbytes = t.numel() * t.element_size()
            layout.append((name, t, offset, nbytes))
            offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
        prev = self.current
        prev_at = {e[0]: e for e in prev.entries} if prev is not None else {}
        prev_buf = next(s.bytes() for s in self.slots if s.path == prev.path) if prev is not None else None
        entries: list[list[Any]] = []
        groups: dict[str, list[int]] = {}
        changed: set[str] = set()
        slot = self._slot(max(offset, 1))
        buf = slot.bytes()
        with torch.no_grad():
            for name, t, off, nbytes in layout:
                src = t.detach()
                if src.device.type != "cpu":
                    src = src.to("cpu")
                src = src.contiguous()
                dtype = str(src.dtype).removeprefix("torch.")
                shape = list(src.shape)
                new = buf[off:off + nbytes]
                if nbytes:
                    np.copyto(new, src.reshape(-1).view(torch.uint8).numpy())
                g = group_of(name)
                groups.setdefault(g, []).append(len(entries))
                entries.append([name, dtype, shape, off, nbytes])
                old = prev_at.get(name)
                if (old is None or prev_buf is None or old[1] != dtype or old[2] != shape
                        or not np.array_equal(prev_buf[old[3]:old[3] + nbytes], new)):
                    changed.add(g)
        if prev is not None:
            changed |= set(g for g in prev.groups if g not in groups)  # a group that went away: reload all
        return Staged(version, slot.path, entries, groups, changed, offset, time.perf_counter() - t0)

    def commit(self, staged: Staged) -> None:
        """`staged` is served now (the slot of the image before it is written next)."""
        self.current = staged

    def forget(self) -> None:
        """The engine serves something else now (files, an adapter): nothing to compare with or
        catch up from."""
        self.current = None

    def close(self) -> None:
        self.current = None
        for slot in self.slots:
            if slot.map is not None:
                try:
                    slot.map.close()
                except BufferError:  # a numpy view is still alive: the mapping goes with it
                    pass
            os.close(slot.fd)
        self.slots.clear()


def _path(fd: int) -> str:
    return f"/proc/{os.getpid()}/fd/{fd}"




class ImageLoader:
    """A replica's side of a publish from an image, run from threads of its own with blocking
    clients: pause(keep) -> at once {`clawloop_load_weights`, tag the version, reset the prefix
    cache} -> resume. Off the serving event loop on purpose: while requests are frozen, each of
    these calls would otherwise also wait for the loop to get round to it between stream chunks.
    While paused nothing is scheduled, so the three calls in the middle may run in any order."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._clients: list[Any] = []
        self._pool = ThreadPoolExecutor(self.INNER, thread_name_prefix="clawloop-publish")
        self.outer = ThreadPoolExecutor(self.OUTER, thread_name_prefix="clawloop-publish-outer")
        """The engine's side of a publish (staging the image, `load` per replica): threads of its own."""

    INNER, OUTER = 3, 8

    def _client(self) -> Any:
        import httpx

        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0))
            self._clients.append(c)
        return c

    def warm(self, url: str) -> float:
        """Open every publish thread's client and a connection to the replica at `url` now, so that the
        first publish does not pay for them while requests are frozen (each client costs an SSL
        context, tens of ms on a busy CPU; the first publish's pause was 1.5-3x the others' without
        this). Returns the seconds it took. A thread pool starts its threads as jobs arrive, and a
        barrier holds each job until all have one, so every thread of both pools gets its own."""
        t0 = time.perf_counter()
        for pool, n in ((self._pool, self.INNER), (self.outer, self.OUTER)):
            barrier = threading.Barrier(n)

            def one(barrier: threading.Barrier = barrier) -> None:
                try:
                    barrier.wait(timeout=30)
                except threading.BrokenBarrierError:
                    pass
                try:
                    self._client().get(url + "/health", timeout=5.0)
                except Exception:  # a replica that does not answer now is the health monitor's concern
                    pass

            for f in [pool.submit(one) for _ in range(n)]:
                f.result()
        return time.perf_counter() - t0

    def _post(self, url: str, path: str, *, json: Any = None, params: Any = None, timeout: float = 60.0) -> Any:
        resp = self._client().post(url + path, json=json, params=params, timeout=timeout)
        if resp.status_code != 200:
            raise RuntimeError(f"{url}{path}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json()
        except ValueError:
            return {}

    def load(self, url: str, manifest: str, version: int) -> dict[str, Any]:
        """Serve the image's weights as `version` on the replica at `url`; resumes even on failure.
        Returns the worker's report plus this side's times (s) and whether the cache reset was done."""
        t0 = time.perf_counter()
        self._post(url, "/pause", params={"mode": "keep", "clear_cache": "false"})
        t1 = time.perf_counter()
        try:
            calls = [self._pool.submit(self._post, url, "/collective_rpc", timeout=600, json={
                         "method": "clawloop_load_weights", "kwargs": {"manifest": manifest}}),
                     self._pool.submit(self._post, url, "/update_weight_version",
                                       json={"new_version": str(version)}),
                     self._pool.submit(self._post, url, "/reset_prefix_cache",
                                       params={"reset_running_requests": "true"})]
            res, _, reset = [c.result() for c in calls]
            done = (res.get("results") or [None])[0] if isinstance(res, dict) else None
            if not isinstance(done, dict):
                raise RuntimeError(f"clawloop_load_weights: {res}")
        finally:
            t2 = time.perf_counter()
            self._post(url, "/resume")
        return {**done, "pause_call_s": t1 - t0, "paused_work_s": t2 - t1, "pause_s": time.perf_counter() - t0,
                "reset_ok": bool(reset.get("success", True)) if isinstance(reset, dict) else True}

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.outer.shutdown(wait=False)
        for c in self._clients:
            c.close()
        self._clients.clear()


def memcpy_gb_s(mib: int = 256, repeat: int = 5) -> float:
    """This machine's single-thread copy bandwidth (numpy `copyto` of `mib` MiB, best of `repeat`),
    GB/s: the limit a publish's serialize + transfer step is measured against."""
    import numpy as np

    src = np.ones(mib * 2**20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return src.nbytes / best / 1e9


def is_tied(model_path: str) -> bool:
    """Whether the model ties its head to the embeddings."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    return bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", False)))


def untied_model_dir(model_path: str, weights_dir: Path) -> str:
    """The folder to start vLLM on. vLLM 0.32's in-place `reload_weights` re-creates the
    embedding but leaves a *tied* lm_head on the old values (measured: logprobs matched a
    model with new embeddings and the old head, 1e-6). So for a tied model vLLM serves an
    untied copy: the same files (symlinked), `tie_word_embeddings: false`, and the head
    written out as its own tensor; every publish then carries `lm_head.weight` explicitly.
    Costs one vocab x hidden matrix of engine memory, nothing on the trainer side."""
    if not is_tied(model_path):
        return model_path
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(model_path).resolve()
    out = weights_dir / "base-untied"
    stamp = out / ".source"
    if stamp.exists() and stamp.read_text() == str(src):
        return str(out)
    shutil.rmtree(out, ignore_errors=True)
    tmp = weights_dir / f".base-untied.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    embed = None
    for f in sorted(src.iterdir()):
        if f.name == "config.json" or not f.is_file():
            continue
        (tmp / f.name).symlink_to(f)
        if f.suffix == ".safetensors" and embed is None:
            with safe_open(str(f), "pt") as h:
                key = next((k for k in h.keys() if k.endswith("embed_tokens.weight")), None)
                if key is not None:
                    embed = h.get_tensor(key)
    if embed is None:
        raise RuntimeError(f"{src}: tied embeddings but no *embed_tokens.weight in its safetensors")
    save_file({"lm_head.weight": embed.contiguous()}, str(tmp / "zz-lm_head.safetensors"),
              metadata={"format": "pt"})
    index = src / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"]["lm_head.weight"] = "zz-lm_head.safetensors"
        (tmp / index.name).unlink()
        (tmp / index.name).write_text(json.dumps(data))
    cfg = json.loads((src / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"]["tie_word_embeddings"] = False
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / ".source").write_text(str(src))
    os.replace(tmp, out)
    return str(out)
