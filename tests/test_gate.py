"""The publish gate (trainer/gate.py): the regression set's checkers, the built-in checks of the
tiny model, a passing candidate published and a refused one rolled back (weights, AdamW state,
version; under LoRA with the adapter on), and end to end: users whose reward plugin pays for WRONG
answers drive training at a high learning rate through the real gateway, judge loop and trainer,
and the served model stays the one that was right: no version past the start is published, the
refusals are counted on /metrics, /health, the dashboard's JSON and `clawloop status`."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from clawloop.config import ConfigError, load_config
from clawloop.trainer.gate import (
    Check,
    PublishGate,
    builtin_checks,
    gate_checks,
    is_tiny_model,
    load_regression_set,
    score_checks,
)
from conftest import ServerThread, make_cfg

CHECKS_PY = '''
def exact_19(reply, case):
    return reply == case["want"]

def half(reply):
    return 0.5

def three(a, b, c):
    return 1
'''


@pytest.fixture(scope="module")
def tiny_dir():
    from clawloop.tinymodel.build import default_model_dir

    d = default_model_dir()
    assert is_tiny_model(d), d
    return d


def _write(tmp_path, lines, name="set.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return p


# -- checkers ------------------------------------------------------------------------------------------
def test_checkers_exact_regex_and_functions_by_path(tmp_path, monkeypatch):
    (tmp_path / "checks.py").write_text(CHECKS_PY)
    (tmp_path / "gatepkg").mkdir()
    (tmp_path / "gatepkg" / "__init__.py").write_text("")
    (tmp_path / "gatepkg" / "mod.py").write_text(CHECKS_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    f = _write(tmp_path, [
        {"prompt": "What is 12+7?", "answer": "19"},
        {"prompt": "Capital of France?", "regex": r"(?i)\bparis\b", "group": "facts"},
        "",  # blank lines are skipped
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
         "check": f"{tmp_path / 'checks.py'}:exact_19", "want": "19", "max_tokens": 5},
        {"system": "Be brief.", "prompt": "q", "check": "gatepkg.mod:half", "group": "partial"},
    ])
    checks = load_regression_set(f, max_tokens=24)
    assert [c.group for c in checks] == ["user", "facts", "user", "partial"]
    assert [c.max_tokens for c in checks] == [24, 24, 5, 24]
    assert checks[3].messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]
    assert [c.score(r) for c, r in zip(checks, [" 19 ", "It is Paris.", "19", "x"])] == [1.0, 1.0, 1.0, 0.5]
    assert [c.score(r) for c, r in zip(checks, ["19.", "Parisian", "19 ", "y"])] == [0.0, 0.0, 0.0, 0.5]
    # group means; a checker that raises scores 0 on that check instead of stopping the trainer
    boom = Check("user", [], lambda r: 1 / 0, 8, "boom")
    assert score_checks(checks + [boom], ["19", "Paris", "no", "x", "x"]) == {"user": pytest.approx(1 / 3),
                                                                            "facts": 1.0, "partial": 0.5}


@pytest.mark.parametrize("line,words", [
    ({"prompt": "q", "check": "no_such_file.py:fn"}, ["no such file", "no_such_file.py"]),
    ({"prompt": "q", "check": "CHECKS:missing"}, ["has no attribute 'missing'", "exact_19"]),
    ({"prompt": "q", "check": "CHECKS:three"}, ["fn(reply, case) or fn(reply)"]),
    ({"prompt": "q", "check": "no_such_pkg_xyz.mod:fn"}, ["cannot import module"]),
    ({"prompt": "q"}, ["exactly one checker", "none"]),
    ({"prompt": "q", "answer": "1", "regex": "1"}, ["exactly one checker", "answer, regex"]),
    ({"prompt": "q", "regex": "(unclosed"}, ["does not compile"]),
    ({"answer": "1"}, ["\"prompt\""]),
    ({"prompt": "q", "answer": "1", "max_tokens": 0}, ["max_tokens"]),
    ("not json", ["not a JSON object"]),
])
def test_a_bad_line_names_the_key_the_file_and_the_line(tmp_path, line, words):
    (tmp_path / "checks.py").write_text(CHECKS_PY)
    if isinstance(line, dict) and "check" in line:
        line = {**line, "check": line["check"].replace("CHECKS", str(tmp_path / "checks.py"))}
    f = _write(tmp_path, [{"prompt": "fine", "answer": "1"}, line])
    with pytest.raises(ConfigError) as e:
        load_regression_set(f, max_tokens=8)
    msg = str(e.value)
    assert "gate.regression_set" in msg and f"{f.name}:2" in msg, msg
    for w in words:
        assert w in msg, msg


def test_config_keys_and_the_default_sets(tmp_path, tiny_dir, random_model_dir):
    with pytest.raises(ConfigError, match="gate.regression_set: no such file"):
        load_config({"gate__regression_set": str(tmp_path / "missing.jsonl")}, env={})
    with pytest.raises(ConfigError, match="gate.tolerance"):
        load_config({"gate__tolerance": "-0.1"}, env={})
    empty = _write(tmp_path, [""], "empty.jsonl")
    with pytest.raises(ConfigError, match="gate.regression_set: .*holds no checks"):
        gate_checks(load_config({"gate__regression_set": str(empty)}, env={}), tiny_dir)
    cfg = load_config({}, env={})
    assert cfg.gate.enabled and cfg.gate.tolerance == 0.05 and cfg.gate.builtin == "auto"
    # sampled checks (4 a check at temperature 1), a line search of 3 retries; each key's bad value named
    assert (cfg.gate.samples, cfg.gate.temperature, cfg.gate.retries) == (4, 1.0, 3)
    for key, bad in (("samples", "-1"), ("retries", "-1"), ("temperature", "0")):
        with pytest.raises(ConfigError, match=f"gate.{key}"):
            load_config({f"gate__{key}": bad}, env={})
    # the tiny model: held-out arithmetic, its corpus's 50 facts and instruction following; another model:
    # nothing built in
    # (8 rounds of 64 a group: each candidate is read on the next round)
    checks = gate_checks(cfg, tiny_dir)
    assert [sum(c.group == g for c in checks) for g in ("arithmetic", "facts", "instructions")] == [512, 50, 512]
    assert gate_checks(cfg, random_model_dir) == []
    assert len(gate_checks(load_config({"gate__builtin": "on", "gate__rotations": "1"}, env={}), random_model_dir)) == 178
    assert gate_checks(load_config({"gate__enabled": "false"}, env={}), tiny_dir) is None
    user = _write(tmp_path, [{"prompt": "q", "answer": "a"}])
    assert [c.group for c in gate_checks(load_config({"gate__regression_set": str(user)}, env={}),
                                         random_model_dir)] == ["user"]
    # the built-in arithmetic questions are held out of the tiny model's corpus
    from clawloop.tinymodel.corpus import is_heldout

    assert all(is_heldout(c.messages[-1]["content"]) for c in builtin_checks(16, 8) if c.group == "arithmetic")


def test_each_candidate_is_read_on_fresh_questions_against_their_own_baseline():
    """`rounds`: every group's next checks in turn, a small group whole every time; the gate holds each
    candidate to the start's score on the same round (a set read at every decision is one the line search
    learns to pass: bench/RESULTS.md "Why the loop made the model worse" 9)."""
    from clawloop.trainer.gate import rounds

    checks = builtin_checks(3 * 4, 8)  # 12 arithmetic, 12 facts, 12 instructions
    rs = rounds(checks, 4)
    assert len(rs) == 3 and all(len(r) == 12 for r in rs)
    arith = [[c.source for c in r if c.group == "arithmetic"] for r in rs]
    assert len({s for a in arith for s in a}) == 12  # 3 disjoint rounds of 4 cover the 12
    small = [Check("user", [{"role": "user", "content": "q"}], lambda r: 1.0, 8, "u")]
    assert all(sum(c.group == "user" for c in r) == 1 for r in rounds(checks + small, 4))  # whole every time
    assert rounds(checks, 0) == [checks] and rounds([], 4) == []

    class Fake:  # a model whose score is its round's: the gate must compare like with like
        def __init__(self):
            self.version, self.lr, self.model, self.step_count = 0, 1e-3, None, 0
            self.opt = type("Opt", (), {"param_groups": [{}]})()

    gate = PublishGate(checks, 0.05, per_group=4)
    seen = []
    gate.score = lambda trainer, cs=None: (seen.append(cs), {"arithmetic": 0.5 + 0.1 * rs.index(cs), "facts": 1.0,
                                                             "instructions": 1.0})[1]
    gate.keep = gate.roll_back = lambda trainer: None
    gate.begin(Fake())
    assert [b["arithmetic"] for b in gate.baselines] == pytest.approx([0.5, 0.6, 0.7])
    assert gate.baseline["arithmetic"] == pytest.approx(0.6)
    # read against the mean (0.6), every first-round candidate (0.5) would be refused; held to its own round's
    # baseline, each passes, and each published version moves to the next round
    assert all(gate.check(Fake()) for _ in range(6))
    assert seen[3:] == rs + rs
    # a refused candidate's retries are read on its round again, not on a new one until one is lenient (after the
    # first refusal the served weights, back in the trainer, are read there once: they pass it)
    gate.roll_back = lambda trainer: setattr(trainer, "served", True)
    gate.score = lambda trainer, cs=None: (seen.append(cs), {"arithmetic": 1.0 if getattr(trainer, "served", False)
                                                             else 0.0, "facts": 1.0, "instructions": 1.0})[1]
    assert not any(gate.check(Fake()) for _ in range(4))
    assert seen[9:] == [rs[0]] * 5 and gate.counts["passed_on_served"] == 0


def test_a_candidate_that_passes_its_round_must_pass_the_next_one_too():
    """`gate.confirm` (--gate-confirm, off by default): the line search keeps the first candidate of a version that passes its
    round, so where most candidates lose more than the tolerance the one kept is the one whose loss that
    round's questions missed (a student's run: a version read at -0.02 on its round had lost 0.07 of other
    sums, RESULTS "Why the loop made the model worse" 14). It is read on the next round as well, which played
    no part in choosing it, and refused if it fails there; the served weights are then read on that round (a
    round that fails them too holds candidates to them, as on the first)."""
    from clawloop.trainer.gate import rounds

    checks = builtin_checks(3 * 4, 8)
    rs = rounds(checks, 4)

    class Fake:  # a candidate that reads reads[r] on round r
        def __init__(self, *reads, version=1):
            self.version, self.lr, self.model, self.step_count, self.reads = version, 1e-3, None, 0, reads
            self.opt = type("Opt", (), {"param_groups": [{}]})()

    def make(confirm):
        gate = PublishGate(checks, 0.05, per_group=4, confirm=confirm)
        seen = []
        gate.score = lambda trainer, cs=None: (seen.append(rs.index(cs)), {
            "arithmetic": trainer.reads[rs.index(cs)], "facts": 1.0, "instructions": 1.0})[1]
        gate.keep = lambda trainer: setattr(gate, "snapshot", type("Snap", (), {"version": trainer.version})())
        gate.roll_back = lambda trainer: setattr(trainer, "reads", (0.90, 0.90, 0.90))  # the served weights
        gate.begin(Fake(0.90, 0.90, 0.90, version=0))
        return gate, seen

    lucky = (0.86, 0.80, 0.90)  # within the tolerance on round 0 only
    gate, seen = make(confirm=False)
    assert gate.check(Fake(*lucky)) and seen[3:] == [0]  # without confirmation: published on round 0
    gate, seen = make(confirm=True)
    assert not gate.check(Fake(*lucky))  # refused on round 1, then the served weights read there
    assert seen[3:] == [0, 1, 1] and gate.counts["refused_on_confirmation"] == 1 and gate.counts["confirmations"] == 1
    assert gate.last.worst == "arithmetic" and gate.last.held_to["arithmetic"] == 0.90
    assert gate.check(Fake(0.86, 0.88, 0.50))  # passes both (round 2 is not read): published
    assert seen[6:] == [0, 1] and gate.counts["passed"] == 1 and gate.counts["confirmations"] == 2
    assert gate.passed_drops[1]["arithmetic"] == pytest.approx((0.04 + 0.02) / 2)  # its drop over both rounds
    gate.snapshot = type("Snap", (), {"version": 1})()
    assert gate.check(Fake(0.90, 0.87, 0.86, version=2)) and seen[8:] == [1, 2]  # v2: round 1, confirmed on 2
    assert make(confirm=True)[0].check(Fake(0.86, 0.88, 0.50)) and PublishGate(checks, 0.05, confirm=True).rounds == [checks]
    # a harder draw on the confirming round: 0.07 down there, 0.02 on its own round, 0.045 over the two (held_to's
    # rule): served, and that reading is the served version's on the round its successors are read on (no vet)
    gate, seen = make(confirm=True)
    assert gate.check(Fake(0.88, 0.83, 0.50)) and gate.counts["refused_on_confirmation"] == 0
    assert gate.served[(1, 1)]["arithmetic"] == 0.83 and gate.passed_drops[1]["arithmetic"] == pytest.approx(0.045)
    # its successors, read on that round, are held to its reading there less the 0.005 it left (at least 0.01) (its reading
    # there is weighed against its other round alone, as when it was confirmed: not counted twice)
    gate.snapshot = type("Snap", (), {"version": 1})()
    assert not gate.check(Fake(0.815, 0.815, 0.90, version=2)) and gate.last.held_to["arithmetic"] == 0.83
    assert gate.check(Fake(0.826, 0.826, 0.90, version=2))  # 0.004 below it; round 2 within the tolerance
    assert not make(confirm=True)[0].check(Fake(0.88, 0.81, 0.50))  # 0.09 and 0.02: 0.055 over the two, refused


def test_a_round_that_fails_the_served_version_holds_candidates_to_it():
    """A version passes its round; the next round reads the served weights themselves beyond the tolerance
    (a harder draw of questions, or a loss its own round did not show). Held to that round's baseline, every
    candidate near the served weights would be refused, and serving would stay there for good (the persona
    evaluation stalled so, at 3 and at 11 versions: RESULTS "Why the loop made the model worse" 10). There, a
    candidate must read at least as well as the served version instead; in the groups the served version
    still passes, and on the next round, the baseline holds again."""
    checks = builtin_checks(2 * 4, 8)
    rs = __import__("clawloop.trainer.gate", fromlist=["rounds"]).rounds(checks, 4)

    class Fake:  # a candidate (or the served weights) that reads `arith` on every round
        def __init__(self, arith, version):
            self.version, self.lr, self.model, self.step_count, self.arith = version, 1e-3, None, 0, arith
            self.opt = type("Opt", (), {"param_groups": [{}]})()

    served = {}
    gate = PublishGate(checks, 0.05, per_group=4)
    gate.score = lambda trainer, cs=None: {"arithmetic": trainer.arith, "facts": 1.0, "instructions": 1.0}

    def keep(trainer):
        served.update(arith=trainer.arith, version=trainer.version)
        gate.snapshot = type("Snap", (), {"version": trainer.version})()

    gate.keep = keep
    gate.roll_back = lambda trainer: setattr(trainer, "arith", served["arith"])
    gate.begin(Fake(0.90, 0))  # baseline 0.90 on both rounds
    assert gate.check(Fake(0.86, 1))  # round 0: within the tolerance
    keep(Fake(0.86, 1))
    # round 1 reads the served v1 at 0.86, within the tolerance: the baseline holds
    assert not gate.check(Fake(0.84, 2)) and gate.last.held_to["arithmetic"] == 0.90
    assert gate.served[(1, 1)]["arithmetic"] == 0.86
    assert gate.check(Fake(0.88, 2)) and gate.passed_drops[2]["arithmetic"] == pytest.approx(0.02)
    keep(Fake(0.83, 2))  # v2 read 0.88 on round 1; on round 0, where v3 is read, it reads 0.83
    assert not gate.check(Fake(0.83, 3))  # 0.83 vs 0.90: refused; then the served v2 is read there: 0.83
    assert gate.served[(2, 0)]["arithmetic"] == 0.83
    # v2's drop, 0.07 here and 0.02 on its own round, is 0.045 on the two: a harder round, held to v2's 0.83
    assert not gate.check(Fake(0.815, 3))  # worse than served by more than MIN_SLACK (0.01): refused
    assert gate.last.held_to["arithmetic"] == 0.83 and gate.last.held_to["facts"] == 1.0
    assert gate.check(Fake(0.83, 3)) and gate.counts["passed_on_served"] == 1  # no worse than served: published
    keep(Fake(0.83, 3))
    assert not gate.check(Fake(0.84, 4)) and gate.last.held_to["arithmetic"] == 0.90  # round 1: the baseline again
    # a real loss is not ratcheted on: v3, published on v2's reading (its drop 0.07), reads 0.83 on round 1 too:
    # 0.07 on the two, so v4 is held to the baseline (and passes at 0.86); v4 then reads 0.80 on round 0 (0.10,
    # and 0.04 on its own round: 0.07), so v5's candidates stay held to the baseline there
    assert gate.served[(3, 1)]["arithmetic"] == 0.83 and gate.check(Fake(0.86, 4)) is True
    keep(Fake(0.80, 4))
    assert not gate.check(Fake(0.80, 5)) and gate.served[(4, 0)]["arithmetic"] == 0.80
    assert not gate.check(Fake(0.80, 5)) and gate.last.held_to["arithmetic"] == 0.90


class WeightTrainer:
    """A trainer whose one weight says which version's weights it holds (real tensors and AdamW state, for
    Snapshot and Weights)."""

    def __init__(self):
        self.params = [torch.zeros(2, requires_grad=True)]
        self.opt = torch.optim.AdamW(self.params, lr=1e-3)
        self.version, self.lr, self.model, self.step_count = 0, 1e-3, None, 0

    def train_to(self, w):  # a step: AdamW state moves, the weights become w's
        self.params[0].grad = torch.ones(2)
        self.opt.step()
        with torch.no_grad():
            self.params[0].fill_(w)
        self.version += 1
        return self


def test_a_served_version_found_beyond_the_tolerance_is_replaced_by_the_last_good_one():
    """A version passes its round at the tolerance's edge; the next round reads the served weights beyond the
    tolerance, and over its two rounds too: a real loss (a student's run stalled there for 34 refusals, every
    candidate near the served weights reading as badly: RESULTS "Why the loop made the model worse" 14d). The
    gate publishes, as a new version, the last version before it that passed against the baseline if that
    reads within the tolerance here (else the weights served at start), and the trainer goes on from it. A
    harder round (the served version within the tolerance over its two rounds) still holds candidates to the
    served version instead; real weights and AdamW state through Snapshot and Weights."""
    from clawloop.trainer.gate import rounds

    checks = builtin_checks(3 * 4, 8)
    rs = rounds(checks, 4)
    reads = {0: (0.90, 0.90, 0.90), 1: (0.86, 0.88, 0.78), 2: (0.75, 0.87, 0.72), 3: (0.70, 0.70, 0.70),
             4: (0.89, 0.89, 0.89), 5: (0.89, 0.89, 0.82)}  # weights w -> its reading on rounds 0, 1, 2

    def make():
        gate = PublishGate(checks, 0.05, per_group=4)
        gate.score = lambda trainer, cs=None: {"arithmetic": reads[int(trainer.params[0][0])][rs.index(cs)],
                                               "instructions": 1.0}
        t = WeightTrainer()
        gate.begin(t)
        return gate, t

    gate, t = make()
    assert gate.check(t.train_to(1)) and t.version == 1  # round 0: 0.86, within
    gate.keep(t)
    assert gate.check(t.train_to(2)) and t.version == 2  # round 1: 0.87
    gate.keep(t)
    assert [w.version for w in gate.clean] == [0, 1] and gate.start.version == 0
    # round 2: the candidate is refused; the served v2 reads 0.72 there (0.18 down, 0.105 over its two rounds)
    assert gate.check(t.train_to(3)) and gate.counts["fallbacks"] == 1 and gate.counts["refused"] == 1
    # v1's weights read 0.78 on round 2 (0.12; 0.08 with its 0.04 on round 0): beyond too; the start's are published
    assert float(t.params[0][0].detach()) == 0.0 and t.version == 3 and gate.lost == {1, 2}
    assert gate.last.passed and gate.last.version == 3 and gate.last.scores["arithmetic"] == 0.90
    assert t.opt.state_dict()["state"][0]["step"] == 2  # the served version's AdamW state, not the start's
    gate.keep(t)
    assert [w.version for w in gate.clean] == [0, 1]  # v2 (lost) is not a fallback; v1 (lost) is not tried again
    assert gate.check(t.train_to(4)) and gate.last.held_to["arithmetic"] == 0.90  # round (2 + 1) % 3 = 0
    gate.keep(t)
    assert [w.version for w in gate.clean] == [0, 1, 3] and gate.passed_drops[3]["arithmetic"] == pytest.approx(0.0)

    gate, t = make()
    for w in (4, 5):  # v1 passes round 0 (0.89), v2 passes round 1 (0.89)
        assert gate.check(t.train_to(w))
        gate.keep(t)
    # round 2: the served v2 reads 0.82 (0.08; 0.045 over its two rounds): a harder round, not a loss
    assert not gate.check(t.train_to(3)) and gate.counts["fallbacks"] == 0 and float(t.params[0][0].detach()) == 5.0
    assert not gate.check(t.train_to(3)) and t.version == 2 and gate.last.held_to["arithmetic"] == 0.82
    reads[5] = (0.89, 0.89, 0.75)  # a real loss on this round (0.15; 0.085): v1 reads 0.89 here and is published
    gate.served.clear()
    gate.judged.clear()  # (as if read afresh)
    assert gate.check(t.train_to(3)) and float(t.params[0][0].detach()) == 4.0 and t.version == 3
    assert gate.passed_drops[3]["arithmetic"] == pytest.approx(0.01) and gate.stats()["gate/fallbacks"] == 1.0

    # several earlier good versions are kept (FALLBACKS): newest first, the first within the tolerance here wins
    reads.update({7: (0.89, 0.89, 0.89), 8: (0.80, 0.88, 0.88), 10: (0.70, 0.90, 0.89)})
    gate2, t2 = make()
    for w in (7, 8, 10):  # v1, v2, v3 pass rounds 0, 1, 2
        assert gate2.check(t2.train_to(w))
        gate2.keep(t2)
    assert [w.version for w in gate2.clean] == [0, 1, 2]
    # round 0: the served v3 reads 0.70 (0.105 over its two rounds); v2 reads 0.80 there (0.06): lost too; v1 0.89
    assert gate2.check(t2.train_to(3)) and float(t2.params[0][0].detach()) == 7.0 and t2.version == 4
    assert gate2.lost == {2, 3} and gate2.counts["fallbacks"] == 1

    from clawloop.cli import gate_line  # `clawloop status` says so (from /health's `gate`, the stats unprefixed)

    line = gate_line({k[len("gate/"):]: v for k, v in gate.stats().items()})
    assert "v3 passed" in line and "fell back to an earlier version's weights 1 time" in line, line


def test_a_candidate_within_min_slack_of_the_served_version_at_the_edge_goes_on_to_its_confirming_round(caplog):
    """At the tolerance's edge the served version passed its confirming round by one reply, and every candidate
    near it read a reply lower on those same questions: a run refused 65 in a row, recovery steps included
    (RESULTS 17). A candidate beyond the tolerance on its round but within MIN_SLACK of the served version's
    reading there is read on its confirming round, where the two-round rule against the baseline decides; one
    further below is refused as before, and without confirmation nothing changes."""
    from clawloop.trainer.gate import rounds

    checks = builtin_checks(3 * 4, 8)
    rs = rounds(checks, 4)
    reads = {0: (0.90, 0.90, 0.90), 1: (0.88, 0.853, 0.88), 2: (0.88, 0.849, 0.87), 3: (0.88, 0.84, 0.87),
             4: (0.88, 0.849, 0.84)}  # weights w -> its reading on rounds 0, 1, 2

    def make(confirm):
        gate = PublishGate(checks, 0.05, per_group=4, confirm=confirm)
        gate.score = lambda trainer, cs=None: {"arithmetic": reads[int(trainer.params[0][0])][rs.index(cs)],
                                               "instructions": 1.0}
        t = WeightTrainer()
        gate.begin(t)
        return gate, t

    gate, t = make(True)
    assert gate.check(t.train_to(1)) and gate.served[(1, 1)]["arithmetic"] == 0.853  # 0.02, confirmed at 0.047
    gate.keep(t)
    assert not gate.check(t.train_to(3))  # round 1: 0.84, 0.013 below the served 0.853: refused
    assert gate.counts["near_served"] == 0
    with caplog.at_level("WARNING", logger="clawloop.trainer.gate"):
        assert not gate.check(t.train_to(4))  # 0.849 (0.051) goes on; its confirming round 0.84 (0.06; 0.055 over two)
    assert gate.counts["near_served"] == 1 and gate.counts["refused_on_confirmation"] == 1
    # the refusal names what the confirming round judged against: the baseline, not the served reading
    assert "arithmetic 0.840 vs baseline 0.900 (tolerance 0.050) on the confirming round" in caplog.text
    assert gate.check(t.train_to(2)) and t.version == 2  # 0.849 (0.051), then 0.87 on round 2 (0.03): served
    assert gate.counts["near_served"] == 2 and gate.last.scores["arithmetic"] == 0.87
    from clawloop.cli import gate_line  # `clawloop status` says so

    assert "2 read on to a confirming round within 0.01 of the served version" in gate_line(
        {k[len("gate/"):]: v for k, v in gate.stats().items()})

    gate, t = make(False)  # no confirming round: the round's reading is the verdict, the tolerance as it is
    assert gate.check(t.train_to(1))
    gate.keep(t)
    gate.served[(1, 1)] = {"arithmetic": 0.853, "instructions": 1.0}
    assert not gate.check(t.train_to(2)) and gate.counts["near_served"] == 0


def test_a_fallback_found_beyond_the_tolerance_is_not_published_again_under_another_version():
    """A fallback publishes an earlier version's weights as a new version. When that version is later found
    beyond the tolerance, the weights it holds are: falling back to the earlier version again published the
    very weights just found lost, under a third number (a run served v11's weights as v13 and again as v14)."""
    from clawloop.trainer.gate import rounds

    checks = builtin_checks(4 * 4, 8)
    rs = rounds(checks, 4)
    assert len(rs) == 4
    reads = {0: (0.90, 0.90, 0.90, 0.90), 1: (0.88, 0.90, 0.86, 0.82), 2: (0.90, 0.88, 0.72, 0.90),
             3: (0.70, 0.70, 0.70, 0.70)}  # weights w -> its reading on rounds 0-3

    gate = PublishGate(checks, 0.05, per_group=4)
    gate.score = lambda trainer, cs=None: {"arithmetic": reads[int(trainer.params[0][0])][rs.index(cs)],
                                           "instructions": 1.0}
    t = WeightTrainer()
    gate.begin(t)
    for w in (1, 2):  # v1 passes round 0 (0.88), v2 round 1 (0.88)
        assert gate.check(t.train_to(w))
        gate.keep(t)
    # round 2: refused; the served v2 reads 0.72 there (0.10 over two rounds): v1's weights (0.86; 0.03) are v3
    assert gate.check(t.train_to(3)) and float(t.params[0][0].detach()) == 1.0 and t.version == 3
    assert gate.origin == {3: 1}
    gate.keep(t)
    # round 3: refused; the served v3 reads 0.82 there (0.08; 0.055 with its 0.03): lost, and with it v1's weights
    # (which by their own first round alone, 0.02, would pass here at 0.05): the start's are published as v4
    assert gate.check(t.train_to(3)) and t.version == 4 and gate.counts["fallbacks"] == 2
    assert float(t.params[0][0].detach()) == 0.0 and gate.lost == {1, 2, 3} and gate.origin == {3: 1, 4: 0}


def test_a_published_version_is_read_on_the_next_round_before_its_first_candidate():
    """`vet`, after every publish: a version passed on one round is read on the round its candidates will be
    read on. A loss its own round missed (a student's run: other sums 0.08-0.09 down on versions read 0.035-0.06
    down, RESULTS 15) is caught there, before any refusal: serving falls back at once. A harder round holds the
    first candidate to the served reading, less the tolerance the served version left unused over its two
    rounds (with none left, s19's rule, a run stalled 93 refusals each 0.012-0.016 below: RESULTS 15e)."""
    from clawloop.trainer.gate import rounds

    checks = builtin_checks(3 * 4, 8)
    rs = rounds(checks, 4)
    reads = {0: (0.90, 0.90, 0.90), 1: (0.86, 0.78, 0.90), 2: (0.88, 0.83, 0.90), 3: (0.88, 0.826, 0.90),
             4: (0.88, 0.815, 0.90)}

    def make():
        gate, seen = PublishGate(checks, 0.05, per_group=4), []
        gate.score = lambda trainer, cs=None: (seen.append((int(trainer.params[0][0]), rs.index(cs))), {
            "arithmetic": reads[int(trainer.params[0][0])][rs.index(cs)], "instructions": 1.0})[1]
        t = WeightTrainer()
        gate.begin(t)
        assert not gate.vet(t) and gate.counts["vetted"] == 0  # the start is the baseline itself: nothing to read
        return gate, t, seen

    # v1 passes round 0 (0.86); read on round 1 at once: 0.78 (0.12, and 0.08 over its two rounds): a real loss,
    # found before any candidate of v2 was trained. The start's weights are published as v2.
    gate, t, seen = make()
    assert gate.check(t.train_to(1))
    gate.keep(t)
    assert gate.vet(t) and seen[-2:] == [(1, 1), (0, 1)] and gate.counts["vetted"] == 1
    assert float(t.params[0][0].detach()) == 0.0 and t.version == 2 and gate.counts["fallbacks"] == 1
    assert gate.counts["refused"] == 0 and gate.lost == {1} and gate.last.passed
    gate.keep(t)
    # the fallback was just read on round 1, which its first candidate is not (round 2): it is read there
    assert not gate.vet(t) and seen[-1] == (0, 2) and gate.counts["vetted"] == 2
    assert not gate.vet(t) and gate.counts["vetted"] == 2  # once a version and round

    # v1 passes round 0 at 0.88 (0.02); round 1 reads it 0.83 (0.07; 0.045 over two): a harder round. Its first
    # candidate is held to 0.83 less the 0.005 left, at least MIN_SLACK (0.01): 0.826 passes, 0.815 is refused;
    # the served weights are not read again after that refusal
    gate, t, seen = make()
    assert gate.check(t.train_to(2))
    gate.keep(t)
    assert not gate.vet(t) and gate.counts["fallbacks"] == 0 and gate.served[(1, 1)]["arithmetic"] == 0.83
    n = len(seen)
    assert not gate.check(t.train_to(4)) and gate.last.held_to["arithmetic"] == 0.83 and len(seen) == n + 1
    assert gate._slack == {"arithmetic": pytest.approx(0.01)}  # 0.005 left, MIN_SLACK at least
    assert gate.check(t.train_to(3)) and gate.counts["passed_on_served"] == 1


def test_refusals_at_the_shortest_step_hold_rehearsal_harder():
    """At the tolerance's edge every step in the feedback's direction loses a little more than the served
    version, however short (a student's run: 41 candidates in a row at 1/8 of the rate). Once the backoff
    cannot shorten the step, each refusal doubles rehearsal's coefficient (up to `gate.hold` times its own),
    which turns the step towards what was lost, and counts as a change of step for the line search; a pass
    halves it back. Only when neither can change does the gate call training stalled."""
    checks = builtin_checks(4, 8)

    class Fake:
        def __init__(self, arith):
            self.version, self.lr, self.model, self.step_count, self.arith = 1, 1.0, None, 0, arith
            self.opt = type("Opt", (), {"param_groups": [{}]})()
            self.rehearsal = type("Rehearsal", (), {"coef": 1.0})()

    gate = PublishGate(checks, 0.05, backoff=0.5, retries=3, hold=4)
    gate.score = lambda trainer, cs=None: {"arithmetic": trainer.arith, "instructions": 1.0}
    gate.keep = lambda trainer: setattr(gate, "snapshot", type("Snap", (), {"version": 0})())
    gate.roll_back = lambda trainer: setattr(trainer, "arith", 0.90)
    t = Fake(0.90)
    gate.begin(t)
    seen = []
    for _ in range(6):
        t.arith = 0.80
        assert not gate.check(t)
        seen.append((t.lr, t.rehearsal.coef, gate.can_retry(0)))
    assert seen == [(0.5, 1.0, True), (0.25, 1.0, True), (0.125, 1.0, True), (0.125, 2.0, True), (0.125, 4.0, True),
                    (0.125, 4.0, False)]
    assert gate.stats()["gate/hold_scale"] == 4.0
    t.arith = 0.88
    assert gate.check(t) and (t.lr, t.rehearsal.coef) == (0.25, 2.0)
    with pytest.raises(ValueError, match="hold"):
        PublishGate(checks, 0.05, hold=0.5)


# -- publish and roll back -----------------------------------------------------------------------------
def _arith_samples(tok, reinforce_right: bool, n=8):
    """Replies to held-out sums, half right and half wrong (by 7); reward +1 for the kind to reinforce,
    -1 for the other (so any RL baseline leaves a signal)."""
    from clawloop.gateway.render import render_prompt
    from clawloop.records import Sample
    from clawloop.tinymodel.corpus import heldout_questions

    out = []
    for i, q in enumerate([q for q in heldout_questions(4 * n, seed=3) if q["skill"] == "add"][:n]):
        prompt = render_prompt(tok, [{"role": "user", "content": q["question"]}], None)
        right = i % 2 == 0
        resp = tok.encode(f"The answer is {int(q['answer']) + (0 if right else 7)}.", add_special_tokens=False)
        resp.append(tok.eos_token_id)
        out.append(Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                          rollout_logprobs=[0.0] * len(prompt) + [-1.0] * len(resp), prompt_len=len(prompt),
                          reward=1.0 if right == reinforce_right else -1.0))
    return out


def set_lr(trainer, lr):
    for g in trainer.opt.param_groups:
        g["lr"] = lr


def _state(trainer):
    return ([p.detach().clone() for p in trainer.params],
            {k: {n: t.clone() for n, t in v.items()} for k, v in trainer.opt.state_dict()["state"].items()})


def _same(a, b):
    (pa, sa), (pb, sb) = a, b
    return all(torch.equal(x, y) for x, y in zip(pa, pb)) and sa.keys() == sb.keys() and all(
        torch.equal(sa[k][n], sb[k][n]) for k in sa for n in sa[k])


def test_a_passing_version_is_published_and_a_damaging_one_is_rolled_back(tiny_dir, tmp_path):
    from clawloop.engines.hf import HFEngine
    from clawloop.trainer import Trainer, TrainerLoop

    cfg = make_cfg(tiny_dir, tmp_path, train__method="binary", train__lr="2e-3", train__device="cpu",
                   gate__builtin_checks="16")
    trainer = Trainer(cfg, str(tiny_dir))
    engine = HFEngine(tiny_dir, device="cpu", dtype="float32")
    gate = PublishGate.from_config(cfg, gate_checks(cfg, tiny_dir))
    tl = TrainerLoop(cfg, trainer, None, engine, "offline", gate=gate)
    gate.begin(trainer)
    assert min(gate.baseline["instructions"], gate.baseline["arithmetic"], gate.baseline["facts"]) >= 0.6

    async def main():
        await engine.start()
        try:
            run = asyncio.get_running_loop().run_in_executor
            # a small step towards right answers keeps what the model knows: v1 is published
            set_lr(trainer, 1e-5)
            trainer.step(_arith_samples(trainer.tokenizer, reinforce_right=True))
            assert await run(None, tl.publish_weights) is True
            assert engine.policy_version == 1 and gate.counts == {
                "candidates": 1, "passed": 1, "refused": 0, "consecutive_refusals": 0, "retries": 0,
                "passed_on_retry": 0, "passed_on_served": 0, "confirmations": 1, "refused_on_confirmation": 0,
                "fallbacks": 0, "vetted": 0, "recoveries": 0, "recovered": 0, "near_served": 0}  # v1 read on round 1 before it was
            # served: not read there again
            assert set(gate.served) == {(1, 1)}
            published = _state(trainer)
            # big steps towards wrong sums: a candidate that lost arithmetic is refused, the trainer is back at v1
            set_lr(trainer, 2e-3)
            for _ in range(3):
                trainer.step(_arith_samples(trainer.tokenizer, reinforce_right=False))
            assert trainer.version == 4 and not _same(_state(trainer), published)
            assert await run(None, tl.publish_weights) is False
            return gate.stats(), published
        finally:
            await engine.stop()

    stats, published = asyncio.run(main())
    assert engine.policy_version == 1 and trainer.version == 1 and trainer.step_count == 4
    assert _same(_state(trainer), published)  # weights and AdamW moments of v1, not a copy drifting along
    assert stats["gate/refused"] == 1 and stats["gate/last_passed"] == 0 and stats["gate/last_checked_version"] == 4
    assert stats["gate/score/arithmetic"] < gate.last.held_to["arithmetic"] - cfg.gate.tolerance
    # the baseline rides in checkpoints: a restart compares with the start, not with what it resumed
    assert tl.stats()["gate/candidates"] == 2
    path = tl.checkpoint()
    saved = json.loads((path / "trainer_state.json").read_text())["gate"]
    again = PublishGate.from_config(cfg, gate_checks(cfg, tiny_dir))
    again.restore(saved)
    assert again.baseline == gate.baseline and again.baselines == gate.baselines and len(gate.baselines) == 8
    other = PublishGate(builtin_checks(4, 8), 0.05)
    other.restore(saved)
    assert other.baseline == {}  # measured on another set: not reused


def test_backoff_retries_a_refused_step_shorter(tiny_dir, tmp_path):
    """--gate-backoff 0.5 (the default): a refused candidate halves the trainer's learning rate (the rollback
    restored the optimizer, so it is set after it), a passed one doubles it back, never above --lr nor under
    1/8 of it; 1 turns it off."""
    from clawloop.trainer import Trainer

    cfg = make_cfg(tiny_dir, tmp_path, train__method="binary", train__lr="2e-3", train__device="cpu",
                   gate__builtin_checks="16")
    assert cfg.gate.backoff == 0.5
    trainer = Trainer(cfg, str(tiny_dir))
    gate = PublishGate.from_config(cfg, gate_checks(cfg, tiny_dir))
    gate.begin(trainer)
    for _ in range(3):
        trainer.step(_arith_samples(trainer.tokenizer, reinforce_right=False))
    assert gate.check(trainer) is False
    assert trainer.lr == pytest.approx(1e-3) and gate.stats()["gate/lr_scale"] == 0.5
    assert all(g["lr"] == pytest.approx(1e-3) for g in trainer.opt.param_groups)
    assert gate.check(trainer) is True  # back at the published weights: they pass, and the rate comes back
    assert trainer.lr == pytest.approx(2e-3) and all(g["lr"] == pytest.approx(2e-3) for g in trainer.opt.param_groups)
    assert gate.check(trainer) is True and trainer.lr == pytest.approx(2e-3)  # never above --lr
    gate._set_lr_scale(trainer, 0.01)
    assert gate.lr_scale == 1 / 8 and trainer.lr == pytest.approx(2e-3 / 8)
    with pytest.raises(ConfigError, match="gate.backoff"):
        make_cfg(tiny_dir, tmp_path, gate__backoff="0")
    off = make_cfg(tiny_dir, tmp_path, train__method="binary", train__lr="2e-3", train__device="cpu",
                   gate__builtin_checks="16", gate__backoff="1")
    trainer = Trainer(off, str(tiny_dir))
    gate = PublishGate.from_config(off, gate_checks(off, tiny_dir))
    gate.begin(trainer)
    for _ in range(3):
        trainer.step(_arith_samples(trainer.tokenizer, reinforce_right=False))
    assert gate.check(trainer) is False and trainer.lr == pytest.approx(2e-3)  # off: retried at full length


def test_a_refused_batch_is_trained_again_shorter_until_it_passes(tiny_dir, tmp_path, caplog):
    """The line search (--gate-retries, default 3): a batch of feedback towards wrong sums at lr 2e-3 makes a
    candidate that loses the sums; the same batch is trained again from the published weights at half the
    rate, a quarter, an eighth, until one passes (the shipped model: at a quarter) and is published as v1,
    instead of being dropped. A batch that
    no rate down to 1/8 makes safe is dropped after its retries, the trainer back at the published weights;
    with --gate-retries 0 the first refusal drops it."""
    from clawloop.engines.hf import HFEngine
    from clawloop.trainer import Trainer, TrainerLoop

    def loop(lr, **flags):
        # one round (the same 16 a group every time): the line search alone, its tries read alike
        # AdamW's fixed eps: the damaging steps this test needs (the relative eps, the default, makes the
        # wrong reward cost less: no candidate down to 1/8 of 5e-3 would be refused)
        cfg = make_cfg(tiny_dir, tmp_path, train__method="binary", train__lr=lr, train__device="cpu",
                       gate__builtin_checks="16", gate__rotations="1", train__adam_eps_rel="0", **flags)
        trainer = Trainer(cfg, str(tiny_dir))
        gate = PublishGate.from_config(cfg, gate_checks(cfg, tiny_dir))
        gate.begin(trainer)
        return trainer, gate, TrainerLoop(cfg, trainer, None, engine, "offline", gate=gate)

    engine = HFEngine(tiny_dir, device="cpu", dtype="float32")

    async def main():
        await engine.start()
        try:
            run = asyncio.get_running_loop().run_in_executor
            trainer, gate, tl = loop("2e-3")
            batch = _arith_samples(trainer.tokenizer, reinforce_right=False)
            trainer.step(batch, served_version=0)
            assert await run(None, tl.publish_weights, batch, 0) is True
            tries = gate.counts["retries"]
            assert 1 <= tries <= 3 and engine.policy_version == 1 and trainer.version == 1
            assert trainer.step_count == 1 + tries  # the same batch, once per try
            assert {k: gate.counts[k] for k in ("candidates", "refused", "passed_on_retry")} == {
                "candidates": 1 + tries, "refused": tries, "passed_on_retry": 1}
            assert gate.last.passed and gate.last.scores["arithmetic"] >= gate.last.held_to["arithmetic"] - 0.05
            # passed at 2e-3 / 2**tries: the next batch starts at twice that
            assert trainer.lr == pytest.approx(2e-3 / 2 ** tries * 2)

            trainer, gate, tl = loop("5e-3")  # every rate down to 1/8 loses the sums: dropped after 3 retries
            published = _state(trainer)
            trainer.step(batch, served_version=1)
            assert await run(None, tl.publish_weights, batch, 1) is False
            assert gate.counts["retries"] == 3 and gate.counts["refused"] == 4 and trainer.step_count == 4
            assert _same(_state(trainer), published) and gate.lr_scale == 1 / 8
            with caplog.at_level("WARNING", logger="clawloop.trainer.gate"):  # stalled: said once per 10 in a row
                for _ in range(6):
                    trainer.step(batch, served_version=1)
                    assert gate.check(trainer) is False
            stalled = [r for r in caplog.records if "refused in a row, the last at the shortest step" in r.getMessage()]
            assert gate.counts["consecutive_refusals"] == 10 and len(stalled) == 1 and "arithmetic" in stalled[0].getMessage()

            trainer, gate, tl = loop("2e-3", gate__retries="0")
            trainer.step(batch, served_version=1)
            assert await run(None, tl.publish_weights, batch, 1) is False
            assert gate.counts["retries"] == 0 and gate.counts["refused"] == 1 and trainer.step_count == 1
        finally:
            await engine.stop()

    asyncio.run(main())


def test_a_stuck_gate_tries_a_recovery_step_of_rehearsal_alone(tiny_dir, tmp_path):
    """Where no step in the feedback's direction passes (the rate at its shortest and rehearsal held as hard as
    allowed), the loop trains one step on rehearsal alone from the served weights (`Trainer.recover_step`,
    CPO's recovery step) and the gate reads it as the next candidate: it restores what the model could do, so
    it passes and is published, and the feedback's steps have room again. Without rehearsal nothing is tried."""
    from clawloop.engines.hf import HFEngine
    from clawloop.trainer import Trainer, TrainerLoop
    from clawloop.trainer.rehearsal import Rehearsal

    engine = HFEngine(tiny_dir, device="cpu", dtype="float32")

    def loop(rehearse):
        cfg = make_cfg(tiny_dir, tmp_path, train__method="binary", train__lr="5e-3", train__device="cpu",
                       gate__builtin_checks="16", gate__rotations="1", train__adam_eps_rel="0", gate__hold="1")
        trainer = Trainer(cfg, str(tiny_dir))
        if rehearse:
            trainer.rehearsal = Rehearsal.from_config(cfg, str(tiny_dir))
            trainer.rehearsal.build(trainer)
        gate = PublishGate.from_config(cfg, gate_checks(cfg, tiny_dir))
        gate.begin(trainer)
        return trainer, gate, TrainerLoop(cfg, trainer, None, engine, "offline", gate=gate)

    async def main():
        await engine.start()
        try:
            run = asyncio.get_running_loop().run_in_executor
            trainer, gate, tl = loop(rehearse=True)
            assert trainer.rehearsal is not None
            batch = _arith_samples(trainer.tokenizer, reinforce_right=False)
            trainer.step(batch, served_version=0)  # every rate down to 1/8 loses the sums (the test above)
            assert await run(None, tl.publish_weights, batch, 0) is True
            assert gate.counts["refused"] == 4 and gate.counts["retries"] == 3
            assert gate.counts["recoveries"] == 1 and gate.counts["recovered"] == 1 and gate.counts["passed"] == 1
            assert trainer.last["train/recovery_step"] == 1.0 and trainer.last["train/rehearsal_rows"] > 0
            assert engine.policy_version == 1 and trainer.version == 1 and trainer.step_count == 5
            assert gate.last.passed and gate.last.scores["arithmetic"] >= gate.last.held_to["arithmetic"] - 0.05
            from clawloop.cli import gate_line

            line = gate_line({k[len("gate/"):]: v for k, v in gate.stats().items()})
            assert "1 of 1 recovery step(s) (rehearsal alone) published" in line, line

            trainer, gate, tl = loop(rehearse=False)  # nothing to rehearse: the batch is dropped, as before
            trainer.step(batch, served_version=0)
            assert await run(None, tl.publish_weights, batch, 0) is False
            assert gate.counts["recoveries"] == 0 and trainer.step_count == 4 and trainer.version == 0
        finally:
            await engine.stop()

    asyncio.run(main())


def test_sampled_checks_are_paired_across_versions(tiny_dir):
    """--gate-samples (default 4): each check is sampled at temperature 1 with seeds fixed per batch, so a
    version is scored on what users get rather than on its surest answer, twice the same and without
    touching the global RNG; and paired: weights that barely changed draw the same replies (common random
    numbers), far fewer differ than between two seeds on the same weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawloop.trainer.gate import generate_replies

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    checks = [c for c in builtin_checks(32, 16) for _ in range(4)]
    rng = torch.get_rng_state()
    a = generate_replies(model, tok, checks, batch_size=64, temperature=1.0, seed=1)
    assert torch.equal(torch.get_rng_state(), rng)
    assert generate_replies(model, tok, checks, batch_size=64, temperature=1.0, seed=1) == a
    greedy = generate_replies(model, tok, checks, batch_size=64)
    assert sum(x != y for x, y in zip(a, greedy)) >= 10  # sampled: not the greedy replies
    other_seed = generate_replies(model, tok, checks, batch_size=64, temperature=1.0, seed=2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 1e-3)
    nudged = generate_replies(model, tok, checks, batch_size=64, temperature=1.0, seed=1)
    moved = sum(x != y for x, y in zip(a, nudged))
    assert moved * 3 <= sum(x != y for x, y in zip(a, other_seed)), moved


def test_lora_is_checked_with_its_adapter_on_and_rolled_back(tiny_dir, tmp_path):
    from clawloop.trainer import Trainer

    cfg = make_cfg(tiny_dir, tmp_path, train__method="binary", train__use_lora="true", train__lora_rank="4",
                   train__device="cpu", gate__builtin_checks="8")
    trainer = Trainer(cfg, str(tiny_dir))
    gate = PublishGate.from_config(cfg, gate_checks(cfg, tiny_dir))
    gate.begin(trainer)
    before = _state(trainer)
    with torch.no_grad():  # a damaging adapter: only the adapter's weights change
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    assert trainer.model.training
    assert gate.check(trainer) is False  # scored with the adapter on: the damage shows
    assert trainer.model.training  # the check put the model back in train mode
    assert _same(_state(trainer), before)
    assert gate.check(trainer) is True  # back at the published adapter: passes again


# -- end to end ----------------------------------------------------------------------------------------
WRONG_RM = '''
import re

def reward(turn):
    """+1 for a WRONG sum, -1 for a right one: feedback that teaches the model to forget arithmetic."""
    q = next(m["content"] for m in reversed(turn.messages) if m["role"] == "user")
    a, op, b = re.search(r"(\\d+)\\s*([+-])\\s*(\\d+)", q).groups()
    right = int(a) + int(b) if op == "+" else int(a) - int(b)
    nums = re.findall(r"-?\\d+", turn.response_text or "")
    return -1.0 if nums and int(nums[-1]) == right else 1.0
'''


def test_users_rewarding_wrong_answers_cannot_make_the_served_model_forget(tiny_dir, tmp_path, caplog):
    import openai

    from clawloop import cli
    from clawloop.engines.hf import HFEngine
    from clawloop.apps.serve import build_app
    from clawloop.tinymodel.corpus import extract_answer, heldout_questions

    rm = tmp_path / "wrong_rm.py"
    rm.write_text(textwrap.dedent(WRONG_RM))
    cfg = make_cfg(tiny_dir, tmp_path / "data", judge__custom_rm_path=f"{rm}:reward", judge__poll_interval_s=0.1,
                   train__method="binary", train__lr="2e-3", train__rollout_batch_size="8", train__device="cpu",
                   gate__rotations="2")
    # The default 64 checks a group: with 16, a candidate of the line search could pass on a lucky draw of
    # its questions and lose 0.2 of the probe's (a selection over up to 4 candidates a batch on a small set).
    # Two rounds, not 8: the rotation is there, the baseline at start costs 2 checks instead of 8.
    eng = HFEngine(tiny_dir, device="cpu", dtype="float32", max_batch_size=16, max_model_len=1024)
    app, parts = build_app(cfg, judge=True, train=True, engine=eng)
    server = ServerThread(app).start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        # 128 held-out sums, none of them the gate's or the users': a fixed set of 24 (this test until the
        # eighteenth session) lost about twice what the population of sums lost (damage concentrates on some
        # sums), so it failed on versions the gate rightly passed (bench/RESULTS.md "Why the loop made the
        # model worse" 14).
        probe = [q for q in heldout_questions(260, seed=11) if q["skill"] != "fact"][:128]

        def correctness() -> tuple[float, set[str]]:
            """Sampled as users get it (T=1), 4 fixed seeds a question, each reply its own: the same random
            numbers before and after (a greedy probe of 16 flipped 4-5 answers on versions the sampled gate
            rightly passed), and not the same for every question (an unlucky draw would miss most at once)."""
            def one(job: tuple[dict, int]) -> tuple[bool, str]:
                q, seed = job
                r = client.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": q["question"]}], max_tokens=12,
                    temperature=1.0, seed=seed)
                return extract_answer(r.parse().choices[0].message.content) == q["answer"], r.headers["x-policy-version"]

            with ThreadPoolExecutor(8) as ex:  # batched by the engine: 512 replies in a few seconds
                got = list(ex.map(one, [(q, 4 * i + j) for i, q in enumerate(probe) for j in range(4)]))
            return sum(ok for ok, _ in got) / len(got), {v for _, v in got}

        deadline = time.time() + 60
        while parts.trainer is None or parts.trainer.gate.snapshot is None:  # baseline measured
            assert time.time() < deadline, "the trainer did not start"
            time.sleep(0.1)
        v0 = eng.policy_version
        before, _ = correctness()
        assert before >= 0.6

        questions = [q for q in heldout_questions(120, seed=21) if q["skill"] != "fact"]
        stop, errors = threading.Event(), []

        def user(k: int) -> None:  # sampled answers, right and wrong, each a closed session (judged at once)
            i = k
            while not stop.is_set():
                try:
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": questions[i % len(questions)]["question"]}],
                        max_tokens=12, temperature=1.0, extra_headers={"X-Session-Id": f"u{k}-{i}",
                                                                       "X-Session-Done": "1"})
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))
                i += 4

        users = [threading.Thread(target=user, args=(k,), daemon=True) for k in range(4)]
        for t in users:
            t.start()
        tl = parts.trainer
        deadline = time.time() + 120
        try:
            while tl.gate.counts["refused"] < 2 or tl.counts["steps"] < 2:  # two batches (each with its retries)
                assert time.time() < deadline, (tl.stats(), tl.error)
                assert tl.error is None, tl.error
                time.sleep(0.2)
        finally:
            stop.set()
            for t in users:
                t.join(timeout=60)
        assert not errors, errors[:3]
        tl.stop(checkpoint=False)  # between two iterations: a candidate was either published or rolled back

        stats = tl.stats()
        assert stats["train/steps"] >= 2 and stats["gate/candidates"] >= 2
        # Only candidates that passed were served (a batch whose rewards cancel out changes nothing and
        # passes); each refused one was rolled back, so versions are not burnt and the trainer is at the
        # served version. The refused ones had really lost arithmetic.
        passed = int(stats["gate/passed"] + stats["gate/fallbacks"])  # a fallback publishes older weights anew
        assert eng.policy_version == v0 + passed == tl.trainer.version
        assert passed < stats["gate/candidates"] and stats["gate/refused"] >= 2
        refusals = [(float(m.group(1)), float(m.group(2))) for r in caplog.records for m in
                    [re.search(r"refused candidate .*: arithmetic ([0-9.]+) vs baseline ([0-9.]+)", r.getMessage())] if m]
        assert len(refusals) >= 2 and all(s < b - cfg.gate.tolerance for s, b in refusals), refusals
        after, versions = correctness()
        assert versions == {str(eng.policy_version)}
        # The gate allows --regression-tolerance (0.05) on its own round of 64 sums x 4 replies; these are other
        # questions (with no version passed the served weights are v0's: the version checks above say so, and
        # the engine's batching of concurrent requests may change a sampled token, so no equality here).
        assert after >= before - 0.1, (before, after, passed)

        health = httpx.get(server.url + "/health").json()
        assert health["gate"]["refused"] >= 2
        metrics = httpx.get(server.url + "/metrics").text
        assert "clawloop_gate_refused" in metrics and "clawloop_gate_baseline_arithmetic" in metrics
        shown = httpx.get(server.url + "/api/status").json()["stats"]
        assert shown["gate/refused"] >= 2 and shown["gate/size"] == 64 + 50 + 64
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli.main(["status", "--url", server.url])
        line = next(x for x in out.getvalue().splitlines() if "publish gate" in x)
        verdict = "passed" if health["gate"]["last_passed"] else "REFUSED"  # a retry at 1/8 may pass
        assert verdict in line and "arithmetic" in line and "candidates refused" in line, line
    finally:
        server.stop()
        parts.store.close()


def test_clawloop_up_refuses_a_bad_regression_set_before_it_serves(tmp_path, random_model_dir):
    """`trainer_service` (what `clawloop up` calls while it builds the app, before uvicorn starts) loads
    the checks: a checker that does not load is a config error naming the key, not a dead trainer thread."""
    from clawloop.apps.serve import trainer_service
    from clawloop.apps.services import Parts

    f = _write(tmp_path, [{"prompt": "q", "check": "nowhere.py:fn"}])
    cfg = make_cfg(random_model_dir, tmp_path / "d", gate__regression_set=str(f))
    parts = Parts(engine=None, store=None)
    with pytest.raises(ConfigError, match=r"gate.regression_set: .*set.jsonl:1.*nowhere.py"):
        trainer_service(cfg, None, None, parts)
    assert parts.services == [] and parts.trainer is None


def test_the_example_regression_set_passes_on_the_tiny_model(tiny_dir, tmp_path, monkeypatch):
    """examples/regression_set.jsonl as the README shows it (paths relative to the repository), scored
    on the tiny model: every group at 1.0 greedily, at least 0.7 sampled (lines with their own max_tokens
    batch apart)."""
    from pathlib import Path

    from clawloop.trainer import Trainer

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    cfg = make_cfg(tiny_dir, tmp_path, train__device="cpu", gate__regression_set="examples/regression_set.jsonl",
                   gate__builtin="off")
    checks = gate_checks(cfg, tiny_dir)
    assert {c.source.split(":")[-1] for c in checks} == {"answer", "regex", "check"}
    assert len({c.max_tokens for c in checks}) == 2
    trainer = Trainer(cfg, str(tiny_dir))
    sampled = PublishGate.from_config(cfg, checks).score(trainer)  # the default: 4 replies a check at T=1
    # sampled, the tiny model names a fact wrong now and then (0.75 on these two; bench/RESULTS.md 8)
    assert sampled.keys() == {"arithmetic-exact", "arithmetic", "facts", "style"} and min(sampled.values()) >= 0.7
    greedy = make_cfg(tiny_dir, tmp_path, train__device="cpu", gate__regression_set="examples/regression_set.jsonl",
                      gate__builtin="off", gate__samples="0")
    assert PublishGate.from_config(greedy, checks).score(trainer) == {"arithmetic-exact": 1.0, "arithmetic": 1.0,
                                                                      "facts": 1.0, "style": 1.0}
