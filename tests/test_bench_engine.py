"""The bench engine (`--backend bench`) and the stand-in vLLM server (bench/vllm_stub.py) through a real
gateway with capture: what a client streams, what it gets whole and what the store keeps are the
engine's ids, token for token, also when one engine step carries several tokens."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import httpx
import pytest

from conftest import ServerThread, make_cfg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

Q = [{"role": "user", "content": "Tell me about the gateway."}]


class Served:
    """A gateway (capture on, its own SQLite store) that starts and stops `engine` itself."""

    def __init__(self, engine, model_dir, data_dir, **flags):
        from clawloop.gateway import create_app
        from clawloop.naming import open_store

        self.cfg = make_cfg(model_dir, data_dir, **flags)
        self.store = open_store(self.cfg)
        self.app = create_app(self.cfg, engine, self.store)
        self.server = ServerThread(self.app).start()
        self.url = self.server.url

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)

    def stop(self):
        self.server.stop()
        self.store.close()


class StubThread:
    """bench/vllm_stub.py on its own event loop in a thread of this process."""

    def __init__(self, model_dir, tokens_per_step: int):
        import vllm_stub

        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.stub = None

        def on_ready(server, stub):
            self.server, self.stub = server, stub
            self.port = server.sockets[0].getsockname()[1]
            self.ready.set()

        def run():
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(vllm_stub.serve(str(model_dir), 0, 0.0, tokens_per_step, 0, on_ready))
            except asyncio.CancelledError:
                pass

        self.thread = threading.Thread(target=run, daemon=True, name="vllm-stub")
        self.thread.start()
        assert self.ready.wait(30), "the stub did not start"
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.loop.call_soon_threadsafe(self.server.close)
        for task in asyncio.all_tasks(self.loop):
            self.loop.call_soon_threadsafe(task.cancel)
        self.thread.join(10)


def passage_ids(engine, n):
    return [engine.passage[k % len(engine.passage)] for k in range(n)]


@pytest.fixture
def bench_engine(random_model_dir):
    from clawloop.engines.bench import BenchEngine

    return BenchEngine(random_model_dir, tokens_per_step=3)


def stream(url, session, **body):
    """(streamed ids, streamed text, number of content chunks)."""
    ids, text, chunks = [], "", 0
    with httpx.stream("POST", url + "/v1/chat/completions", headers={"X-Session-Id": session}, timeout=30,
                      json={"messages": Q, "stream": True, "return_token_ids": True, **body}) as r:
        assert r.status_code == 200
        import json

        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for ch in json.loads(line[6:])["choices"]:
                ids += ch.get("token_ids") or []
                if ch["delta"].get("content"):
                    text += ch["delta"]["content"]
                    chunks += 1
    return ids, text, chunks


def check_turn(store, session, ids, engine, text):
    store.flush()
    (t,) = store.session_turns(session)
    assert t.response_ids == ids
    assert t.response_logprobs == pytest.approx([engine.logprob(k) for k in range(len(ids))])
    assert t.response_text == text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert t.trainable and t.policy_version == 0


def test_bench_engine_streams_token_exact_with_capture(bench_engine, random_model_dir, tmp_path):
    g = Served(bench_engine, random_model_dir, tmp_path / "data")
    try:
        ids, text, chunks = stream(g.url, "b-stream", max_tokens=40)
        assert ids == passage_ids(bench_engine, 40)
        # three tokens per engine step reach the client as one chunk, not three
        assert 40 // 3 - 2 <= chunks <= 40 // 3 + 2, chunks
        check_turn(g.store, "b-stream", ids, bench_engine, text)
        r = g.client().chat.completions.create(model="m", messages=Q, max_tokens=25,
                                               extra_body={"return_token_ids": True, "logprobs": True},
                                               extra_headers={"X-Session-Id": "b-plain"})
        assert r.choices[0].model_extra["token_ids"] == passage_ids(bench_engine, 25)
        assert r.choices[0].finish_reason == "length"
        check_turn(g.store, "b-plain", passage_ids(bench_engine, 25), bench_engine, r.choices[0].message.content)
    finally:
        g.stop()


def test_bench_engine_stop_string_and_eos(random_model_dir, tmp_path):
    """A stop string inside a multi-token step: nothing past it is streamed or kept, exactly as when
    each token is its own step; `completion_tokens` ends the reply with the eos id."""
    from clawloop.engines.bench import BenchEngine

    kept = {}
    for per_step in (1, 4):
        eng = BenchEngine(random_model_dir, tokens_per_step=per_step, completion_tokens=30)
        g = Served(eng, random_model_dir, tmp_path / f"data{per_step}")
        try:
            ids, text, _ = stream(g.url, "stop", max_tokens=40, stop=["messages"])
            assert text == "The gateway renders the "
            g.store.flush()
            (t,) = g.store.session_turns("stop")
            assert t.response_ids == ids and t.response_text == text
            kept[per_step] = ids
            ids, text, _ = stream(g.url, "eos", max_tokens=64)
            assert len(ids) == 31 and ids[-1] == eng.tokenizer.eos_token_id
            assert ids[:30] == passage_ids(eng, 30)
        finally:
            g.stop()
    assert kept[1] == kept[4]


def test_vllm_engine_against_the_stub_token_exact(random_model_dir, tmp_path):
    """The vLLM engine's path (HTTPReplica, SSE parsing, the non-streamed call for a plain client)
    against bench/vllm_stub.py, with capture."""
    from clawloop.engines.bench import BenchEngine
    from clawloop.engines.vllm import VLLMEngine

    stub = StubThread(random_model_dir, tokens_per_step=2)
    ref = BenchEngine(random_model_dir)
    eng = VLLMEngine(random_model_dir, urls=[stub.url], data_dir=tmp_path / "data", health_interval_s=0.5)
    g = Served(eng, random_model_dir, tmp_path / "data", model__backend="vllm", model__engine_urls=[stub.url])
    try:
        ids, text, chunks = stream(g.url, "v-stream", max_tokens=30, top_logprobs=2, logprobs=True)
        assert ids == passage_ids(ref, 30)
        assert chunks <= 16, chunks  # two tokens per vLLM message
        check_turn(g.store, "v-stream", ids, ref, text)
        assert stub.stub.whole == 0
        r = g.client().chat.completions.create(model="m", messages=Q, max_tokens=21, logprobs=True, top_logprobs=2,
                                               extra_body={"return_token_ids": True},
                                               extra_headers={"X-Session-Id": "v-plain"})
        ch = r.choices[0]
        assert ch.model_extra["token_ids"] == passage_ids(ref, 21) and ch.finish_reason == "length"
        assert [e.logprob for e in ch.logprobs.content] == pytest.approx([ref.logprob(k) for k in range(21)])
        assert all(len(e.top_logprobs) == 2 for e in ch.logprobs.content)
        check_turn(g.store, "v-plain", passage_ids(ref, 21), ref, ch.message.content)
        assert stub.stub.whole == 1  # a plain client's request was one non-streamed vLLM call
    finally:
        g.stop()
        stub.stop()


def test_detokenizer_byte_level_fast_path_is_decode(random_model_dir):
    """The byte-level fast path releases, over a response, exactly what `decode` gives for its ids,
    pushed one at a time or several at once, random ids included (split multi-byte characters,
    special tokens)."""
    import random

    from transformers import AutoTokenizer

    from clawloop.gateway.render import Detokenizer

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 30))]
        d = Detokenizer(tok)
        assert d._bytes is not None  # the tiny model's tokenizer is byte-level: the fast path runs
        out, i = "", 0
        while i < len(ids):
            k = rng.choice([1, 1, 2, 3])
            out += d.push_many(ids[i:i + k])
            i += k
        out += d.flush()
        assert out == tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_stream_interval_coalesces_writes(bench_engine, random_model_dir, tmp_path):
    """--stream-interval-ms: the same ids and text, in fewer writes (each write holds several chunks)."""
    import socket

    g = Served(bench_engine, random_model_dir, tmp_path / "data", serve__stream_interval_ms=30.0)
    try:
        from clawloop.engines.bench import BenchEngine

        slow = BenchEngine(random_model_dir, step_ms=5)  # ~200 tokens/s: several per 30 ms
        g.app.state.gateway.engine = slow
        asyncio.run(slow.start())
        ids, text, _ = stream(g.url, "iv", max_tokens=60)
        assert ids == passage_ids(slow, 60) and text == slow.tokenizer.decode(ids)
        # count the socket reads it takes to receive the same stream raw: far fewer than 60
        s = socket.create_connection(("127.0.0.1", g.server.port))
        body = b'{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":60}'
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        reads, data = 0, b""
        while chunk := s.recv(65536):
            reads += 1
            data += chunk
        s.close()
        assert data.rstrip().endswith(b"0") and data.count(b"data: {") >= 60
        assert reads < 30, reads
    finally:
        g.stop()


class ClosingStub:
    """bench/vllm_stub.py's answers, but every kept-alive connection is closed by the server when its
    second request arrives, unanswered: the race of a server's keep-alive timeout with a client's reuse
    (vLLM's uvicorn closes idle connections after 5 s; its clock and the client's differ)."""

    def __init__(self, model_dir):
        import vllm_stub

        from clawloop.engines.bench import BenchEngine

        self.stub = vllm_stub.Stub(BenchEngine(model_dir))
        self.closed = self.answered = 0

    async def handle(self, reader, writer):
        import json

        from vllm_stub import respond

        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                hdr = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
                data = await reader.readexactly(int(hdr.get("content-length") or 0))
                if "/inference/v1/generate" not in line:
                    respond(writer, 200, b"{}")
                    await writer.drain()
                    continue
                if served:
                    self.closed += 1
                    return  # unanswered: the connection closes
                await self.stub.generate(json.loads(data), writer)
                served += 1
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


def test_a_kept_alive_connection_the_server_closed_is_not_a_failure(random_model_dir, tmp_path):
    """A generate call that meets a kept-alive connection the server closed before answering is sent
    again on a fresh one: the caller sees its tokens, the replica stays up and unsuspected."""
    from clawloop.engines.base import GenerationRequest, SamplingParams
    from clawloop.engines.vllm import VLLMEngine

    stub = ClosingStub(random_model_dir)

    async def run():
        await stub.stub.engine.start()
        server = await asyncio.start_server(stub.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        eng = VLLMEngine(random_model_dir, urls=[url], data_dir=tmp_path / "data", health_interval_s=60)
        await eng.start()
        try:
            outs = []
            for i in range(4):  # one after another: each reuses the connection the previous one left
                req = GenerationRequest([1, 2, 3], SamplingParams(max_tokens=5), f"r{i}", stream=bool(i % 2))
                outs.append([ev.token_id async for chunk in eng.generate_chunks(req) for ev in chunk
                             if ev.token_id is not None])
            return outs, eng.stats(), eng.health()
        finally:
            await eng.stop()
            server.close()

    outs, stats, health = asyncio.run(run())
    ref = stub.stub.engine
    assert outs == [passage_ids(ref, 5)] * 4
    assert stub.closed >= 3 and stub.answered == 4  # the server did close reused connections
    assert stats["engine/stale_connections"] == stub.closed
    (rep,) = health["replicas"]
    assert rep["state"] == "up" and rep["last_error"] is None
