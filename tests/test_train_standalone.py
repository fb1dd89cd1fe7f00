"""`clawloop train` without an engine, for many steps and across a restart: from an imported,
judged store and from a real rollout buffer. Every sample trains exactly once; the policy
version advances; nothing is dropped as stale because the trainer's own version moved."""

from __future__ import annotations

import json

import httpx

from conftest import make_cfg

N_TURNS = 200
BATCH = 8


def _write_sessions(path, n):
    """n one-turn sessions: the user's reply thanks (+1) or corrects with a style demand (-1 and a hint)."""
    with open(path, "w") as f:
        for i in range(n):
            a, b = i % 50, (7 * i) % 50
            reply = "thanks, perfect!" if i % 2 else "no, just the number please"
            f.write(json.dumps({"session_id": f"s{i}", "turns": [{
                "type": "main", "prompt": f"What is {a}+{b}?", "response": f"The answer is {a + b}.",
                "next_state": reply}]}) + "\n")


def _judge_all(store, name):
    from clawloop.judge.offline import OfflineJudge

    judge = OfflineJudge()
    for turn in store.turns_to_judge(name, 10 * N_TURNS):
        j = judge.judge_sync(turn)
        j.judge = name
        store.save_judgement(j).result()
    store.flush()


def _recording(tl, trained):
    step = tl.trainer.step

    def record(samples, served_version=None):
        trained.extend(s.turn_id for s in samples)
        return step(samples, served_version=served_version)

    tl.trainer.step = record


def test_train_from_an_imported_store_many_steps_and_a_restart_uses_every_sample_once(random_model_dir, tmp_path):
    """The issue's acceptance test: 200 judged turns imported into a store; `clawloop train` runs 12
    steps, stops (checkpoint), resumes and trains on the rest: >= 10 steps with the version advancing,
    no sample dropped as stale, every judged turn used exactly once across the restart."""
    from clawloop.naming import open_store
    from clawloop.naming import judge_name
    from clawloop.apps.train import build_loop
    from clawloop.trajectories import import_sessions

    flags = dict(train__method="binary", train__rollout_batch_size=str(BATCH), train__lr="1e-3",
                 train__max_staleness="2", train__negative_weight="1")  # every judged turn trains, -1s too
    cfg = make_cfg(random_model_dir, tmp_path, **flags)
    data = tmp_path / "turns.jsonl"
    _write_sessions(data, N_TURNS)
    assert import_sessions(cfg, data) == (N_TURNS, N_TURNS)
    store = open_store(cfg)
    try:
        name = judge_name(cfg)
        _judge_all(store, name)
        judged = {turn.id for _, turn, _ in store.judged_turns(name, 0, 10 * N_TURNS)}
        assert len(judged) == N_TURNS

        trained: list[int] = []
        tl = build_loop(cfg, None, store)
        _recording(tl, trained)
        v0 = tl.trainer.version
        versions = []
        for _ in range(12):
            assert tl.run_once() is True
            versions.append(tl.trainer.version)
            assert tl.trainer.last["train/stale_dropped"] == 0 and tl.trainer.last["train/samples"] == BATCH
        assert versions == list(range(v0 + 1, v0 + 13))
        assert len(tl.pending) < 2 * BATCH, "reading stops once a batch is waiting"
        tl.stop()  # the shutdown checkpoint
        first = list(trained)

        cfg2 = make_cfg(random_model_dir, tmp_path, train__resume_from_checkpoint="latest", **flags)
        tl2 = build_loop(cfg2, None, store)
        assert tl2.resumed_from and tl2.trainer.step_count == 12 and tl2.trainer.version == v0 + 12
        _recording(tl2, trained)
        while tl2.run_once():
            assert tl2.trainer.last["train/stale_dropped"] == 0
        assert tl2.trainer.version == v0 + 25 and tl2.counts["steps"] == 13
        assert len(first) == 96 and len(trained) == N_TURNS
        assert sorted(trained) == sorted(judged), "every judged turn trains exactly once across the restart"
        store.flush()
        assert store.get_cursor("trainer") == tl2.cursor
    finally:
        store.close()


def test_standalone_staleness_is_measured_against_the_data_not_the_trainer(random_model_dir, tmp_path):
    """Without an engine the reference is the newest version read: v0 data trains at trainer v12,
    while tokens older than max_staleness behind the newest data are still masked."""
    from clawloop.records import Sample
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__max_staleness="1")
    tr = Trainer(cfg, str(random_model_dir))
    tr.version = 12
    tok = tr.tokenizer
    prompt = tok.encode("What is 1+2?", add_special_tokens=False)
    resp = tok.encode("3", add_special_tokens=False) + [tok.eos_token_id]

    def sample(version, reward):
        return Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                      rollout_logprobs=[0.0] * (len(prompt) + len(resp)), prompt_len=len(prompt), reward=reward,
                      policy_version=version)

    st = tr.step([sample(0, 1.0), sample(0, -1.0)])
    assert st["train/stale_dropped"] == 0 and st["train/samples"] == 2
    st = tr.step([sample(0, 1.0), sample(5, -1.0), sample(4, 1.0)])  # newest v5: v0 is 5 behind, v4 is 1
    assert st["train/stale_dropped"] == 1 and st["train/samples"] == 2


def _buffer_item(tok, group, k, reward):
    prompt = tok.encode(f"<|im_start|>user\nWhat is {group}+{k}?<|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)
    resp = tok.encode(f"{group + k + 1}", add_special_tokens=False) + [tok.eos_token_id]
    return {"instance_id": f"g{group}", "uid": f"g{group}-{k}", "reward": reward,
            "messages": [{"role": "user", "content": f"What is {group}+{k}?"}],
            "prompt_ids": prompt, "response_ids": resp, "response_logprobs": [-1.5] * len(resp),
            "policy_version": 0}


def test_train_from_a_real_buffer_many_steps_and_a_restart_uses_every_sample_once(random_model_dir, tmp_path):
    """Groups of 4 with continuous rewards through a real rollout buffer, 6 per step, so a pull leaves
    samples waiting: they go into the checkpoint and train after the restart, none twice."""
    from clawloop.buffer import BufferThread
    from clawloop.apps.train import build_loop

    groups, size = 10, 4
    flags = dict(train__method="binary", train__rollout_batch_size="6", train__lr="1e-3",
                 train__max_staleness="1", train__source="buffer", train__buffer_url="http://placeholder",
                 train__n_samples_per_prompt=str(size))
    cfg = make_cfg(random_model_dir, tmp_path, **flags)
    cfg.buffer.port = 0
    srv = BufferThread(cfg).start()
    try:
        cfg.train.buffer_url = srv.url
        tl = build_loop(cfg, None, None)
        tok = tl.trainer.tokenizer
        items = [_buffer_item(tok, g, k, reward=0.1 * ((g + 3 * k) % 7)) for g in range(groups) for k in range(size)]
        httpx.post(srv.url + "/buffer/write_batch", json=items).raise_for_status()
        trained: list[tuple[int, ...]] = []

        def record_into(loop):
            step = loop.trainer.step

            def record(samples, served_version=None):
                trained.extend(tuple(s.tokens) for s in samples)
                return step(samples, served_version=served_version)

            loop.trainer.step = record

        record_into(tl)
        for _ in range(3):
            assert tl.run_once() is True
        assert tl.pending, "a pull of whole groups left samples waiting"
        waiting = {tuple(s.tokens) for s in tl.pending}
        tl.stop()

        cfg2 = make_cfg(random_model_dir, tmp_path, train__resume_from_checkpoint="latest", **flags)
        cfg2.train.buffer_url = srv.url
        tl2 = build_loop(cfg2, None, None)
        assert {tuple(s.tokens) for s in tl2.pending} == waiting, "the waiting samples come back from the checkpoint"
        record_into(tl2)
        while tl2.run_once():
            assert tl2.trainer.last["train/stale_dropped"] == 0
        assert tl2.trainer.step_count >= 6 and tl2.trainer.version == tl2.trainer.step_count
        everything = [tuple(it["prompt_ids"] + it["response_ids"]) for it in items]
        left = [tuple(s.tokens) for s in tl2.pending + tl2.buffer.pull()]  # too few for a batch: not lost
        assert len(trained) == len(set(trained)), "no sample trains twice"
        assert sorted(trained + left) == sorted(everything)
        assert len(left) < 6
    finally:
        srv.stop()


def test_train_service_steps_and_exit_when_idle(random_model_dir, tmp_path, capsys):
    """`clawloop train`'s service: --steps counts this run's steps (a resumed run trains them too), and
    --exit-when-idle stops with a checkpoint once too little is left for a batch."""
    import signal

    from clawloop.naming import open_store
    from clawloop.naming import judge_name
    from clawloop.apps.train import run_train
    from clawloop.trajectories import import_sessions

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="8",
                   train__negative_weight="1")  # every judged turn trains, -1s too
    data = tmp_path / "turns.jsonl"
    _write_sessions(data, 28)
    import_sessions(cfg, data)
    store = open_store(cfg)
    _judge_all(store, judge_name(cfg))
    store.close()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert run_train(cfg, max_steps=2) == 0
        assert run_train(cfg, exit_when_idle=True) == 0  # resumes at step 2, 12 turns left
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
    out = capsys.readouterr().out
    assert "trained 2 step(s) this run" in out and "resumed from" in out and "trained 1 step(s) this run" in out
    assert "4 waiting for a batch" in out
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000003"


def test_train_names_the_judge_flag_when_the_store_was_judged_under_another_name(tmp_path, capsys):
    """`clawloop judge --custom-rm-path X` then `clawloop train` without it: the trainer reads the verdicts
    of `offline`, finds none, and says so naming the flag, instead of waiting silently."""
    from conftest import make_cfg

    from clawloop.apps.train import warn_if_judged_elsewhere
    from clawloop.records import Judgement, Turn
    from clawloop.naming import open_store

    cfg = make_cfg("unused-model", tmp_path)
    store = open_store(cfg)
    try:
        assert warn_if_judged_elsewhere(cfg, store) == ""  # nothing judged yet: nothing to say
        tid = store.add_turn(Turn(session_id="s", index=0, type="main", prompt_ids=[1], response_ids=[2],
                                  response_logprobs=[-0.1], policy_version=0)).result()
        store.save_judgement(Judgement(turn_id=tid, judge="custom:rm.py:reward", score=1)).result()
        store.flush()
        assert store.judge_names() == {"custom:rm.py:reward"}
        msg = warn_if_judged_elsewhere(cfg, store)
        assert "--custom-rm-path rm.py:reward" in msg and "'offline'" in msg
        assert "--custom-rm-path rm.py:reward" in capsys.readouterr().out
        cfg.judge.custom_rm_path = "rm.py:reward"  # the right judge: silent
        assert warn_if_judged_elsewhere(cfg, store) == ""
    finally:
        store.close()


def test_a_backlog_of_stale_batches_is_read_on_without_pausing_between_them(random_model_dir, tmp_path):
    """A batch dropped as stale is consumed, not idle time: the trainer thread reads the next one at
    once. (It used to wait 0.5 s after each, so a backlog of stale turns produced faster than two
    batches a second was never drained and training stopped for good: found with
    `bench/serve_while_training.py --up-arg=--train-publish-interval=8`.) Real trainer thread, real
    store; every wait of the thread is recorded with how many samples had been dropped by then."""
    import threading
    import time

    from clawloop.apps.train import build_loop
    from clawloop.naming import judge_name, open_store
    from clawloop.trajectories import import_sessions

    fresh, stale = 4, 40
    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="4",
                   train__max_staleness="2", train__negative_weight="1")
    data = tmp_path / "turns.jsonl"
    with open(data, "w") as f:  # the newest version first: everything after it is stale against it
        for i in range(fresh + stale):
            f.write(json.dumps({"session_id": f"s{i}", "turns": [{
                "type": "main", "prompt": f"What is {i}+1?", "response": f"The answer is {i + 1}.",
                "policy_version": 10 if i < fresh else 0,
                "next_state": "no, just the number please" if i % 2 else "thanks, perfect!"}]}) + "\n")
    import_sessions(cfg, data)
    store = open_store(cfg)
    try:
        _judge_all(store, judge_name(cfg))
        tl = build_loop(cfg, None, store)

        class Recording(threading.Event):
            waits: list[int] = []

            def wait(self, timeout=None):
                self.waits.append(tl.counts["stale_dropped"])
                return super().wait(timeout)

        tl.stop_event = Recording()
        tl.start()
        deadline = time.time() + 120
        while tl.counts["stale_dropped"] < stale and time.time() < deadline:
            time.sleep(0.05)
        tl.stop(checkpoint=False)
        assert tl.error is None
        assert tl.counts["steps"] == 1 and tl.counts["stale_dropped"] == stale
        assert [w for w in Recording.waits if 0 < w < stale] == []  # no pause while the backlog lasted
    finally:
        store.close()
