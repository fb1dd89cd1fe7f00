"""Per-token policy versions: an engine that swaps weights mid-response (vLLM)
yields a Turn whose tokens come from two versions. The versions travel through
the store (old store files migrated), export/import and Sample, and the
trainer bounds staleness per token; TIS already corrects per token because
each token carries the logprob of the weights that sampled it."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest
import torch

from clawloop.records import Judgement, Sample, Turn
from conftest import make_cfg

PROMPT = [5, 6, 7, 8]
RESPONSE = [11, 12, 13, 14, 15]


def mixed_turn(**kw) -> Turn:
    base = dict(session_id="s", index=0, messages=[{"role": "user", "content": "hi"}], prompt_ids=PROMPT,
                response_ids=RESPONSE, response_logprobs=[-1.0, -1.1, -1.2, -1.3, -1.4], response_text="x",
                policy_version=3, response_versions=[3, 3, 4, 4, 4],
                next_state={"role": "user", "content": "no"})
    base.update(kw)
    return Turn(**base)


# ---------------------------------------------------------------------------- Sample


def test_sample_from_turn_aligns_versions_and_keeps_the_oldest():
    s = Sample.from_turn(mixed_turn())
    assert s.rollout_versions == [3, 3, 3, 3] + [3, 3, 4, 4, 4]
    assert len(s.rollout_versions) == len(s.tokens)
    assert s.policy_version == 3 and s.response_versions == [3, 3, 4, 4, 4] and s.mixed_versions
    # one version: no list needed, every token is policy_version
    s = Sample.from_turn(mixed_turn(policy_version=2, response_versions=None))
    assert s.rollout_versions is None and s.response_versions == [2] * 5 and not s.mixed_versions
    # the oldest wins even when the turn's policy_version says otherwise
    assert Sample.from_turn(mixed_turn(policy_version=4, response_versions=[3, 4, 4, 4, 4])).policy_version == 3


def test_sample_from_turn_with_misaligned_versions_counts_every_token_oldest(caplog):
    s = Sample.from_turn(mixed_turn(response_versions=[4, 5]))
    assert s.rollout_versions is None and s.policy_version == 3 and s.response_versions == [3] * 5
    assert "response_versions" in caplog.text


# ---------------------------------------------------------------------------- store

OLD_TURNS = """
CREATE TABLE turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, idx INTEGER NOT NULL,
    choice_index INTEGER NOT NULL DEFAULT 0, type TEXT NOT NULL, messages TEXT NOT NULL, tools TEXT,
    prompt_ids TEXT NOT NULL, response_ids TEXT NOT NULL, response_logprobs TEXT NOT NULL,
    response_text TEXT NOT NULL, tool_calls TEXT, finish_reason TEXT NOT NULL, policy_version INTEGER NOT NULL,
    next_state TEXT, final INTEGER NOT NULL DEFAULT 0, trainable INTEGER NOT NULL DEFAULT 1,
    request_id TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, next_state_at REAL,
    UNIQUE (session_id, idx, choice_index)
);
CREATE TABLE judgements (
    id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id INTEGER NOT NULL REFERENCES turns(id), judge TEXT NOT NULL,
    score INTEGER NOT NULL, votes TEXT NOT NULL, hint TEXT, latency_s REAL NOT NULL, malformed INTEGER NOT NULL,
    created_at REAL NOT NULL, UNIQUE (turn_id, judge)
);
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, created_at REAL NOT NULL, last_seen REAL NOT NULL,
                       closed_at REAL, closed_reason TEXT);
CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def test_store_keeps_versions_and_migrates_an_old_file(tmp_path):
    from clawloop.store import SQLiteStore

    path = tmp_path / "clawloop.db"
    conn = sqlite3.connect(path)  # a store file as the schema without response_versions wrote it
    conn.executescript(OLD_TURNS)
    conn.execute("INSERT INTO turns (session_id, idx, type, messages, prompt_ids, response_ids, response_logprobs, "
                 "response_text, finish_reason, policy_version, next_state, created_at) "
                 "VALUES ('old', 0, 'main', '[]', '[1]', '[2, 3]', '[-1.0, -2.0]', 'x', 'stop', 7, "
                 "'{\"role\": \"user\", \"content\": \"ok\"}', 0)")
    conn.execute("INSERT INTO judgements (turn_id, judge, score, votes, latency_s, malformed, created_at) "
                 "VALUES (1, 'offline', 1, '[1]', 0, 0, 0)")
    conn.commit()
    conn.close()

    store = SQLiteStore(path)
    try:
        cols = [r[1] for r in store._reader().execute("PRAGMA table_info(turns)")]
        assert "response_versions" in cols
        old = store.get_turn(1)
        assert old.response_ids == [2, 3] and old.policy_version == 7 and old.response_versions is None
        tid = store.add_turn(mixed_turn(session_id="new")).result()
        one = store.add_turn(mixed_turn(session_id="one", response_versions=None)).result()
        store.save_judgement(Judgement(turn_id=tid, score=-1, judge="offline")).result()
        assert store.get_turn(tid).response_versions == [3, 3, 4, 4, 4]
        assert store.get_turn(one).response_versions is None
        rows = store.judged_turns("offline", 0, 10)
        assert [(t.session_id, t.response_versions) for _, t, _ in rows] == [("old", None),
                                                                             ("new", [3, 3, 4, 4, 4])]
    finally:
        store.close()
    # opening the migrated file again (a second process, a restart) is a no-op
    again = SQLiteStore(path)
    try:
        assert again.get_turn(tid).response_versions == [3, 3, 4, 4, 4]
    finally:
        again.close()


# ---------------------------------------------------------------------------- export / import


def test_export_and_import_carry_versions(tmp_path, random_model_dir):
    from clawloop.naming import open_store
    from clawloop.trajectories import import_sessions, iter_export

    cfg = make_cfg(random_model_dir, tmp_path / "a")
    store = open_store(cfg)
    store.add_turn(mixed_turn(session_id="mixed"))
    store.add_turn(mixed_turn(session_id="plain", response_versions=None, policy_version=2))
    store.flush()
    lines = list(iter_export(store))
    store.close()
    by_sid = {s["session_id"]: s["turns"][0] for s in lines}
    assert by_sid["mixed"]["response_versions"] == [3, 3, 4, 4, 4] and by_sid["mixed"]["policy_version"] == 3
    assert by_sid["plain"]["response_versions"] is None

    # optional on import: a line without the field, and one with versions but no policy_version
    no_field = dict(by_sid["plain"])
    del no_field["response_versions"]
    no_version = dict(by_sid["mixed"])
    del no_version["policy_version"]
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join(json.dumps({"session_id": sid, "turns": [t]}) for sid, t in
                           (("mixed", by_sid["mixed"]), ("nofield", no_field), ("noversion", no_version))) + "\n")
    cfg2 = make_cfg(random_model_dir, tmp_path / "b")
    assert import_sessions(cfg2, f) == (3, 3)
    store = open_store(cfg2)
    try:
        got = {sid: turns[0] for sid, turns in store.iter_sessions()}
    finally:
        store.close()
    assert got["mixed"].response_versions == [3, 3, 4, 4, 4] and got["mixed"].policy_version == 3
    assert got["nofield"].response_versions is None and got["nofield"].policy_version == 2
    assert got["noversion"].response_versions == [3, 3, 4, 4, 4] and got["noversion"].policy_version == 3


@pytest.mark.parametrize("change,match", [
    ({"response_versions": [3, 4]}, "one per response id"),
    ({"response_versions": [3, "4", 4, 4, 4]}, "list of ints"),
    ({"response_versions": [3, 3, 4, 4, 4], "policy_version": 4}, "oldest"),
    ({"response_versions": [3, 3, 4, 4, 4], "response_ids": None}, "response_ids"),
])
def test_import_rejects_bad_versions(tmp_path, change, match):
    from clawloop.trajectories import ImportError_, parse_sessions

    turn = {"prompt": "hi", "response": "x", "prompt_ids": PROMPT, "response_ids": RESPONSE, "policy_version": 3}
    turn.update(change)
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"session_id": "s", "turns": [turn]}) + "\n")
    with pytest.raises(ImportError_, match=match):
        parse_sessions(f)


# ---------------------------------------------------------------------------- the trainer


def _trainer(random_model_dir, tmp_path, **flags):
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-3", **flags)
    return Trainer(cfg, str(random_model_dir))


def _sample(trainer, versions, reward=1.0, engine_lp=None):
    """A sample on the tiny model: 4 prompt tokens, len(versions) response tokens from `versions`."""
    prompt = trainer.tokenizer.encode("What is 12+7?", add_special_tokens=False)[:4]
    resp = trainer.tokenizer.encode("The answer is 19 ok", add_special_tokens=False)[:len(versions)]
    assert len(prompt) == 4 and len(resp) == len(versions)
    lps = engine_lp if engine_lp is not None else [-1.0] * len(resp)
    return Sample(tokens=prompt + resp, loss_mask=[0] * 4 + [1] * len(resp), rollout_logprobs=[0.0] * 4 + lps,
                  prompt_len=4, reward=reward, policy_version=min(versions),
                  rollout_versions=[versions[0]] * 4 + list(versions))


def test_trainer_masks_stale_tokens_and_drops_samples_with_none_left(random_model_dir, tmp_path):
    """Served v5, max_staleness 1: in a v3→v4→v5 response the v3 tokens leave the loss (the step
    equals one on the same sample with those tokens masked by hand); an all-v3 sample is dropped."""
    trainer = _trainer(random_model_dir, tmp_path, train__max_staleness="1")
    mixed = _sample(trainer, [3, 3, 4, 5, 5])
    stale = _sample(trainer, [3, 3, 3], reward=-1.0)
    stats = trainer.step([mixed, stale], served_version=5)
    assert stats["train/stale_tokens_masked"] == 2 + 3
    assert stats["train/stale_dropped"] == 1 and stats["train/samples"] == 1
    assert stats["train/mixed_version_samples"] == 1
    assert stats["train/tokens"] == 3
    assert stats["train/staleness_2"] == 2  # the histogram counts each sample at its oldest token
    assert mixed.loss_mask == [0] * 4 + [1] * 5, "the caller's sample is not modified"

    by_hand = _trainer(random_model_dir, tmp_path)
    s = _sample(by_hand, [5, 5, 5, 5, 5])
    s.loss_mask = [0] * 4 + [0, 0, 1, 1, 1]
    by_hand.step([s], served_version=5)
    for (k, a), b in zip(trainer.model.state_dict().items(), by_hand.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-7), k

    # a bound wide enough keeps every token
    wide = _trainer(random_model_dir, tmp_path, train__max_staleness="2")
    stats = wide.step([_sample(wide, [3, 3, 4, 5, 5])], served_version=5)
    assert stats["train/stale_tokens_masked"] == 0 and stats["train/tokens"] == 5


def test_mixed_version_sample_gets_per_token_tis_weights(random_model_dir, tmp_path, monkeypatch):
    """Tokens the current weights (v1) sampled carry engine logprob == the trainer's: TIS weight 1.
    Tokens v0 sampled carry v0's logprob, here the trainer's - 0.5: weight e^0.5 each."""
    import clawloop.trainer.core as core

    trainer = _trainer(random_model_dir, tmp_path, train__tis_cap="2.0")
    probe = _sample(trainer, [0, 0, 1, 1, 1])
    tokens = torch.tensor([probe.tokens])
    with torch.no_grad():
        lp, _ = core.token_logprobs(trainer.model, tokens, torch.ones_like(tokens))  # (1, L-1)
    resp_lp = lp[0, 3:].tolist()  # predicted positions of the 5 response tokens
    engine_lp = [resp_lp[0] - 0.5, resp_lp[1] - 0.5] + resp_lp[2:]
    sample = _sample(trainer, [0, 0, 1, 1, 1], engine_lp=engine_lp)

    seen = []

    def spy(old, engine, mask, **kw):
        w, st = tis_weights(old, engine, mask, **kw)
        seen.append((w.detach().clone(), mask.clone()))
        return w, st

    from clawloop.losses import tis_weights

    monkeypatch.setattr(core, "tis_weights", spy)
    stats = trainer.step([sample], served_version=1)
    (w, mask), = seen
    assert mask[0, 3:].tolist() == [1] * 5
    assert w[0, 3:].tolist() == pytest.approx([math.exp(0.5)] * 2 + [1.0] * 3, abs=1e-5)
    assert stats["train/mixed_version_samples"] == 1 and stats["train/stale_tokens_masked"] == 0
    assert stats["train/logprob_diff_abs_mean"] == pytest.approx(2 * 0.5 / 5, abs=1e-5)
