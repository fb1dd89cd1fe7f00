"""The honest-benchmark data: the demo's held-out wording and the judge's held-out labelled set are kept
apart from what the tiny model's corpus and the offline judge's rules contain, and the simulated users
really speak them (through a real gateway, into a real store)."""

from __future__ import annotations

import inspect
import json
import random
import re

import pytest

from clawloop.users import THANKS, Wording, heldout_wording, run_user
from clawloop.judge import eval as judge_eval
from clawloop.judge import offline
from clawloop.tinymodel import corpus
from clawloop.tinymodel.corpus import STYLES, fits_style
from conftest import run_cli


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]+", "", text.lower()).strip()


def _corpus_phrases() -> set[str]:
    phrases = set(THANKS) | set(corpus._THANKS)
    for table in (corpus._CORRECTIONS, corpus._INSTRUCTIONS):
        for options in table.values():
            phrases |= set(options)
    return {_norm(p) for p in phrases}


def test_heldout_wording_is_complete_and_in_neither_the_corpus_nor_the_rules():
    data = heldout_wording()
    phrases = list(data["thanks"]) + [c for s in STYLES for c in data["corrections"][s]]
    assert all(data["corrections"][s] for s in STYLES) and len(data["thanks"]) >= 5
    known = _corpus_phrases()
    rules = _norm(inspect.getsource(offline))
    for p in phrases:
        n = _norm(p)
        assert n not in known, f"{p!r} is a corpus phrase"
        assert n not in rules, f"{p!r} is written into the offline judge's rules"
        assert not any(k and k in n for k in known if len(k) > 12), f"{p!r} contains a corpus phrase"


def test_wording_switch_picks_the_phrases():
    rng = random.Random(0)
    held, plain = Wording("heldout"), Wording("corpus")
    assert held.correction("upper", rng) in heldout_wording()["corrections"]["upper"]
    assert held.thanks(rng) in heldout_wording()["thanks"]
    assert plain.correction("upper", rng) in corpus._CORRECTIONS["upper"] and plain.thanks(rng) in THANKS
    with pytest.raises(ValueError, match="wording must be one of"):
        Wording("mine")


def test_simulated_users_speak_the_heldout_wording_into_the_store(gateway):
    """Sessions through the real gateway: every next state the judge will read is a held-out phrase
    (a correction when the answer missed `upper`, else thanks before the next question)."""
    data = heldout_wording()
    client = gateway.client()
    stats = run_user(client, "upper", random.Random(3), "heldout-user", 4, Wording("heldout"))
    assert stats["answers"] == 4
    gateway.store.flush()
    turns = gateway.store.session_turns("heldout-user")
    states = [t.next_state["content"] for t in turns if t.next_state]
    assert len(states) == 3
    for t, state in zip(turns, states):
        if fits_style(t.response_text, "upper"):
            assert any(state.startswith(th) for th in data["thanks"])
        else:
            assert state in data["corrections"]["upper"]


def test_heldout_judge_set_is_separate_from_the_rules_set_and_scored():
    held, rules_set = judge_eval.load_eval_set("heldout"), judge_eval.load_eval_set()
    assert len(held) >= 80 and {ex["label"] for ex in held} == {1, 0, -1}
    assert {ex["next_state"]["role"] for ex in held} == {"user", "tool"}
    def key(ex):
        return str(ex["next_state"]["content"]).casefold().strip().rstrip(".!?").strip()

    seen = {key(ex) for ex in rules_set}
    assert not [ex for ex in held if key(ex) in seen]  # no reply the rules were developed on
    r = run_cli("judge-eval", "--data", "heldout")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(rf"accuracy=\d\.\d{{3}} n={len(held)}", r.stdout.strip().splitlines()[-1])
    assert json.loads(json.dumps(held[0]))["next_state"]  # plain JSON, as shipped
