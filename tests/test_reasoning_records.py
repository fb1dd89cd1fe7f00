"""Where a thinking model's reasoning ended, kept through every boundary: `Turn.reasoning` /
`reasoning_end` into the SQLite store and back (a pending row completed, and a plain insert), into
the export and back through the import's validation; a turn without reasoning stays without."""

from __future__ import annotations

import json

import pytest

from clawloop.records import Sample, Turn
from clawloop.store import SQLiteStore
from clawloop.trajectories import ImportError_, parse_sessions, turn_to_export


def thinking_turn(**kw) -> Turn:
    return Turn(session_id="s", index=0, messages=[{"role": "user", "content": "2+3?"}], prompt_ids=[1, 2, 3],
                response_ids=[7, 8, 9, 10, 11], response_logprobs=[-0.1] * 5, response_text="5",
                reasoning="add them", reasoning_end=3, request_id="r1", **kw)


def test_reasoning_round_trips_through_the_store_and_trains_whole(tmp_path):
    store = SQLiteStore(tmp_path / "clawloop.db")
    try:
        key = "k1"
        store.begin_turn(Turn(session_id="s", index=0, finish_reason="pending", policy_version=-1, trainable=False,
                              request_id=key, prompt_ids=[1, 2, 3]), key)
        store.finish_turns([thinking_turn()], key)
        store.add_turn(Turn(session_id="t", index=0, response_ids=[4], response_text="plain")).result(10)
        store.flush()
        sessions = dict(store.iter_sessions())
        (a,), (b,) = sessions["s"], sessions["t"]
        assert (a.reasoning, a.reasoning_end, a.response_ids) == ("add them", 3, [7, 8, 9, 10, 11])
        assert (b.reasoning, b.reasoning_end) == (None, None)
        s = Sample.from_turn(a)
        assert s.loss_mask == [0, 0, 0, 1, 1, 1, 1, 1]  # the reasoning ids train with the answer's
    finally:
        store.close()


def test_reasoning_in_export_and_import(tmp_path):
    d = turn_to_export(thinking_turn())
    assert (d["reasoning"], d["reasoning_end"]) == ("add them", 3)
    assert "reasoning" not in turn_to_export(Turn(session_id="t", index=0))
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"session_id": "s", "turns": [d]}) + "\n")
    ((_, (t,)),) = parse_sessions(path)
    assert (t["reasoning"], t["reasoning_end"]) == ("add them", 3)
    path.write_text(json.dumps({"session_id": "s", "turns": [{**d, "reasoning_end": 9}]}) + "\n")
    with pytest.raises(ImportError_, match="reasoning_end"):
        parse_sessions(path)


def test_linking_ignores_the_reasoning_a_client_sends_back(tmp_path):
    """The served answer is the content; a client that sends its reasoning back as `reasoning_content`,
    folded into the content as `<think>…</think>`, or not at all, continues the same turn."""
    from clawloop.gateway.capture import Capture

    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    try:
        q = [{"role": "user", "content": "2+3?"}]
        for i, echoed in enumerate([{"role": "assistant", "content": "5", "reasoning_content": "add them"},
                                    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n5"},
                                    {"role": "assistant", "content": "5"}]):
            first = cap.begin(None, "main", q + [{"role": "user", "content": f"n{i}"}], False)
            cap.finish(first, [Turn(session_id=first.session_id, index=first.index, response_text="5",
                                    response_ids=[1], response_logprobs=[-0.1], reasoning="add them",
                                    reasoning_end=0)])
            nxt = cap.begin(None, "main", q + [{"role": "user", "content": f"n{i}"}, echoed,
                                               {"role": "user", "content": "thanks"}], False)
            assert nxt.session_id == first.session_id and nxt.index == 1
            store.flush()
            assert store.session_turns(first.session_id)[0].next_state == {"role": "user", "content": "thanks"}
    finally:
        store.close()
