"""Hint candidates end to end: an LLM judge whose votes give several hints stores all of them, the
trainer reads them back with the turn, `--hint-selection overlap` chooses among them; and a
continuous reward written by a judge reaches the trainer's advantages as it is."""

from __future__ import annotations

import asyncio

import pytest

from clawloop.records import Judgement, Turn
from conftest import make_cfg

HINTS = ["Answer with just the number.", "Reply in capital letters only, with nothing else.", "Be short."]


class ScriptedBackend:
    """A chat backend that answers the judge's prompts in order from a script (the judge's own parsing runs)."""

    def __init__(self, replies):
        self.replies = list(replies)

    async def complete(self, messages, *, temperature, max_tokens):
        return self.replies.pop(0)

    async def close(self):
        pass


def _turn(tok, sid):
    from clawloop.gateway.render import render_prompt

    msgs = [{"role": "user", "content": "What is 12+7?"}]
    resp = tok.encode("The answer is 19.", add_special_tokens=False) + [tok.eos_token_id]
    return Turn(session_id=sid, index=0, messages=msgs, prompt_ids=render_prompt(tok, msgs, None),
                response_ids=resp, response_logprobs=[-1.0] * len(resp), response_text="The answer is 19.",
                next_state={"role": "user", "content": "no, just the number"})


def test_judge_hint_candidates_reach_the_trainer_and_overlap_chooses(random_model_dir, tmp_path):
    from clawloop.judge.llm import LLMJudge
    from clawloop.naming import open_store
    from clawloop.trainer import Trainer, TrainerLoop

    cfg = make_cfg(random_model_dir, tmp_path, train__method="opd", train__hint_selection="overlap",
                   train__rollout_batch_size="2", train__hint_overlap_topk="4")
    trainer = Trainer(cfg, str(random_model_dir))
    store = open_store(cfg)
    try:
        votes = ["\\boxed{-1}"] * 3
        hint_replies = [f"[HINT_START]{h}[HINT_END] \\boxed{{1}}" for h in HINTS]
        judge = LLMJudge(ScriptedBackend((votes + hint_replies) * 2), name="llm", votes=3)
        for sid in ("a", "b"):
            tid = store.add_turn(_turn(trainer.tokenizer, sid)).result()
            j = asyncio.run(judge.judge(store.get_turn(tid)))
            j.turn_id = tid
            assert j.score == -1 and j.hint == HINTS[1] and set(j.hint_candidates) == set(HINTS[:2])  # "Be short." < 10
            store.save_judgement(j).result()
        (_, turn, got), _ = store.judged_turns("llm", 0, 10)
        assert got.hint_candidates == j.hint_candidates and got.hint == HINTS[1]

        tl = TrainerLoop(cfg, trainer, store, None, "llm")
        chosen = []
        pick = trainer.choose_hints

        def record(samples):
            hints, stats = pick(samples)
            chosen.extend(hints)
            return hints, stats

        trainer.choose_hints = record
        assert tl.run_once() is True
        assert trainer.last["train/hint_multi_candidate_samples"] == 2 and 0 < trainer.last["train/hint_overlap"] <= 1
        assert len(chosen) == 2 and set(chosen) <= set(HINTS[:2])
    finally:
        store.close()


def test_a_judges_continuous_reward_is_the_advantage(random_model_dir, tmp_path):
    """A custom reward's 0.3 (score +1, reward 0.3) trains as 0.3: the store keeps it, the sample carries
    it, the advantage is it."""
    from clawloop.naming import open_store
    from clawloop.trainer import Trainer, TrainerLoop

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="1")
    trainer = Trainer(cfg, str(random_model_dir))
    store = open_store(cfg)
    try:
        tid = store.add_turn(_turn(trainer.tokenizer, "r")).result()
        store.save_judgement(Judgement(turn_id=tid, score=1, reward=0.3, judge="custom")).result()
        tl = TrainerLoop(cfg, trainer, store, None, "custom")
        assert tl.run_once() is True
        assert trainer.last["train/score_mean"] == pytest.approx(0.3)
        assert trainer.last["train/combine_adv_mean"] == pytest.approx(0.3)
    finally:
        store.close()


@pytest.mark.parametrize("retry_weight", ["0", "1"])
def test_an_answer_after_a_correction_trains_by_retry_weight(random_model_dir, tmp_path, retry_weight):
    """Session a: its first answer judged -1 (the user corrected it), its second +1; session b: a first
    answer +1. The second answer of a follows a correction: its RL score is scaled by `--retry-weight`
    (0: not trained by RL, still in the baseline; 1, the default: as any turn); b's first answer trains
    either way."""
    from clawloop.naming import open_store
    from clawloop.trainer import Trainer, TrainerLoop

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="2",
                   train__retry_weight=retry_weight)
    trainer = Trainer(cfg, str(random_model_dir))
    store = open_store(cfg)
    try:
        ids = []
        for sid, index, score in (("a", 0, -1), ("a", 1, 1), ("b", 0, 1)):
            t = _turn(trainer.tokenizer, sid)
            t.index = index
            ids.append(store.add_turn(t).result())
            store.save_judgement(Judgement(turn_id=ids[-1], score=score, judge="offline")).result()
        tl = TrainerLoop(cfg, trainer, store, None, "offline")
        tl.fetch()
        assert tl.counts["retry_answers"] == 1 and list(trainer.reward_history) == [-1.0, 1.0, 1.0]
        assert [(s.turn_id, s.rl_weight) for s in tl.pending] == (
            [(ids[2], 1.0)] if retry_weight == "0" else [(ids[1], 1.0), (ids[2], 1.0)])
        if retry_weight == "0":
            return
        weighted = [*tl.pending]
        weighted[0] = type(weighted[0])(**{**weighted[0].__dict__, "rl_weight": 0.5})
        assert trainer.rl_scores(weighted)[0][0] == pytest.approx(trainer.rl_scores(tl.pending)[0][0] * 0.5)
    finally:
        store.close()


def test_retry_weight_outside_0_1_is_a_config_error_naming_the_key(random_model_dir, tmp_path):
    from clawloop.config import ConfigError

    with pytest.raises(ConfigError, match="train.retry_weight"):
        make_cfg(random_model_dir, tmp_path, train__retry_weight="1.5")
