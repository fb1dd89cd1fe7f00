"""A stand-in vLLM server: the endpoints clawloop's vLLM engine calls, answered by the bench engine.

    .venv/bin/python bench/vllm_stub.py --model DIR --port 8100 [--step-ms 0] [--tokens-per-step 1]
    clawloop serve --backend vllm --engine-url http://127.0.0.1:8100 --model-path DIR

So the gateway's vLLM path (VLLMEngine, HTTPReplica, the replica set, the SSE parsing) is measured
with no model cost: `/inference/v1/generate` streams what `engines/bench.py` emits, one SSE message
per step, shaped as vLLM 0.32's `GenerateTokensStreamResponse` (`token_ids`, `logprobs.content` with
`token_id`/`logprob`/`rank`/`top_logprobs`, `weight_versions` on the last message; `data: [DONE]`);
`stream: false` gets one `GenerateTokensResponse` body. Also `/health`, `/update_weight_version`,
`/reset_prefix_cache`, `/pause`, `/resume`, `/collective_rpc` (accepted, nothing to do) and
`/v1/models`. Cancellation: a client that closes its connection stops its stream.

It is a keep-alive HTTP/1.1 server on bare asyncio (uvloop when present), so its own cost per token
is small next to the gateway's; it runs in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from clawloop.engines.base import GenerationRequest, SamplingParams, TokenEvent  # noqa: E402
from clawloop.engines.bench import BenchEngine  # noqa: E402

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover
    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


class Stub:
    def __init__(self, engine: BenchEngine):
        self.engine = engine
        self.weight_version = "0"
        self.requests = 0
        self.whole = 0
        """Requests that asked for no stream (`stream: false`)."""

    def logprobs(self, events: list[TokenEvent], k: int) -> dict[str, Any]:
        content = []
        for ev in events:
            if ev.token_id is None:
                continue
            tops = [{"token_id": ev.token_id, "logprob": ev.logprob, "rank": 1}]
            for j, (t, lp) in enumerate((ev.top_logprobs or [])[1:k], start=2):
                tops.append({"token_id": t, "logprob": lp, "rank": j})
            content.append({"token_id": ev.token_id, "logprob": ev.logprob, "rank": 1, "top_logprobs": tops})
        return {"content": content}

    def request(self, body: dict[str, Any]) -> tuple[GenerationRequest, int]:
        sp = body.get("sampling_params") or {}
        k = int(sp.get("logprobs") or 0)  # vLLM: the sampled id, then up to k-1 ranked alternatives (0: just it)
        params = SamplingParams(max_tokens=int(sp.get("max_tokens") or 16),
                                stop_token_ids=list(sp.get("stop_token_ids") or []), top_logprobs=max(0, k))
        return GenerationRequest(list(body["token_ids"]), params, body.get("request_id") or ""), k

    async def generate(self, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        req, k = self.request(body)
        rid = body.get("request_id") or uuid.uuid4().hex
        version = self.weight_version
        self.requests += 1
        if not body.get("stream"):
            self.whole += 1
            events = [ev async for chunk in self.engine.generate_chunks(req) for ev in chunk]
            ids = [ev.token_id for ev in events if ev.token_id is not None]
            choice = {"index": 0, "finish_reason": events[-1].finish_reason, "stop_reason": None, "token_ids": ids,
                      "routed_experts": None, "sampling_mask": None,
                      "weight_versions": [{"version": version, "start": 0, "end": len(ids)}],
                      "logprobs": self.logprobs(events, k)}
            out = {"request_id": rid, "model": None, "created": int(time.time()),
                   "usage": {"prompt_tokens": len(req.prompt_ids), "completion_tokens": len(ids),
                             "total_tokens": len(req.prompt_ids) + len(ids)},
                   "prompt_logprobs": None, "prompt_token_id_logprobs": None, "prompt_token_ids": None,
                   "mm_placeholders": None, "metrics": None, "kv_transfer_params": None, "ec_transfer_params": None,
                   "output_mode": "tokens", "choices": [choice]}
            respond(writer, 200, dumps(out))
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        n = 0
        async for events in self.engine.generate_chunks(req):
            ids = [ev.token_id for ev in events if ev.token_id is not None]
            finish = events[-1].finish_reason
            n += len(ids)
            choice = {"index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": ids,
                      "routed_experts": None, "sampling_mask": None,
                      "weight_versions": [{"version": version, "start": 0, "end": n}] if finish else None,
                      "logprobs": self.logprobs(events, k)}
            msg = {"request_id": rid, "usage": None, "output_mode": "tokens", "choices": [choice]}
            chunk(writer, b"data: " + dumps(msg) + b"\n\n")
            await writer.drain()  # raises once the client has gone: the stream stops (vLLM aborts)
        chunk(writer, b"data: [DONE]\n\n")
        chunk(writer, b"")
        await writer.drain()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *fields = head.decode("latin-1").split("\r\n")
                method, path, _ = line.split(" ", 2)
                hdr = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
                data = await reader.readexactly(int(hdr.get("content-length") or 0))
                body = json.loads(data) if data else {}
                path = path.split("?", 1)[0]
                if path == "/inference/v1/generate" and method == "POST":
                    await self.generate(body, writer)
                elif path == "/update_weight_version":
                    self.weight_version = str(body.get("new_version", self.weight_version))
                    respond(writer, 200, b"{}")
                elif path in ("/health", "/reset_prefix_cache", "/pause", "/resume", "/collective_rpc",
                              "/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                    respond(writer, 200, b"{}")
                elif path == "/v1/models":
                    respond(writer, 200, dumps({"object": "list", "data": [{"id": "clawloop-base", "object": "model"}]}))
                else:
                    respond(writer, 404, dumps({"error": {"message": f"no route {method} {path}", "code": 404}}))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()


def respond(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    writer.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\n\r\n".encode() + body)


def chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


async def serve(model: str, port: int, step_ms: float, tokens_per_step: int, completion_tokens: int,
                ready: Any = None) -> None:
    engine = BenchEngine(model, step_ms=step_ms, tokens_per_step=tokens_per_step, completion_tokens=completion_tokens)
    await engine.start()
    stub = Stub(engine)
    server = await asyncio.start_server(stub.handle, "127.0.0.1", port, backlog=4096)
    print(f"vllm stub: http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    if ready is not None:
        ready(server, stub)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF folder whose tokenizer gives the ids")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--tokens-per-step", type=int, default=1)
    ap.add_argument("--completion-tokens", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    try:
        asyncio.run(serve(a.model, a.port, a.step_ms, a.tokens_per_step, a.completion_tokens))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
