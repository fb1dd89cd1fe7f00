"""Where a full-weight publish to a vLLM server spends its time, and at what bytes/s.

Starts one vLLM replica through clawloop's `VLLMEngine` (`.venv-vllm`), keeps `--streams`
streaming generations running against it, and publishes the model's weights (every tensor
scaled a little, so every group changed) `--publishes` times per path:

- files: safetensors under DATA_DIR/weights/vN, then pause -> `reload_weights(path)` -> tag ->
  reset prefix cache -> resume (what attached servers get; every publish before this change);
- image: one copy into a shared-memory image, then pause -> {the worker extension loads the
  image, tag, reset} at once -> resume;
- image, one layer: the same with only one decoder layer changed (send only what changed).

Per path: the publish stall (publish called -> new requests get the version), the part before
the pause (serialize + transfer), the pause (requests frozen), inside it the worker's own load
time, bytes/s of each against this machine's single-thread memcpy, and failed generations
(goal 0). Prints a table and one JSON line.

    .venv/bin/python bench/vllm_publish.py --model /tmp/rand4x128 [--publishes 10] [--streams 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from clawloop.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from clawloop.engines.hf import load_state_dict_from_dir  # noqa: E402
from clawloop.engines.vllm import VLLMEngine, find_vllm_python  # noqa: E402
from clawloop.engines.vllm_publish import memcpy_gb_s  # noqa: E402


async def load(engine: VLLMEngine, stop: asyncio.Event, tally: dict) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        req = GenerationRequest(prompt_ids=[1 + (i % 50), 7, 9, 11], params=SamplingParams(max_tokens=32, seed=i),
                                request_id=f"load-{i}")
        try:
            async for ev in engine.generate(req):
                if ev.finish_reason is not None:
                    tally["ok"] += 1
        except Exception as e:  # noqa: BLE001
            tally["failed"] += 1
            tally["errors"].append(repr(e)[:200])


async def run(a: argparse.Namespace) -> dict:
    data = tempfile.mkdtemp(prefix="clawloop-bench-publish-")
    engine = VLLMEngine(a.model, replicas=1, python=find_vllm_python(), data_dir=data, max_model_len=1024,
                        keep_weights=2)
    base = load_state_dict_from_dir(a.model)
    nbytes = sum(t.numel() * t.element_size() for t in base.values())
    await engine.start()
    stop, tally = asyncio.Event(), {"ok": 0, "failed": 0, "errors": []}
    tasks = [asyncio.create_task(load(engine, stop, tally)) for _ in range(a.streams)]
    rows: dict[str, list[dict]] = {}
    layer = sorted({k.rsplit(".layers.", 1)[1].split(".")[0] for k in base if ".layers." in k})[0]
    try:
        await asyncio.sleep(3)  # the load is running
        version = engine.policy_version
        for path in ("files", "image", "image, one layer"):
            engine.shared_memory = path != "files"
            for k in range(a.publishes + 1):  # the first of each path warms it up, not reported
                version += 1
                scale = 1.0 + 0.001 * version
                sd = ({n: t * scale for n, t in base.items()} if path != "image, one layer" else
                      {n: (t * scale if f".layers.{layer}." in n else t) for n, t in base.items()})
                engine.stats_.extra.clear()
                t0 = time.perf_counter()
                await engine.publish(sd, version)
                stall = time.perf_counter() - t0
                x = engine.stats_.extra
                row = {"stall_s": stall, "pause_s": engine.stats_.last_pause_s,
                       "before_pause_s": stall - engine.stats_.last_pause_s,
                       "bytes": x.get("publish_bytes_sent", nbytes)}
                for key in ("publish_stage_s", "publish_load_s", "publish_pause_call_s", "publish_paused_work_s"):
                    if key in x:
                        row[key.removeprefix("publish_")] = x[key]
                if k:
                    rows.setdefault(path, []).append(row)
                assert engine.policy_version == version
                await asyncio.sleep(a.gap_s)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.stop()
        shutil.rmtree(data, ignore_errors=True)
    return {"rows": rows, "model_bytes": nbytes, "tally": tally}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model dir vLLM can load")
    ap.add_argument("--publishes", type=int, default=10, help="publishes per path (after one warm-up)")
    ap.add_argument("--streams", type=int, default=4, help="streaming generations kept running")
    ap.add_argument("--gap-s", type=float, default=0.5, help="pause between publishes")
    a = ap.parse_args(argv)
    bw = memcpy_gb_s()
    print(f"memcpy (numpy copyto, 256 MiB, one thread): {bw:.2f} GB/s", flush=True)
    out = asyncio.run(run(a))
    med = lambda rows, k: statistics.median(r[k] for r in rows) if rows and k in rows[0] else float("nan")  # noqa: E731
    print(f"\nmodel {out['model_bytes'] / 1e6:.1f} MB; {a.streams} streams running; medians over {a.publishes} "
          "publishes (max stall in brackets)")
    print(f"{'path':<18} {'stall ms':>14} {'serialize+transfer':>19} {'pause ms':>9} {'in pause: load':>15} "
          f"{'sent MB':>8} {'GB/s staged':>11} {'GB/s loaded':>11}")
    summary = {}
    for path, rows in out["rows"].items():
        sent = med(rows, "bytes")
        stage = med(rows, "stage_s")
        loaded = med(rows, "load_s")
        before = med(rows, "before_pause_s")
        staged_gbs = out["model_bytes"] / (stage if stage == stage else before) / 1e9
        loaded_gbs = sent / loaded / 1e9 if loaded == loaded else float("nan")
        s = {"stall_ms": med(rows, "stall_s") * 1e3, "stall_max_ms": max(r["stall_s"] for r in rows) * 1e3,
             "before_pause_ms": before * 1e3, "stage_ms": stage * 1e3, "pause_ms": med(rows, "pause_s") * 1e3,
             "pause_max_ms": max(r["pause_s"] for r in rows) * 1e3, "pause_call_ms": med(rows, "pause_call_s") * 1e3,
             "paused_work_ms": med(rows, "paused_work_s") * 1e3, "load_ms": loaded * 1e3, "sent_mb": sent / 1e6,
             "staged_gb_s": staged_gbs, "loaded_gb_s": loaded_gbs}
        summary[path] = {k: round(v, 2) for k, v in s.items()}
        print(f"{path:<18} {s['stall_ms']:>7.1f} ({s['stall_max_ms']:>5.0f}) {s['before_pause_ms']:>19.1f} "
              f"{s['pause_ms']:>9.1f} {s['load_ms']:>15.1f} {s['sent_mb']:>8.2f} {staged_gbs:>11.2f} {loaded_gbs:>11.2f}")
    t = out["tally"]
    print(f"\ngenerations: {t['ok']} finished, {t['failed']} failed (goal 0) {t['errors'][:2]}")
    print(json.dumps({"bench": "vllm_publish", "model": a.model, "memcpy_gb_s": round(bw, 2),
                      "model_bytes": out["model_bytes"], "streams": a.streams, "paths": summary,
                      "generations_ok": t["ok"], "generations_failed": t["failed"]}))
    return 0 if t["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
