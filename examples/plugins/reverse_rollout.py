"""A rollout function for `--rollout-function-path`: one more rollout-buffer task, no generator file.

    clawloop buffer --rollout-function-path examples/plugins/reverse_rollout.py:run_rollout
    curl -X POST localhost:8889/start_rollout -d '{"task_type": "reverse", "num_repeat_per_sample": 4}'

It asks the model to spell words backwards and rewards each answer by the
fraction of letters in the right place, a continuous reward in [0, 1]. The
buffer runs it like a generator file's `run_rollout(data)` (in its own process
group, with the /start_rollout payload); TASK_TYPE names its task.
"""

import httpx

TASK_TYPE = "reverse"
WORDS = ("python", "buffer", "gradient", "session", "reward", "policy", "token", "judge")


def score(answer: str, word: str) -> float:
    target = word[::-1]
    got = answer.strip().lower()
    return sum(a == b for a, b in zip(got, target)) / len(target)


def run_rollout(data):
    engine = str(data.get("remote_engine_url") or "http://127.0.0.1:8000/v1").rstrip("/")
    engine = engine if engine.endswith("/v1") else engine + "/v1"
    buffer = str(data["remote_buffer_url"]).rstrip("/")
    n = int(data.get("num_repeat_per_sample", 1))
    words = data.get("words") or WORDS
    with httpx.Client(timeout=600) as client:
        for i, word in enumerate(words):
            messages = [{"role": "user", "content": f"Spell '{word}' backwards."}]
            for _ in range(n):
                r = client.post(engine + "/chat/completions", headers={"X-Turn-Type": "side"},
                                json={"model": "clawloop", "messages": messages, "max_tokens": 16,
                                      "return_token_ids": True})
                r.raise_for_status()
                reply = r.json()
                answer = reply["choices"][0]["message"]["content"] or ""
                item = {"instance_id": f"reverse-{i}", "task_type": TASK_TYPE, "reward": score(answer, word),
                        "messages": messages + [{"role": "assistant", "content": answer}]}
                choice = reply["choices"][0]
                if choice.get("token_ids") is not None and reply.get("prompt_token_ids") is not None:
                    item.update(prompt_ids=reply["prompt_token_ids"], response_ids=choice["token_ids"],
                                response_logprobs=choice["token_logprobs"])
                client.post(buffer + "/buffer/write", json=item).raise_for_status()
