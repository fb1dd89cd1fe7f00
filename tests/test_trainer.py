"""The trainer end to end: a learning canary through the real engine, LoRA
and full publishing, checkpoint -> kill -> resume, and publishes under
concurrent streaming load with zero failed requests. Plus the LoRA adapter
publish (round trip through peft) and the colocated engine's sleep/wake_up
around each step, against a recording stand-in for the vLLM engine."""

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

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="3e-2", train__tis_cap="2.0")
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
    from clawloop.naming import open_store
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
    bare = tok.encode("19", add_special_tokens=False) + [tok.eos_token_id]
    if method == "binary":  # a -1 teaches binary nothing (train.negative_weight 0): they are skipped too
        for i in range(4):
            _judged_turn(store, f"p{i}", prompt, bare, [-1.0] * len(bare), 1)
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
    assert s["train/skipped_no_signal"] == (14 if method == "binary" else 10) and s["train/steps"] == 1
    store.flush()  # the cursor is written by the store's writer thread (set_cursor returns a future)
    assert engine.policy_version == 1 and store.get_cursor("trainer") == tl.cursor > 0
    after = engine.state_dict()
    diff = sum(float((after[k] - before[k]).abs().sum()) for k in before if k in after)
    assert diff > 0, "the served weights must change"
    if lora:
        assert all("lora" not in k for k in after)
    assert torch.isfinite(torch.tensor(trainer.last["train/loss"]))
    if method in ("opd", "combine"):  # the default OPD term: the hinted teacher's top-K, up to the divergence
        assert trainer.last["train/topk_kl"] > 0 and 0 <= trainer.last["train/opd_after_divergence_frac"] < 1
    store.close()


def test_checkpoint_resume_serves_resumed_weights(random_model_dir, tmp_path):
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.naming import open_store
    from clawloop.trainer import Trainer, TrainerLoop
    from clawloop.trainer.checkpoint import weights_fingerprint

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="2",
                   train__save_interval="1", train__lr="1e-3", train__negative_weight="1")
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


def _binary_samples(tok, n=4):
    from clawloop.gateway.render import render_prompt

    prompt = render_prompt(tok, [{"role": "user", "content": "What is 12+7?"}], None)
    out = []
    for i in range(n):
        resp = tok.encode(["19", "The answer is 19."][i % 2], add_special_tokens=False) + [tok.eos_token_id]
        out.append(Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                          rollout_logprobs=[0.0] * len(prompt) + [-2.0] * len(resp), prompt_len=len(prompt),
                          reward=1.0 if i % 2 == 0 else -1.0))
    return out


def test_lora_adapter_round_trips_through_peft(random_model_dir, tmp_path):
    """The published adapter, written as peft writes one and loaded with PeftModel.from_pretrained,
    serves the same logits as the merged full weights; its config is peft's adapter_config.json."""
    import json

    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from clawloop.engines.base import LoraAdapter
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-2", train__use_lora="true",
                   train__lora_rank="4")
    trainer = Trainer(cfg, str(random_model_dir))
    trainer.step(_binary_samples(trainer.tokenizer))  # lora_B starts at zero: train it off zero
    adapter = trainer.lora_adapter()
    assert isinstance(adapter, LoraAdapter) and adapter.state_dict
    assert all(v.device.type == "cpu" and "lora_" in k for k, v in adapter.state_dict.items())
    json.dumps(adapter.config)  # JSON types only
    assert adapter.config["base_model_name_or_path"] == str(random_model_dir)
    assert adapter.config["r"] == 4 and adapter.config["peft_type"] == "LORA"

    # what peft itself saves: same tensor names and values, same config
    peft_dir = tmp_path / "peft-saved"
    trainer.model.save_pretrained(peft_dir)
    saved = load_file(str(peft_dir / "adapter_model.safetensors"))
    assert saved.keys() == adapter.state_dict.keys()
    assert all(torch.equal(saved[k], adapter.state_dict[k]) for k in saved)
    peft_conf = json.loads((peft_dir / "adapter_config.json").read_text())
    ours = dict(adapter.config)
    for conf in (peft_conf, ours):
        conf["target_modules"] = sorted(conf["target_modules"])
        conf.pop("base_model_name_or_path")
    assert ours == peft_conf

    out = tmp_path / "adapter"
    out.mkdir()
    save_file(dict(adapter.state_dict), str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(adapter.config))
    base = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(out)).merge_and_unload().eval()
    full = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32).eval()
    missing, unexpected = full.load_state_dict(trainer.served_state_dict(), strict=False)
    assert not unexpected and all(k.endswith("lm_head.weight") for k in missing)
    untrained = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([trainer.tokenizer.encode("What is 12+7? The answer is 19.", add_special_tokens=False)])
    with torch.no_grad():
        a, b, c = (m(input_ids=ids).logits for m in (merged, full, untrained))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (a - c).abs().max() > 1e-4, "the adapter must change the model"


class RecordingEngine:
    """A stand-in for a vLLM engine (the real one is a server on a GPU): records the calls the
    trainer loop makes, on which event loop, and what was published."""

    def __init__(self, accepts_lora_adapters=False, can_sleep=True, fail_sleep=False):
        self.calls: list[str] = []
        self.loops: list = []
        self.published: list = []
        self.version = 0
        self.accepts_lora_adapters = accepts_lora_adapters
        self.fail_sleep = fail_sleep
        if not can_sleep:
            self.sleep = None
            self.wake_up = None

    @property
    def policy_version(self) -> int:
        return self.version

    async def publish(self, weights, version):
        self.calls.append("publish")
        self.loops.append(asyncio.get_running_loop())
        self.published.append(weights)
        self.version = version

    async def sleep(self):
        self.calls.append("sleep")
        self.loops.append(asyncio.get_running_loop())
        if self.fail_sleep:
            raise RuntimeError("sleep failed")

    async def wake_up(self):
        self.calls.append("wake_up")
        self.loops.append(asyncio.get_running_loop())


class ListSource:
    """A buffer source that hands out fixed samples once."""

    def __init__(self, samples):
        self.samples = list(samples)

    def pull(self, batch_size=None):
        out, self.samples = self.samples, []
        return out


def _loop_with(random_model_dir, tmp_path, engine, samples_n=4, loop=None, **flags):
    from clawloop.trainer import Trainer, TrainerLoop

    flags = {"train__method": "binary", "train__rollout_batch_size": str(samples_n), "train__lr": "1e-3",
             "train__negative_weight": "1", **flags}  # the -1 samples fill the batch as they did
    cfg = make_cfg(random_model_dir, tmp_path, **flags)
    trainer = Trainer(cfg, str(random_model_dir))
    return TrainerLoop(cfg, trainer, None, engine, "offline", loop=loop,
                       buffer_source=ListSource(_binary_samples(trainer.tokenizer, samples_n)))


@pytest.mark.parametrize("use_lora,accepts,expect_adapter", [
    (True, True, True), (True, False, False), (False, True, False)])
def test_publish_sends_the_adapter_only_where_the_engine_takes_one(random_model_dir, tmp_path, use_lora, accepts,
                                                                   expect_adapter):
    from clawloop.engines.base import LoraAdapter

    engine = RecordingEngine(accepts_lora_adapters=accepts)
    flags = {"train__use_lora": "true", "train__lora_rank": "4"} if use_lora else {}
    tl = _loop_with(random_model_dir, tmp_path, engine, **flags)
    assert tl.run_once() is True
    (w,) = engine.published
    assert engine.version == 1 and tl.counts["publishes"] == 1
    if expect_adapter:
        assert isinstance(w, LoraAdapter) and all("lora_" in k for k in w.state_dict)
    else:
        assert isinstance(w, dict) and "model.embed_tokens.weight" in w and all("lora_" not in k for k in w)


def test_colocated_engine_sleeps_through_each_step(random_model_dir, tmp_path):
    """sleep before the step, wake_up after it and before the publish, on the serving event loop."""
    aloop = asyncio.new_event_loop()
    thread = threading.Thread(target=aloop.run_forever, daemon=True)
    thread.start()
    try:
        engine = RecordingEngine()
        tl = _loop_with(random_model_dir, tmp_path, engine, loop=aloop, model__sleep_while_training="true")
        step = tl.trainer.step

        def recording_step(*a, **kw):
            engine.calls.append("step")
            return step(*a, **kw)

        tl.trainer.step = recording_step
        assert tl.run_once() is True
        assert engine.calls == ["sleep", "step", "wake_up", "publish"]
        assert all(lp is aloop for lp in engine.loops)
        s = tl.stats()
        assert s["train/engine_sleeps"] == 1 and s["train/last_engine_sleep_s"] > 0

        # a step that fails still wakes the engine up, and nothing is published
        engine.calls.clear()
        tl.buffer.samples = _binary_samples(tl.trainer.tokenizer)

        def failing_step(*a, **kw):
            engine.calls.append("step")
            raise RuntimeError("out of memory")

        tl.trainer.step = failing_step
        with pytest.raises(RuntimeError, match="out of memory"):
            tl.run_once()
        assert engine.calls == ["sleep", "step", "wake_up"]
    finally:
        aloop.call_soon_threadsafe(aloop.stop)
        thread.join(timeout=10)
        aloop.close()


def test_failed_sleep_still_wakes_up_and_no_step_runs(random_model_dir, tmp_path):
    engine = RecordingEngine(fail_sleep=True)
    tl = _loop_with(random_model_dir, tmp_path, engine, model__sleep_while_training="true")
    with pytest.raises(RuntimeError, match="sleep failed"):
        tl.run_once()
    assert engine.calls == ["sleep", "wake_up"] and tl.trainer.step_count == 0


@pytest.mark.parametrize("colocate,can_sleep", [(False, True), (True, False)])
def test_no_sleep_unless_colocated_and_able(random_model_dir, tmp_path, caplog, colocate, can_sleep):
    engine = RecordingEngine(can_sleep=can_sleep)
    tl = _loop_with(random_model_dir, tmp_path, engine, model__sleep_while_training=str(colocate).lower())
    assert tl.run_once() is True
    assert engine.calls == ["publish"]
    if colocate:
        assert "no async sleep()/wake_up()" in caplog.text
