"""A quick probe (issue #30 item 2): 32 httpx clients for 8 s each against a running `clawloop serve --backend vllm`
(port 18477, model /tmp/rand4x128): the gateway's chat, vLLM's own chat, and the engine's `/inference/v1/generate`
body (stream false, with and without logprobs) sent straight to the replica (its URL from /health).

    .venv/bin/python bench/vllm_paths_probe.py http://127.0.0.1:<replica port>
"""
import asyncio, httpx, time, sys
from transformers import AutoTokenizer
GW = "http://127.0.0.1:18477"; V = sys.argv[1]
tok = AutoTokenizer.from_pretrained("/tmp/rand4x128")
ids = tok.apply_chat_template([{"role": "user", "content": "Tell me about the gateway."}], add_generation_prompt=True, tokenize=True, return_dict=False)
ids = ids["input_ids"] if hasattr(ids, "keys") else ids
eos = sorted({tok.eos_token_id} - {None})
def gen_body(stream, logprobs=0, stop=True):
    sp = {"temperature": 0, "top_p": 1.0, "max_tokens": 32, "logprobs": logprobs, "detokenize": False, "skip_special_tokens": False, "ignore_eos": True}
    if stop: sp["stop_token_ids"] = eos
    return {"token_ids": list(ids), "sampling_params": sp, "stream": stream}
cases = {
  "gateway chat": (GW + "/v1/chat/completions", {"model": "m", "max_tokens": 32, "temperature": 0, "ignore_eos": True, "messages": [{"role": "user", "content": "Tell me about the gateway."}]}),
  "vllm chat": (V + "/v1/chat/completions", {"model": "clawloop-base", "max_tokens": 32, "temperature": 0, "ignore_eos": True, "messages": [{"role": "user", "content": "Tell me about the gateway."}]}),
  "generate stream=false logprobs=0": (V + "/inference/v1/generate", gen_body(False)),
  "generate stream=false no logprobs": (V + "/inference/v1/generate", gen_body(False, None)),
}
async def run(url, body, secs=8):
    stop = time.time() + secs; n = [0]
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=60) as c:
        async def one():
            while time.time() < stop:
                r = await c.post(url, json={k: v for k, v in body.items() if v is not None} if "sampling_params" not in body else {**body, "sampling_params": {k: v for k, v in body["sampling_params"].items() if v is not None}})
                assert r.status_code == 200, r.text[:300]
                n[0] += 1
        await asyncio.gather(*(one() for _ in range(32)))
    return n[0] / secs
async def main():
    for name, (url, body) in cases.items():
        print(f"{name:36s} {await run(url, body):6.1f} req/s", flush=True)
asyncio.run(main())
