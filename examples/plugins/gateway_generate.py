"""A generate function with slime's signature, for `--custom-generate-function-path`.

    clawloop buffer --custom-generate-function-path examples/plugins/gateway_generate.py

The built-in generators then get each answer from this function instead of
their own call. This one asks an OpenAI-compatible server (`args.remote_engine_url`,
clawloop's gateway by default) with a system prompt of its own and fills in
slime's fields: `response`, and `tokens` / `response_length` /
`rollout_log_probs` from the ids clawloop's gateway returns, so the items stay
token-exact.
"""

import httpx

SYSTEM = "Answer with the number only."


async def generate(args, sample, sampling_params):
    url = str(args.remote_engine_url).rstrip("/")
    url = url if url.endswith("/v1") else url + "/v1"
    body = {"model": getattr(args, "model", None) or "clawloop",
            "messages": [{"role": "system", "content": SYSTEM}, *sample.prompt],
            "max_tokens": sampling_params.get("max_new_tokens", 64),
            "temperature": sampling_params.get("temperature", 1.0),
            "return_token_ids": True}
    async with httpx.AsyncClient(timeout=600) as client:
        r = await client.post(url + "/chat/completions", json=body, headers={"X-Turn-Type": "side"})
        r.raise_for_status()
        reply = r.json()
    choice = reply["choices"][0]
    sample.response = choice["message"]["content"] or ""
    ids, logprobs = choice.get("token_ids"), choice.get("token_logprobs")
    if ids is not None and reply.get("prompt_token_ids") is not None:
        sample.tokens = list(reply["prompt_token_ids"]) + list(ids)
        sample.response_length = len(ids)
        sample.rollout_log_probs = list(logprobs or [])
    sample.policy_version = reply.get("policy_version")
    sample.status = "completed"
    return sample
