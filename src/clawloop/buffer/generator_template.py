"""A rollout-buffer generator: one file per kind of task.

How to make your own (the same steps as slime's Rollout Buffer):
  1. Copy this file into your generator folder as `<name>_generator.py`
     (`clawloop buffer new-generator NAME` does it for you).
  2. Change TASK_TYPE to your task's name (unique among your generators).
  3. Implement run_rollout(data): produce trajectories and POST each one to
     `<remote_buffer_url>/buffer/write`.
  4. Optionally define any of the five hooks at the bottom; defaults apply
     otherwise (see clawloop.buffer.hooks).

Run it:  clawloop buffer --generator-dir DIR, then
         POST /start_rollout {"task_type": TASK_TYPE, "input_file": ..., "num_repeat_per_sample": 8, ...}
The buffer calls run_rollout(data) in a child process of its own, with `data`
the /start_rollout payload (values may arrive as strings, as slime's trainer
sends them). POST /stop_rollout stops that process and everything it started.

An item is one trajectory, a JSON object:
  instance_id  the group key: every item of one prompt shares it (required)
  reward       a number (required)
  messages     the conversation, ending with the assistant's answer
  uid          unique per item (optional)
  extra_info   anything else you want to keep (optional)
Items also carry token ids when the engine returns them (clawloop's gateway
does with "return_token_ids": true): prompt_ids, response_ids,
response_logprobs, policy_version. The trainer then uses exactly those
tokens; without them it re-tokenizes `messages` with the chat template.
"""

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

TASK_TYPE = "my_task"


def compute_reward(answer, label):
    """Score one answer. Replace this with your task's check."""
    return 1.0 if answer is not None and answer.strip() == str(label).strip() else 0.0


def read_problems(path):
    with open(path) as f:
        for i, line in enumerate(f):
            if line.strip():
                item = json.loads(line)
                item.setdefault("instance_id", i)
                yield item


def chat(client, base_url, messages, data):
    """One completion from the OpenAI-compatible server; returns the reply JSON."""
    params = dict(data.get("sampling_params") or {})
    body = {
        "model": data.get("model", "default"),
        "messages": messages,
        "max_tokens": int(params.pop("max_tokens", data.get("max_tokens", 256))),
        **params,
        "return_token_ids": True,  # clawloop's gateway: token ids + logprobs in the reply
    }
    for attempt in range(3):
        try:
            r = client.post(base_url + "/chat/completions", json=body, headers={"X-Turn-Type": "side"})
            r.raise_for_status()
            return r.json()
        except httpx.HTTPError as e:
            print(f"[{TASK_TYPE}] LLM call failed (attempt {attempt + 1}): {e}", flush=True)
            time.sleep(1 + attempt)
    return None


def rollout_one(client, data, problem):
    messages = problem.get("messages") or [{"role": "user", "content": problem["prompt"]}]
    base_url = data["remote_engine_url"].rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    reply = chat(client, base_url, messages, data)
    if reply is None:
        return None
    choice = reply["choices"][0]
    answer = choice["message"].get("content") or ""
    item = {
        "uid": str(uuid.uuid4()),
        "instance_id": problem["instance_id"],
        "messages": messages + [{"role": "assistant", "content": answer}],
        "reward": compute_reward(answer, problem.get("label")),
        "extra_info": {"finish_reason": choice.get("finish_reason"), "timestamp": str(time.time())},
    }
    if choice.get("token_ids") is not None and reply.get("prompt_token_ids") is not None:
        item["prompt_ids"] = reply["prompt_token_ids"]
        item["response_ids"] = choice["token_ids"]
        item["response_logprobs"] = choice.get("token_logprobs")
        item["policy_version"] = reply.get("policy_version", 0)
    return item


def send_to_buffer(client, data, item):
    url = data["remote_buffer_url"].rstrip("/") + "/buffer/write"
    for _ in range(3):
        try:
            if client.post(url, json=item).status_code == 200:
                return True
        except httpx.HTTPError as e:
            print(f"[{TASK_TYPE}] write to buffer failed: {e}", flush=True)
        time.sleep(1)
    return False


def run_rollout(data):
    """Called by the buffer with the /start_rollout payload. Blocks until done."""
    group_size = int(data["num_repeat_per_sample"])
    skip = {str(i) for i in (data.get("skip_instance_ids") or [])}
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(int(data.get("num_process", 8))) as pool:
        for _epoch in range(int(data.get("num_epoch", 1))):
            jobs = [pool.submit(rollout_one, client, data, p)
                    for p in read_problems(data["input_file"]) if str(p["instance_id"]) not in skip
                    for _ in range(group_size)]
            for job in jobs:
                item = job.result()
                if item is not None:
                    send_to_buffer(client, data, item)
            skip = set()  # skip_instance_ids applies to the first pass only


# Optional hooks: uncomment and edit to replace a default (clawloop.buffer.hooks).
#
# def is_valid_group(group_data, min_valid_group_size, task_type):
#     instance_id, items = group_data
#     is_finished = len(items) >= min_valid_group_size
#     return is_finished and len({it["reward"] for it in items}) > 1, is_finished
#
# def filter_item(item, task_type):
#     return isinstance(item.get("reward"), (int, float))
#
# def normalize_group_data(group, epsilon=1e-8, algo="grpo"):
#     return group                       # e.g. keep raw rewards
#
# def pad_group_data(batch, group_size):
#     return batch                       # e.g. never pad
#
# def get_group_data_meta_info(temp_data):
#     return {"num_groups": len(temp_data)}
