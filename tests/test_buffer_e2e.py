"""The built-in math generator end to end: buffer service -> generator process
-> the real gateway (token ids on) -> /buffer/write -> /get_rollout_data ->
BufferSource -> one training step. The model is the random test model taught
in seconds to answer "What is 2+3?" with 5 or 6 at random, so groups carry
reward variance (a group whose rewards are all equal is rightly dropped)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import torch

from conftest import Gateway, make_cfg

PROBLEMS = [("What is 2+3?", "5"), ("What is 4+4?", "8")]


@pytest.fixture(scope="module")
def math_model_dir(random_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    seqs = []
    for q, a in PROBLEMS:
        for ans in (a, str(int(a) + 1)):  # right and wrong, equally often
            seqs.append(tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": ans}],
                                                tokenize=False))
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(80):
        for text in seqs:
            ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    out = tmp_path_factory.mktemp("math-model") / "m"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_math_generator_through_gateway_then_train(math_model_dir, tmp_path):
    from clawloop.buffer import BufferSource, BufferThread
    from clawloop.engines.hf import HFEngine
    from clawloop.trainer import Trainer, TrainerLoop

    eng = HFEngine(math_model_dir, device="cpu", dtype="float32")
    asyncio.run(eng.start())
    gw = Gateway(eng, math_model_dir, tmp_path / "gw")
    cfg = make_cfg(math_model_dir, tmp_path / "buf", train__n_samples_per_prompt="4", train__method="binary",
                   train__source="buffer", train__buffer_url="http://placeholder", train__rollout_batch_size="4",
                   train__lr="1e-3")
    buf = BufferThread(cfg).start()
    problems = tmp_path / "p.jsonl"
    problems.write_text("".join(json.dumps({"instance_id": f"p{i}", "prompt": q, "label": a}) + "\n"
                                for i, (q, a) in enumerate(PROBLEMS)))
    try:
        r = httpx.post(buf.url + "/start_rollout", json={
            "task_type": "math", "remote_engine_url": gw.url + "/v1", "remote_buffer_url": buf.url,
            "input_file": str(problems), "num_repeat_per_sample": 8, "max_tokens": 6,
            "sampling_params": {"temperature": 1.0, "max_tokens": 6}, "num_process": 4, "num_epoch": 1})
        assert r.status_code == 200, r.text
        source = BufferSource(buf.url, eng.tokenizer)
        samples = []
        deadline = time.time() + 120
        while not samples:
            assert time.time() < deadline, httpx.get(buf.url + "/buffer/stats").text
            samples = source.pull()
            time.sleep(0.3)
        # token-exact from the gateway: ids and logprobs as sampled, never re-tokenized
        for s in samples:
            assert s.group_id in {"p0", "p1"}
            assert len(s.tokens) == len(s.loss_mask) == len(s.rollout_logprobs)
            assert any(x != 0.0 for x in s.rollout_logprobs[s.prompt_len:])
            assert s.advantages is not None
        by_group: dict[str, list[float]] = {}
        for s in samples:
            by_group.setdefault(s.group_id, []).append(s.advantages[-1])
        for advs in by_group.values():
            assert abs(sum(advs)) < 1e-5 and any(a != 0 for a in advs)  # centred within the group
        # generator traffic is served as side turns: stored, never trained on
        gw.store.flush()
        side = [t for _, ts in gw.store.iter_sessions() for t in ts]
        assert side and all(t.type == "side" and not t.trainable for t in side)

        # one training step on the groups, published to the engine
        trainer = Trainer(cfg, str(math_model_dir))
        tl = TrainerLoop(cfg, trainer, None, eng, "offline", buffer_source=source)
        tl.pending = list(samples)
        cfg.train.rollout_batch_size = len(samples)

        async def step():
            return await asyncio.get_running_loop().run_in_executor(None, tl.run_once)

        assert asyncio.run(step()) is True
        assert eng.policy_version == 1 and trainer.last["train/samples"] == len(samples)
        assert trainer.last["train/logprob_diff_abs_mean"] < 1e-3
    finally:
        buf.stop()
        gw.stop()
        asyncio.run(eng.stop())
