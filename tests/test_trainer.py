"""The trainer end to end: a learning canary through the real engine, LoRA
and full publishing, checkpoint -> kill -> resume, and publishes under
concurrent streaming load with zero failed requests."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from clawloop.engines.base import GenerationRequest, SamplingParams
from clawloop.records import Judgement, Sample, Turn
from conftest import make_cfg


async def sample_group(engine, prompt_ids, n, seed0, max_tokens=4):
    async def one(i):
        ids, lps, ver = [], [], 0
        p = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed0 + i)
        async for ev in engine.generate(GenerationRequest(prompt_ids, p)):
            if ev.token_id is not None:
                ids.append(ev.token_id)
                lps.append(ev.logprob)
            ver = ev.policy_version
        return ids, lps, ver
    return await asyncio.gather(*(one(i) for i in range(n)))


def test_learning_canary_reward_rises_and_weights_change(random_model_dir, tmp_path):
    """Synthetic reward: +1 when the first answer token is in the lower half of
    the vocabulary (a ~50 % base rate on a random model), -1 otherwise. 30
    Binary-RL steps through engine -> trainer -> publish must raise it."""
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-2", train__tis_cap="2.0")
    trainer = Trainer(cfg, str(random_model_dir))
    engine = HFEngine(random_model_dir, device="cpu", dtype="float32")
    half = len(engine.tokenizer) // 2
    prompt = render_prompt(engine.tokenizer, [{"role": "user", "content": "What is 12+7?"}], None)
    w0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rewards = []

    async def main():
        await engine.start()
        try:
            for step in range(30):
                group = await sample_group(engine, prompt, 16, seed0=1000 * step)
                samples = []
                for ids, lps, ver in group:
                    r = 1.0 if ids and ids[0] < half else -1.0
                    samples.append(Sample(tokens=prompt + ids, loss_mask=[0] * len(prompt) + [1] * len(ids),
                                          rollout_logprobs=[0.0] * len(prompt) + lps, prompt_len=len(prompt),
                                          reward=r, policy_version=ver))
                rewards.append(sum(s.reward for s in samples) / len(samples))
                stats = trainer.step(samples, served_version=engine.policy_version)
                assert stats["train/logprob_diff_abs_mean"] < 1e-3  # engine serves what the trainer trains
                await engine.publish(trainer.served_state_dict(), trainer.version)
        finally:
            await engine.stop()

    asyncio.run(main())
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.5, rewards
    assert engine.policy_version == 30 and trainer.step_count == 30
    changed = sum(float((v - w0[k]).abs().sum()) for k, v in trainer.model.state_dict().items())
    assert changed > 0


def _judged_turn(store, sid, prompt_ids, response_ids, lps, score, hint=None, version=0):
    t = Turn(session_id=sid, index=0, messages=[{"role": "user", "content": "What is 12+7?"}],
             prompt_ids=prompt_ids, response_ids=response_ids, response_logprobs=lps, response_text="x",
             policy_version=version, next_state={"role": "user", "content": "no"})
    tid = store.add_turn(t).result()
    store.save_judgement(Judgement(turn_id=tid, score=score, hint=hint, judge="offline")).result()


@pytest.mark.parametrize("method,lora", [("combine", False), ("opd", True), ("binary", True)])
def test_loop_trains_from_store_and_publishes(random_model_dir, tmp_path, method, lora):
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.runtime import open_store
    from clawloop.trainer import Trainer, TrainerLoop

    flags = {"train__method": method, "train__rollout_batch_size": "4", "train__lr": "1e-3"}
    if lora:
        flags.update(train__use_lora="true", train__lora_rank="4")
    cfg = make_cfg(random_model_dir, tmp_path, **flags)
    store = open_store(cfg)
    engine = HFEngine(random_model_dir, device="cpu", dtype="float32")
    tok = engine.tokenizer
    prompt = render_prompt(tok, [{"role": "user", "content": "What is 12+7?"}], None)
    resp = tok.encode("The answer is 19.", add_special_tokens=False) + [tok.eos_token_id]
    for i in range(10):
        # zero-signal turns (score 0, no hint) must not fill batch slots
        _judged_turn(store, f"z{i}", prompt, resp, [-1.0] * len(resp), 0)
    for i in range(4):
        _judged_turn(store, f"s{i}", prompt, resp, [-1.0] * len(resp), -1, hint="Answer with just the number.")
    trainer = Trainer(cfg, str(random_model_dir))
    before = trainer.served_state_dict()
    tl = TrainerLoop(cfg, trainer, store, engine, "offline")

    async def main():
        await engine.start()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, tl.run_once)
        finally:
            await engine.stop()

    assert asyncio.run(main()) is True
    s = tl.stats()
    assert s["train/skipped_no_signal"] == 10 and s["train/steps"] == 1
    assert engine.policy_version == 1 and store.get_cursor("trainer") == tl.cursor > 0
    after = engine.state_dict()
    diff = sum(float((after[k] - before[k]).abs().sum()) for k in before if k in after)
    assert diff > 0, "the served weights must change"
    if lora:
        assert all("lora" not in k for k in after)
    assert torch.isfinite(torch.tensor(trainer.last["train/pg_loss"]))
    if method in ("opd", "combine"):
        assert trainer.last["train/combine_opd_frac"] == 1.0
    store.close()


def test_checkpoint_resume_serves_resumed_weights(random_model_dir, tmp_path):
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.runtime import open_store
    from clawloop.trainer import Trainer, TrainerLoop
    from clawloop.trainer.checkpoint import weights_fingerprint

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="2",
                   train__save_interval="1", train__lr="1e-3")
    store = open_store(cfg)
    engine = HFEngine(random_model_dir, device="cpu", dtype="float32")
    tok = engine.tokenizer
    prompt = render_prompt(tok, [{"role": "user", "content": "hi"}], None)
    resp = tok.encode("hello", add_special_tokens=False)
    for i in range(6):
        _judged_turn(store, f"c{i}", prompt, resp, [-2.0] * len(resp), 1 if i % 2 else -1)
    tl = TrainerLoop(cfg, Trainer(cfg, str(random_model_dir)), store, engine, "offline")

    async def run(fn):
        await engine.start()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn)
        finally:
            await engine.stop()

    asyncio.run(run(lambda: [tl.run_once() for _ in range(2)]))
    assert tl.trainer.step_count >= 2 and (tl.save_dir / "latest").exists()
    step, version, cursor = tl.trainer.step_count, tl.trainer.version, tl.cursor
    trained = weights_fingerprint(tl.trainer.served_state_dict())
    # a leftover half-written checkpoint (killed mid-write) must not confuse resume
    (tl.save_dir / ".tmp-step_999999-1").mkdir()

    # "restart": a fresh engine at v0 and a fresh trainer, resumed from latest
    engine2 = HFEngine(random_model_dir, device="cpu", dtype="float32")
    cfg2 = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="2",
                    train__resume_from_checkpoint="latest")
    tl2 = TrainerLoop(cfg2, Trainer(cfg2, str(random_model_dir)), store, engine2, "offline")
    tl2.resume()
    assert (tl2.trainer.step_count, tl2.trainer.version, tl2.cursor) == (step, version, cursor)
    assert weights_fingerprint(tl2.trainer.served_state_dict()) == pytest.approx(trained, abs=1e-6)

    async def run2():
        await engine2.start()
        try:
            await asyncio.get_running_loop().run_in_executor(None, tl2.publish_resumed)
        finally:
            await engine2.stop()

    asyncio.run(run2())
    assert engine2.policy_version == version
    assert weights_fingerprint(engine2.state_dict()) == pytest.approx(trained, abs=1e-6)
    store.close()


def test_publish_under_streaming_load_has_zero_failures(make_gateway, random_model_dir):
    """20 publishes while 8 clients stream: every request completes, versions advance."""
    import copy

    from clawloop.engines.hf import HFEngine

    engine = HFEngine(random_model_dir, device="cpu", dtype="float32")
    asyncio.run(engine.start())
    g = make_gateway(engine=engine)
    c = g.client()
    failures, done, versions = [], [], set()
    stop = threading.Event()

    def client():
        while not stop.is_set():
            try:
                raw = c.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=12, stream=True)
                versions.add(int(raw.headers["x-policy-version"]))
                chunks = list(raw.parse())
                assert chunks[-1].choices[0].finish_reason in ("stop", "length")
                done.append(1)
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    base = copy.deepcopy(engine.model)
    try:
        for i in range(1, 21):
            with torch.no_grad():
                for p in base.parameters():
                    p.add_(1e-3)
            asyncio.run(engine.publish(base.state_dict(), i))
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        g.stop()
        asyncio.run(engine.stop())
    assert not failures, failures[:3]
    assert len(done) >= 20 and engine.policy_version == 20
    assert len(versions) > 1
