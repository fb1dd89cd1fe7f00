"""The offline judge: accuracy on the packaged labelled set, the demo's simulated
users, tool errors, rephrasings, and the hints it writes."""

from __future__ import annotations

import asyncio
import random

import pytest

from clawloop.judge.eval import evaluate, load_eval_set
from clawloop.judge.offline import (OfflineJudge, classify_next_state, find_error, hint_from_correction,
                                    is_rephrase, style_of_correction)
from clawloop.records import Turn
from clawloop.tinymodel import corpus


def test_packaged_eval_set_is_big_and_varied():
    rows = load_eval_set()
    assert len(rows) >= 200
    labels = {r["label"] for r in rows}
    roles = {r["next_state"]["role"] for r in rows}
    assert labels == {1, 0, -1} and roles == {"user", "tool"}


def test_offline_accuracy_on_packaged_set():
    rows = load_eval_set()
    preds = asyncio.run(evaluate(OfflineJudge(), rows))
    acc = sum(p == r["label"] for p, r in zip(preds, rows)) / len(rows)
    assert acc >= 0.95, f"offline judge accuracy {acc:.3f} < 0.95"


def _user(text):
    return {"role": "user", "content": text}


def _tool(text):
    return {"role": "tool", "content": text}


@pytest.mark.parametrize("style", corpus.STYLES)
def test_every_demo_correction_is_negative_with_the_models_own_instruction(style):
    """The simulated users' corrections score -1 and the hint is exactly the
    instruction the tiny model was trained to follow for that style."""
    rng = random.Random(0)
    seen = {corpus.correction_for(style, rng) for _ in range(200)}
    for text in seen | {t[0].upper() + t[1:] for t in seen}:
        v = classify_next_state(_user(text), "What is 12+7?")
        assert v.score == -1, text
        assert v.hint == corpus.style_instruction(style), text
        assert style_of_correction(text) == style


def test_demo_thanks_and_new_questions_are_positive():
    rng = random.Random(0)
    for _ in range(100):
        q = corpus.sample_question(rng)["question"]
        for thanks in ("Thanks!", "Great, thank you.", "Thank you very much!", "ok thanks"):
            assert classify_next_state(_user(thanks), q).score == 1
            assert classify_next_state(_user(f"{thanks} {q}"), "What is 3+4?").score == 1
        nxt = corpus.sample_question(rng)["question"]
        if nxt != q:
            assert classify_next_state(_user(nxt), q).score == 1, (q, nxt)
        assert classify_next_state(_user(q), q).score == -1, q  # asked again: the answer missed


@pytest.mark.parametrize("prev, reply, same", [
    ("What's the population of Tokyo?", "What is the population of Tokyo?", True),
    ("How do I delete a branch in git?", "how to delete a git branch", True),
    ("Name three primary colors.", "Name three primary colours please.", True),
    ("What is 3 + 4?", "What is 3 + 4?", True),
    ("What is 4+3?", "What is 3+4?", False),
    ("What is 12+7?", "What is 12-7?", False),
    ("What is the capital of France?", "What is the capital of Spain?", False),
    ("How many legs does a spider have?", "How many legs does a dog have?", False),
    ("Make a list of squares", "Now sort the list", False),
    (None, "anything", False),
])
def test_is_rephrase(prev, reply, same):
    assert is_rephrase(reply, prev) is same


@pytest.mark.parametrize("content, score", [
    ('{"error": null, "rows": 3}', 1),
    ('{"ok": false, "error": "quota"}', -1),
    ('{"exit_code": 0, "stdout": "done"}', 1),
    ('{"exit_code": 1, "stderr": "boom"}', -1),
    ("Build finished. 0 errors, 3 warnings.", 1),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nZeroDivisionError: division by zero", -1),
    ("", 0),
    ("null", 0),
    ("[]", 1),
    ("exit status 2", -1),
    ("42", 1),
])
def test_tool_results(content, score):
    assert classify_next_state(_tool(content)).score == score


def test_tool_error_hint_quotes_the_error_line():
    v = classify_next_state(_tool("Traceback (most recent call last):\n  File \"m.py\", line 3\n"
                                  "KeyError: 'city'"))
    assert v.score == -1 and "KeyError: 'city'" in v.hint
    assert find_error("all good") is None


@pytest.mark.parametrize("text, hint", [
    ("no, I meant Celsius, not Fahrenheit", "The user meant Celsius, not Fahrenheit."),
    ("That's not what I asked for. I wanted a bash script.", "The user wants a bash script."),
    ("Use TypeScript instead of JavaScript, please", "Use TypeScript instead of JavaScript."),
    ("you forgot to close the file", "Don't forget to close the file."),
    ("can you make it shorter?", "Keep the answer shorter and simpler."),
    ("try again", None),
    ("That is incorrect, try again.", None),  # no direction: a teacher told only this avoids its best guess
    ("No, that's not right.", None),
    ("Bitte nur die Zahl.", corpus.style_instruction("bare")),
])
def test_hint_from_correction(text, hint):
    assert hint_from_correction(text) == hint


def test_a_rejection_that_asks_the_question_again_has_no_hint():
    """"That is incorrect, try again." plus the question asked again says nothing a teacher could follow; the
    hinted tiny model, told its previous answer was wrong without being shown it, named the right fact or
    result for 2 of 32 questions (bench/hint_teacher.py, RESULTS "Why the loop made the model worse" 13)."""
    q = "What is the opposite of open?"
    assert hint_from_correction(f"That is incorrect, try again. {q}", q) is None
    assert hint_from_correction(f"That is incorrect, try again. {q}") is not None  # not the question asked
    assert hint_from_correction("That's wrong. Please answer in a full sentence.") == "Reply in a full sentence."


def test_generic_correction_quotes_the_user():
    h = hint_from_correction("That's wrong, 7 × 8 is 56.")
    assert h is not None and "7 × 8 is 56" in h


def test_positive_and_ambiguous_turns_have_no_hint():
    assert classify_next_state(_user("Thanks, that worked!")).hint is None
    assert classify_next_state(_user("ok")).score == 0
    assert classify_next_state(_user("   ")).score == 0
    assert classify_next_state(None).score == 0


def test_offline_judge_on_a_turn():
    turn = Turn(session_id="s", index=0, id=7, messages=[{"role": "user", "content": "What is 5+7?"}],
                response_text="The answer is 12.", next_state=_user("just the number, please"))
    j = asyncio.run(OfflineJudge().judge(turn))
    assert (j.turn_id, j.score, j.votes, j.malformed, j.judge) == (7, -1, [-1], 0, "offline")
    assert j.hint == corpus.style_instruction("bare")
    assert OfflineJudge(hints=False).judge_sync(turn).hint is None
