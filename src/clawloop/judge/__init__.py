"""The judge: score each captured main turn from its next state (+1 / -1 / 0), with
majority voting and OPD hints, and write Judgements to the store.

Judges (all `Judge`: `name` + `async judge(turn) -> Judgement`):
    offline   rules over the text, no LLM, no network (the default)     offline.py
    url       any OpenAI-compatible endpoint                            llm.py
    self      the served policy engine, in-process                      llm.py
    frozen    a frozen copy of the base model, loaded by clawloop       llm.py
    custom    `--custom-rm-path file.py:fn`: reward(turn), OpenClaw-RL's  custom.py
              get_reward_model(config), slime's reward_func(args, sample)

`JudgeLoop` (loop.py) feeds them from the store with K workers, retries and
never drops a turn; `clawloop.apps` runs it beside serving (`clawloop up`) or
alone on a store (`clawloop judge`). `clawloop judge-eval` (eval.py) scores a
judge on a labelled set.
"""

from clawloop.judge.base import Judge, JudgeUnavailable
from clawloop.judge.eval import judge_eval_main
from clawloop.judge.loop import JudgeLoop, judge_name, local_frozen_engine, make_judge
from clawloop.judge.offline import OfflineJudge, classify_next_state, hint_from_correction

__all__ = [
    "Judge", "JudgeUnavailable", "JudgeLoop", "OfflineJudge", "classify_next_state", "hint_from_correction",
    "judge_eval_main", "judge_name", "local_frozen_engine", "make_judge",
]
