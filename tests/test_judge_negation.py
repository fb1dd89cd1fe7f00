"""The offline judge reads refusals as refusals (issue #27): a negated style demand never becomes a hint for
the refused style, the judge scores the held-out set and the packaged set above their floors with few
wrong-sign verdicts, and the simulated users (RuleUser, corpus and held-out wording) still read right."""

from __future__ import annotations

import asyncio
import inspect
import random
import re

import pytest

from clawloop.judge import eval as judge_eval
from clawloop.judge import offline, style_demand
from clawloop.judge.eval import hint_direction, load_eval_set, wrong_sign
from clawloop.judge.offline import OfflineJudge, classify_next_state, style_hint
from clawloop.judge.style_demand import read_style_demand
from clawloop.tinymodel import corpus
from clawloop.users import THANKS, WRONG, RuleUser, Wording, heldout_wording
from conftest import run_cli

HINT_ROWS = load_eval_set("hint-direction")


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _judge(rows: list[dict]) -> list:
    return asyncio.run(judge_eval.judge_examples(OfflineJudge(), rows))


# ---------------------------------------------------------------- hint direction


@pytest.mark.parametrize("row", HINT_ROWS, ids=[r["next_state"]["content"] for r in HINT_ROWS])
def test_no_hint_contradicts_the_reply_it_came_from(row):
    """Every hint-direction row: never +1, never the instruction of a style the user refused, and exactly the
    implied style's instruction where the row names one ("no capitals" -> lower case)."""
    j = _judge([row])[0]
    assert j.score != 1
    forbidden = {style_hint(s) for s in row["forbid"]}
    assert j.hint not in forbidden, j.hint
    if row["expect"]:
        assert j.hint == style_hint(row["expect"])


def test_hint_direction_set_covers_every_style_plain_and_negated():
    assert len(HINT_ROWS) >= 60
    for style in corpus.STYLES:
        asked = [r for r in HINT_ROWS if r["expect"] == style and r["note"].startswith("asks")]
        refused = [r for r in HINT_ROWS if style in r["forbid"] and r["note"].startswith("refuses " + style)]
        assert len(asked) >= 4 and len(refused) >= 4, style
    report = hint_direction(HINT_ROWS, [j.hint for j in _judge(HINT_ROWS)])
    assert report["contradicting"] == [] and report["expected_hit"] == report["expected"]


_NOUNS = {"upper": ("capitals", "capital letters", "caps", "uppercase"),
          "lower": ("lowercase", "lower case", "small letters"),
          "exclaim": ("exclamation marks", "an exclamation mark", "exclamation points"),
          "sentence": ("a full sentence", "a complete sentence", "a proper sentence"),
          "bare": ("just the number", "only the answer", "one word")}
_REFUSALS = ("no {x}", "without {x}", "don't use {x}", "stop using {x}", "never use {x}", "I don't want {x}",
             "can you not use {x}?", "enough with {x}", "drop {x}", "skip {x}", "why {x}?", "way too many {x}",
             "I never asked for {x}", "get rid of {x}", "leave out {x}", "I hate {x}", "{x}? no thanks",
             "who asked for {x}?", "please, no {x}")
_REQUESTS = ("{x} please", "use {x}", "can you use {x}?", "I want {x}", "you forgot {x}", "I asked for {x}",
             "no, I said {x}", "where's {x}?", "you didn't use {x}", "leave out everything but {x}")


@pytest.mark.parametrize("style", corpus.STYLES)
def test_negation_templates_never_invert_and_requests_keep_their_style(style):
    """Templates written apart from the hint-direction rows, over every style's nouns: a refusal is a
    correction whose hint is never the refused style's instruction; a request (also "you forgot X") gets it."""
    own, others = style_hint(style), {style_hint(s) for s in corpus.STYLES if s != style}
    for x in _NOUNS[style]:
        for template in _REFUSALS:
            text = template.format(x=x)
            if style == "bare" and text.startswith(("no ", "please, no")):
                continue  # "no just the number": "no" is an interjection there
            v = classify_next_state(_user(text), "What is 12+7?", "19")
            assert v.score == -1 and v.hint != own, (text, v)
        for template in _REQUESTS:
            text = template.format(x=x)
            v = classify_next_state(_user(text), "What is 12+7?", "19")
            assert v.score == -1 and v.hint == own and v.hint not in others, (text, v)


@pytest.mark.parametrize("text, style, asked, refused", [
    ("no capitals please", "lower", (), ("upper",)),
    ("lowercase, not uppercase", "lower", ("lower",), ("upper",)),
    ("caps, not lowercase", "upper", ("upper",), ("lower",)),
    ("not a full sentence, just the number", "bare", ("bare",), ("sentence",)),
    ("no exclamation marks", None, (), ("exclaim",)),       # sentence or bare: ambiguous, no style
    ("not just the number, please", None, (), ("bare",)),
    ("no just the number", "bare", ("bare",), ()),          # "no" as an interjection
    ("no I want caps", "upper", ("upper",), ()),
    ("it's not in capitals", "upper", ("upper",), ()),      # a complaint about what is missing asks for it
    ("why is it in capitals?", "lower", (), ("upper",)),    # one about what is there refuses it
    ("without capitals and exclamation marks", "lower", (), ("upper", "exclaim")),
    ("lose the fluff and give me the digits only", "bare", ("bare",), ()),
    ("one word is too blunt, answer in a sentence like a person", "sentence", ("sentence",), ()),
    ("write a sentence about cats", None, (), ()),           # a new request, not a demand about form
    ("in capitals and in a full sentence", None, ("upper", "sentence"), ()),
    ("keine Großbuchstaben bitte", "lower", (), ("upper",)),
    ("不要大写", "lower", (), ("upper",)),
    ("what's the capital of France?", None, (), ()),
    ("translate this sentence into German", None, (), ()),
    ("just the number is fine, thanks", None, (), ()),
])
def test_read_style_demand(text, style, asked, refused):
    d = read_style_demand(text)
    assert (d.style, d.asked, d.refused) == (style, asked, refused)


def test_refusal_without_an_implied_style_keeps_the_users_words():
    assert offline.hint_from_correction("stop adding exclamation points") == "Stop adding exclamation points."
    hint = offline.hint_from_correction("calm down, no exclamation mark")
    assert hint is not None and '"calm down, no exclamation mark"' in hint
    assert offline.hint_from_correction("don't shout at me") == "Don't shout at me."


# ---------------------------------------------------------------- accuracy floors


def _scores(name: str) -> tuple[float, float]:
    rows = load_eval_set(name)
    preds = asyncio.run(judge_eval.evaluate(OfflineJudge(), rows))
    labels = [r["label"] for r in rows]
    return sum(p == lab for p, lab in zip(preds, labels)) / len(rows), wrong_sign(labels, preds) / len(rows)


def test_heldout_accuracy_and_wrong_sign_floors():
    acc, wrong = _scores("heldout")
    assert acc >= 0.80, f"held-out accuracy {acc:.3f} < 0.80"
    assert wrong <= 0.05, f"held-out wrong-sign rate {wrong:.3f} > 0.05"


def test_packaged_accuracy_floor():
    acc, wrong = _scores("default")
    assert acc >= 0.95 and wrong <= 0.01, (acc, wrong)


def test_judge_eval_prints_the_matrix_wrong_sign_and_contradicting_hints():
    r = run_cli("judge-eval", "--data", "hint-direction")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "label\\judge" in out and re.search(r"^wrong_sign=0\.\d{3} \(\d+ of \d+\)$", out, re.M)
    assert re.search(r"^contradicting_hints=0 n=\d+$", out, re.M)
    assert out.strip().splitlines()[-1].startswith("accuracy=")


def test_reply_with_other_numbers_than_the_answer():
    """A short statement with a number the answer did not give doubts it; a question with new numbers is a new
    request; agreeing with the answer is not a correction."""
    ask, said = "What is 7 x 8?", "7 x 8 is 54."
    assert classify_next_state(_user("my calculator says 56"), ask, said).score == -1
    assert classify_next_state(_user("hm, I get 56 on paper"), ask, said).score == -1
    assert classify_next_state(_user("and 15 + 6?"), ask, said).score == 1
    assert classify_next_state(_user("my calculator says 54 too"), ask, said).score != -1


@pytest.mark.parametrize("text", ["what's the capital of Peru?", "pretty sure I get it now", "I'm sure it'll be fine",
                                  "I hate mondays, anyway what's 4 + 4?", "that was too easy, thanks",
                                  "not so bad actually", "Now one for 'sad'", "how do I do this in Rust instead?"])
def test_follow_ups_are_not_read_as_corrections(text):
    assert classify_next_state(_user(text), "What is 17+25?", "The answer is 42.").score != -1


# ---------------------------------------------------------------- the simulated users


def test_rule_user_phrases_read_right():
    """RuleUser's thanks are +1, its "That's wrong."-style replies -1, and with a style correction appended the
    hint is that style's instruction."""
    for thanks in THANKS:
        assert classify_next_state(_user(thanks), "What is 2+3?", "5").score == 1
    rng = random.Random(0)
    for wrong in WRONG:
        assert classify_next_state(_user(wrong), "What is 2+3?", "6").score == -1
        for style in corpus.STYLES:
            text = f"{wrong} {corpus.correction_for(style, rng)}"
            v = classify_next_state(_user(text), "What is 2+3?", "6")
            assert v.score == -1 and v.hint == style_hint(style), text
    user = RuleUser("lower", check_answer=True)
    problem = {"question": "What is 2+3?", "answer": "5"}
    text, ok = user.reply(problem, [{"role": "assistant", "content": "THE ANSWER IS 6."}], rng)
    v = classify_next_state(_user(text), problem["question"], "THE ANSWER IS 6.")
    assert not ok and v.score == -1 and v.hint == style_hint("lower")


def test_heldout_wording_reads_right_without_being_in_the_rules():
    """The demo's held-out wording: every correction -1 with no hint pointing at another style, every thanks
    +1. Its phrases are not written into the judge (tests/test_demo.py checks offline.py; this, the module
    that reads style demands)."""
    data = heldout_wording()
    rules = re.sub(r"[^a-z0-9 ]+", "", inspect.getsource(style_demand).lower())
    for style in corpus.STYLES:
        others = {style_hint(s) for s in corpus.STYLES if s != style}
        for text in data["corrections"][style]:
            v = classify_next_state(_user(text), "What is 2+3?", "5")
            assert v.score == -1 and v.hint not in others, (style, text, v.hint)
            assert re.sub(r"[^a-z0-9 ]+", "", text.lower()).strip() not in rules
    for text in data["thanks"]:
        assert classify_next_state(_user(text), "What is 2+3?", "5").score == 1, text
    held = Wording("heldout")
    assert held.correction("lower", random.Random(1)) in data["corrections"]["lower"]


def test_written_data_stays_apart_from_the_heldout_sets():
    """The hint-direction rows (data this work wrote) share no reply with the held-out judge set or the held-out
    wording, as the packaged set must not (tests/test_demo.py)."""
    def key(text: str) -> str:
        return str(text).casefold().strip().rstrip(".!?").strip()

    held = {key(ex["next_state"]["content"]) for ex in load_eval_set("heldout")}
    wording = heldout_wording()
    held |= {key(t) for t in wording["thanks"]} | {key(c) for s in corpus.STYLES for c in wording["corrections"][s]}
    assert not [r for r in HINT_ROWS if key(r["next_state"]["content"]) in held]


def test_no_heldout_reply_is_written_into_the_rules():
    """No clause of four words or more from a held-out reply or held-out wording phrase appears in the
    judge's source (code, comments or docstrings): the held-out sets stay held out."""
    def norm(text: str) -> str:
        return " ".join(re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split())

    source = norm(inspect.getsource(offline) + inspect.getsource(style_demand))
    wording = heldout_wording()
    replies = [str(ex["next_state"]["content"]) for ex in load_eval_set("heldout")]
    replies += list(wording["thanks"]) + [c for s in corpus.STYLES for c in wording["corrections"][s]]
    for reply in replies:
        for clause in re.split(r"[,.;:!?\n]", reply):
            n = norm(clause)
            if len(n.split()) >= 4 and not n.startswith("traceback"):
                assert n not in source, f"{clause.strip()!r} (held out) is in the judge's source"
