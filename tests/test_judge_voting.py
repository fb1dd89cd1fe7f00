"""Verdict parsing, majority voting and hint selection, on hand-made inputs."""

from __future__ import annotations

import pytest

from clawloop.judge.voting import (
    judged_text,
    majority_vote,
    parse_boxed,
    parse_hint,
    select_hint,
    split_thinking,
    vote_agreement,
)


@pytest.mark.parametrize("reply, verdict", [
    ("The user thanked the assistant. \\boxed{1}", 1),
    ("\\boxed{-1}", -1),
    ("ambiguous \\boxed{0}", 0),
    ("\\boxed{+1}", 1),
    ("\\boxed{ -1 }", -1),
    ("\\boxed{\u22121}", -1),                      # Unicode minus
    ("$\\boxed{1}$", 1),
    ("\\boxed{\\text{-1}}", -1),
    ("first \\boxed{1}, on reflection \\boxed{-1}", -1),  # the LAST box counts
    ("\\boxed{1} ... no wait \\boxed{0}", 0),
])
def test_parse_boxed_valid(reply, verdict):
    assert parse_boxed(reply) == verdict


@pytest.mark.parametrize("reply", [
    None, "", "I think it's positive: 1",          # no box
    "\\boxed{2}", "\\boxed{-2}", "\\boxed{0.5}",    # out of range
    "\\boxed{yes}", "\\boxed{}",                     # not a verdict
    "\\boxed{1", "verdict: \\boxed{-1",             # unclosed
    "\\boxed{1} but finally \\boxed{positive}",     # last box malformed: an earlier valid one does not count
])
def test_parse_boxed_malformed(reply):
    assert parse_boxed(reply) is None


def test_parse_boxed_nested_braces():
    assert parse_boxed("\\boxed{\\text{1}} done") == 1
    assert parse_boxed("\\boxed{{1}}") is None


@pytest.mark.parametrize("votes, threshold, score", [
    ([1], 0.5, 1),
    ([-1], 0.5, -1),
    ([1, 1, -1], 0.5, 1),
    ([1, 1, -1], 0.7, 0),          # 2/3 < 0.7
    ([1, 1, -1], 2 / 3, 1),        # exactly the threshold passes
    ([1, -1], 0.5, 0),             # tie
    ([1, -1, 0], 0.3, 0),          # three-way tie
    ([1, 1, -1, -1, 0], 0.4, 0),   # tie for the most
    ([1, None, None], 0.5, 1),     # 1 of 1 valid vote
    ([None, None, None], 0.5, 0),  # no valid vote
    ([], 0.5, 0),
    ([0, 0, 1], 0.5, 0),           # 0 can win, and is 0
    ([-1, -1, -1, 1], 1.0, 0),     # unanimity required
    ([-1, -1, -1], 1.0, -1),
    ([1, 0, 1, None, -1], 0.5, 1),  # 2 of 4 valid = 0.5
])
def test_majority_vote(votes, threshold, score):
    assert majority_vote(votes, threshold) == score


def test_vote_agreement():
    assert vote_agreement([1, 1, -1, None], 1) == pytest.approx(2 / 3)
    assert vote_agreement([None], 0) is None


def test_parse_hint():
    reply = "Reasoning...\n[HINT_START]Answer with just the number.[HINT_END]\n\\boxed{1}"
    assert parse_hint(reply) == "Answer with just the number."
    assert parse_hint("[HINT_START] a [HINT_END] then [HINT_START] the last one [HINT_END]") == "the last one"
    assert parse_hint("[HINT_START] never closed") is None
    assert parse_hint("no markers \\boxed{1}") is None
    assert parse_hint("[HINT_START]   [HINT_END]") is None


def test_select_hint_longest_positive_over_ten_chars():
    votes = [
        (1, "Use metric units."),                                  # 17 chars
        (1, "Answer in metric units and give the unit name."),     # longest positive
        (-1, "This negative vote's hint is even longer than the others and must be ignored."),
        (None, "A malformed vote's hint, also long enough to win if it counted, is ignored."),
        (1, "Too short"),
    ]
    assert select_hint(votes) == "Answer in metric units and give the unit name."
    assert select_hint([(1, "0123456789")]) is None     # exactly 10 chars: not over 10
    assert select_hint([(1, "01234567890")]) == "01234567890"
    assert select_hint([(-1, "a long enough hint text")]) is None
    assert select_hint([]) is None


@pytest.mark.parametrize("content, reasoning, verdict", [
    ("<think>maybe \\boxed{1}</think>No: the user corrects it. \\boxed{-1}", None, -1),   # the answer wins
    ("\\boxed{-1}", "I first thought \\boxed{1}", -1),                                   # reasoning field too
    ("", "The user thanks the assistant. \\boxed{1}", 1),                                  # only in a finished thought
    ("<think>the user says thanks, so \\boxed{1", None, None),                            # cut mid-thought: nothing
    ("prefilled thinking \\boxed{0}</think>Final: \\boxed{1}", None, 1),                 # template opened <think>
    ("<think>a</think>no verdict here", "\\boxed{0}", 0),
    (None, None, None),
])
def test_judged_text_reads_the_answer_then_a_finished_thought(content, reasoning, verdict):
    assert parse_boxed(judged_text(content, reasoning)) == verdict


def test_split_thinking():
    assert split_thinking("<think> x </think> y <think>z</think> w") == ("y  w", "x\nz")
    assert split_thinking("a <think>cut off") == ("a", "")
    assert split_thinking("pre</think>post") == ("post", "pre")
    assert split_thinking(None) == ("", "")
