"""The shared-memory weight images a full-weight vLLM publish goes through (`engines/vllm_publish.py`),
without vLLM: what is staged, what counts as changed, and that another process reads the bytes.
The publishes themselves, against real vLLM servers, are in test_vllm.py (`make test-vllm`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from clawloop.engines.vllm_publish import WeightImages, group_of, shared_memory_available

pytestmark = pytest.mark.skipif(not shared_memory_available(), reason="needs memfd and /proc (Linux)")


def _model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    sd = {f"model.layers.{i}.{m}.weight": torch.randn(16, 8, generator=g)
          for i in range(3) for m in ("self_attn.q_proj", "mlp.down_proj")}
    sd["model.embed_tokens.weight"] = torch.randn(32, 8, generator=g).to(torch.bfloat16)
    sd["model.norm.weight"] = torch.ones(8)
    sd["lm_head.weight"] = torch.randn(32, 8, generator=g)
    return sd


def _read(manifest: str) -> dict[str, torch.Tensor]:
    m = json.loads(manifest)
    with open(m["path"], "rb") as f:
        raw = f.read()
    return {name: torch.frombuffer(bytearray(raw[off:off + n]), dtype=getattr(torch, dt)).view(shape)
            for name, dt, shape, off, n in m["tensors"]}


def test_groups_are_decoder_layers_else_modules():
    assert group_of("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert group_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert group_of("lm_head.weight") == "lm_head"
    assert group_of("model.norm.weight") == "model.norm"


def test_only_changed_groups_are_sent_and_the_bytes_are_the_tensors():
    images = WeightImages()
    try:
        sd = _model()
        first = images.stage(sd, 1)
        assert first.changed == set(first.groups) and json.loads(first.manifest())["scopes"] is None
        back = _read(first.manifest())
        assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)  # bf16 too
        assert all(e[3] % 64 == 0 for e in first.entries)
        images.commit(first)

        same = images.stage(dict(sd), 2)  # nothing changed: nothing to send
        assert same.changed == set() and same.bytes_changed == 0 and same.path != first.path
        images.commit(same)

        sd["model.layers.1.mlp.down_proj.weight"] = sd["model.layers.1.mlp.down_proj.weight"] + 1e-3
        one = images.stage(sd, 3)
        assert one.changed == {"model.layers.1"}
        m = json.loads(one.manifest())
        assert m["scopes"] == ["model.layers.1"]
        assert sorted(t[0] for t in m["tensors"]) == ["model.layers.1.mlp.down_proj.weight",
                                                      "model.layers.1.self_attn.q_proj.weight"]
        assert one.bytes_changed == 2 * 16 * 8 * 4
        assert one.path == first.path  # two slots in turn: the one not being served is rewritten
        whole = _read(one.manifest(everything=True))  # what a restarted replica loads
        assert all(torch.equal(whole[k], sd[k]) for k in sd)
        images.commit(one)

        sd["model.layers.0.mlp.down_proj.weight"] = sd["model.layers.0.mlp.down_proj.weight"].to(torch.float64)
        assert "model.layers.0" in images.stage(sd, 4).changed  # a dtype change is a change
    finally:
        images.close()
    assert images.slots == [] and images.current is None


def test_another_process_reads_the_image_by_its_proc_path():
    images = WeightImages()
    try:
        sd = {"w.weight": torch.arange(6, dtype=torch.float32).view(2, 3)}
        staged = images.stage(sd, 1)
        name, dtype, shape, off, n = staged.entries[0]
        code = (f"import mmap, struct; f = open({staged.path!r}, 'rb'); "
                f"m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY); "
                f"print(list(struct.unpack('6f', m[{off}:{off + n}])))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    finally:
        images.close()


def test_the_loaders_threads_have_their_clients_and_connections_before_the_first_publish():
    """`ImageLoader.warm`: every thread a publish may run on (3 for the paused calls, 8 for the engine's
    side) opens its client and a connection at start, so the first publish's pause does not pay for
    them; later calls from those threads reuse them. A real HTTP server on loopback counts them."""
    import threading
    from concurrent.futures import wait
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from clawloop.engines.vllm_publish import ImageLoader

    seen: list[tuple[str, int]] = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _ok(self) -> None:
            seen.append((self.path, self.client_address[1]))
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = _ok

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    loader = ImageLoader()
    try:
        assert loader.warm(url) < 30
        n = ImageLoader.INNER + ImageLoader.OUTER
        assert len(loader._clients) == n and len(seen) == n
        assert len({port for _, port in seen}) == n  # a connection each
        # the paused calls run on the warmed threads: no new client, no new connection
        barrier = threading.Barrier(ImageLoader.INNER)

        def call() -> None:
            barrier.wait(timeout=10)
            loader._post(url, "/resume")

        wait([loader._pool.submit(call) for _ in range(ImageLoader.INNER)])
        assert len(loader._clients) == n
        assert {port for path, port in seen if path == "/resume"} <= {port for _, port in seen[:n]}
    finally:
        loader.close()
        srv.shutdown()
        srv.server_close()
