"""Capture: token-exact turns, next-state linking, side turns, session end,
idle close, restart, export/import — through a real server and SQLite file."""

from __future__ import annotations

import json
import time

import pytest

from conftest import run_cli


def ask(client, sid, messages, *, side=False, done=False, **kw):
    headers = {"X-Session-Id": sid}
    if side:
        headers["X-Turn-Type"] = "side"
    if done:
        headers["X-Session-Done"] = "1"
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model="m", messages=messages, extra_headers=headers,
                                          extra_body={"return_token_ids": True}, **kw)


def test_turn_is_token_exact(gateway):
    c = gateway.client()
    r = ask(c, "s-exact", [{"role": "user", "content": "What is 3+4?"}], seed=3, max_tokens=12)
    gateway.store.flush()
    (t,) = gateway.store.session_turns("s-exact")
    ch = r.choices[0]
    assert t.prompt_ids == r.model_extra["prompt_token_ids"]
    assert t.response_ids == ch.model_extra["token_ids"]
    assert len(t.response_logprobs) == len(t.response_ids)
    assert t.response_logprobs == pytest.approx(ch.model_extra["token_logprobs"])
    tok = gateway.gw.tok
    assert tok.decode(t.response_ids, skip_special_tokens=True) == t.response_text == ch.message.content
    assert t.policy_version == 0 and t.type == "main" and t.trainable
    assert t.messages == [{"role": "user", "content": "What is 3+4?"}]


def test_logprobs_are_the_models(gateway, engine):
    """The stored logprobs are log_softmax of the model's logits at the sampled ids."""
    import torch

    c = gateway.client()
    ask(c, "s-lp", [{"role": "user", "content": "hello"}], seed=11, max_tokens=10)
    gateway.store.flush()
    (t,) = gateway.store.session_turns("s-lp")
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    P = len(t.prompt_ids)
    want = [float(lp[P - 1 + k, tid]) for k, tid in enumerate(t.response_ids)]
    assert t.response_logprobs == pytest.approx(want, abs=1e-3)


def test_three_turn_session_links_next_states(gateway):
    c = gateway.client()
    msgs = [{"role": "user", "content": "What is 12+7?"}]
    r1 = ask(c, "s3", msgs)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "just the number, please"}]
    r2 = ask(c, "s3", msgs)
    msgs += [{"role": "assistant", "content": r2.choices[0].message.content},
             {"role": "tool", "tool_call_id": "c1", "content": "{\"result\": 19}"}]
    ask(c, "s3", msgs)
    gateway.store.flush()
    t = gateway.store.session_turns("s3")
    assert [x.index for x in t] == [0, 1, 2]
    assert t[0].next_state == {"role": "user", "content": "just the number, please"}
    assert t[1].next_state == {"role": "tool", "content": "{\"result\": 19}"}
    assert t[2].next_state is None and not t[2].final
    # ready for the judge: the two linked turns
    ready = {x.index for x in gateway.store.turns_to_judge("offline", 10) if x.session_id == "s3"}
    assert ready == {0, 1}


def test_side_turns_are_stored_not_trainable_and_do_not_break_linking(gateway):
    c = gateway.client()
    m1 = [{"role": "user", "content": "What is 2+2?"}]
    r1 = ask(c, "side", m1)
    ask(c, "side", [{"role": "user", "content": "summarize the chat so far"}], side=True)
    ask(c, "side", m1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                         {"role": "user", "content": "thanks! and 3+3?"}])
    gateway.store.flush()
    t = gateway.store.session_turns("side")
    assert [x.type for x in t] == ["main", "side", "main"]
    assert not t[1].trainable and t[1].next_state is None
    assert t[0].next_state["content"] == "thanks! and 3+3?"
    assert all(x.session_id != "side" or x.index != 1 for x in gateway.store.turns_to_judge("offline", 50))


def test_session_done_marks_final_and_frees_state(gateway):
    c = gateway.client()
    m = [{"role": "user", "content": "hi"}]
    r = ask(c, "done", m)
    ask(c, "done", m + [{"role": "assistant", "content": r.choices[0].message.content},
                        {"role": "user", "content": "bye"}], done=True)
    gateway.store.flush()
    t = gateway.store.session_turns("done")
    assert t[0].next_state["content"] == "bye" and t[1].final
    assert "done" not in gateway.gw.capture.sessions
    assert any(x.session_id == "done" and x.index == 1 for x in gateway.store.turns_to_judge("offline", 50))


def test_session_id_from_body_and_user_field(gateway):
    c = gateway.client()
    q = [{"role": "user", "content": "hi"}]
    c.chat.completions.create(model="m", messages=q, max_tokens=2, extra_body={"session_id": "from-body"})
    c.chat.completions.create(model="m", messages=q, max_tokens=2, user="from-user")
    c.chat.completions.create(model="m", messages=q, max_tokens=2, user="from-user",
                              extra_headers={"X-Session-Id": "from-header"})
    c.chat.completions.create(model="m", messages=q, max_tokens=2, extra_body={"turn_type": "side",
                                                                                  "session_id": "body-side"})
    gateway.store.flush()
    for sid in ("from-body", "from-user", "from-header"):
        assert len(gateway.store.session_turns(sid)) == 1, sid
    assert gateway.store.session_turns("body-side")[0].type == "side"


def test_headerless_side_request_is_a_closed_one_turn_session(gateway):
    c = gateway.client()
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                              extra_headers={"X-Turn-Type": "side"})
    gateway.store.flush()
    sessions = list(gateway.store.iter_sessions())
    assert len(sessions) == 1 and sessions[0][0].startswith("anon-")
    assert not sessions[0][1][0].trainable
    assert not gateway.gw.capture.sessions


def test_headerless_request_opens_an_inferred_session_judged_when_idle(make_gateway):
    g = make_gateway(capture__session_idle_timeout_s="1.0", capture__sweep_interval_s="0.1")
    g.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    g.store.flush()
    ((sid, (t,)),) = list(g.store.iter_sessions())
    assert sid.startswith("conv-") and not t.final  # a continuation may still come
    deadline = time.time() + 10
    while g.gw.capture.sessions and time.time() < deadline:
        time.sleep(0.05)
    g.store.flush()
    assert g.store.session_turns(sid)[0].final


def test_idle_session_is_closed(make_gateway):
    g = make_gateway(capture__session_idle_timeout_s="0.3", capture__sweep_interval_s="0.1")
    ask(g.client(), "idle", [{"role": "user", "content": "hi"}])
    deadline = time.time() + 10
    while "idle" in g.gw.capture.sessions and time.time() < deadline:
        time.sleep(0.05)
    assert "idle" not in g.gw.capture.sessions
    g.store.flush()
    assert g.store.session_turns("idle")[0].final


def test_streamed_turn_is_captured(gateway):
    c = gateway.client()
    chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                            stream=True, seed=2, extra_headers={"X-Session-Id": "st"}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    gateway.store.flush()
    (t,) = gateway.store.session_turns("st")
    assert t.response_text == text and len(t.response_logprobs) == len(t.response_ids) > 0


def test_n_choices_stored_and_echoed_choice_gets_next_state(gateway):
    c = gateway.client()
    q = [{"role": "user", "content": "hi"}]
    r = ask(c, "nn", q, n=3, seed=9, temperature=1.0)
    pick = r.choices[2].message.content
    ask(c, "nn", q + [{"role": "assistant", "content": pick}, {"role": "user", "content": "great"}])
    gateway.store.flush()
    t = [x for x in gateway.store.session_turns("nn") if x.index == 0]
    assert [x.choice_index for x in t] == [0, 1, 2]
    linked = [x.choice_index for x in t if x.next_state]
    texts = [x.response_text for x in t]
    assert linked == [texts.index(pick)]


def test_restart_keeps_data_and_linking(make_gateway, tmp_path):
    data = tmp_path / "persist"
    g = make_gateway(data_dir=data)
    q = [{"role": "user", "content": "What is 1+1?"}]
    r = ask(g.client(), "keep", q)
    g.stop()
    g2 = make_gateway(data_dir=data)
    assert "keep" in g2.gw.capture.sessions  # rebuilt from the store
    ask(g2.client(), "keep", q + [{"role": "assistant", "content": r.choices[0].message.content},
                                  {"role": "user", "content": "thank you"}])
    g2.store.flush()
    t = g2.store.session_turns("keep")
    assert [x.index for x in t] == [0, 1]
    assert t[0].next_state == {"role": "user", "content": "thank you"}


def test_export_and_import_round_trip(make_gateway, tmp_path, random_model_dir):
    data = tmp_path / "exp"
    g = make_gateway(data_dir=data)
    c = g.client()
    msgs = [{"role": "user", "content": "What is 12+7?"}]
    for k, follow in enumerate(["no, just the number", "thanks!", None]):
        r = ask(c, "conv", msgs, done=follow is None)
        if follow:
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": follow}]
    g.stop()
    out = tmp_path / "out.jsonl"
    res = run_cli("export", "--data-dir", str(data), "--out", str(out))
    assert res.returncode == 0, res.stderr
    (line,) = out.read_text().splitlines()
    s = json.loads(line)
    assert s["session_id"] == "conv" and len(s["turns"]) == 3
    t0 = s["turns"][0]
    for key in ("type", "prompt", "response", "next_state", "trainable", "prompt_ids", "response_ids",
                "response_logprobs", "policy_version", "response_versions", "tenant", "sampling"):
        assert key in t0
    assert t0["next_state"]["content"] == "no, just the number"
    assert s["turns"][1]["next_state"]["content"] == "thanks!"
    assert s["turns"][2]["final"]

    # import: the exported file, plus a plain public-shape line without token fields
    plain = {"session_id": "plain", "turns": [
        {"type": "main", "prompt": "What is 2+2?", "response": "4", "next_state": "thanks", "trainable": True},
        {"type": "side", "prompt": "What is 2+2?", "response": "4", "trainable": False}]}
    inp = tmp_path / "in.jsonl"
    inp.write_text(line + "\n" + json.dumps(plain) + "\n")
    data2 = tmp_path / "imp"
    res = run_cli("import", "--data-dir", str(data2), "--file", str(inp), "--model-path", str(random_model_dir))
    assert res.returncode == 0, res.stderr
    assert "tokenized with the chat template" in res.stderr
    res = run_cli("export", "--data-dir", str(data2), "--out", str(tmp_path / "again.jsonl"))
    lines = [json.loads(x) for x in (tmp_path / "again.jsonl").read_text().splitlines()]
    assert [x["session_id"] for x in lines] == ["conv", "plain"]
    for a, b in zip(s["turns"], lines[0]["turns"]):
        assert a["prompt_ids"] == b["prompt_ids"] and a["response_ids"] == b["response_ids"]
        assert a["next_state"] == b["next_state"]
    p = lines[1]["turns"]
    assert p[0]["next_state"] == {"role": "user", "content": "thanks"} and p[0]["response_ids"]
    assert not p[1]["trainable"]
    # a second import of the same sessions is refused whole
    res = run_cli("import", "--data-dir", str(data2), "--file", str(inp), "--model-path", str(random_model_dir))
    assert res.returncode == 2 and "already in the store" in res.stderr


def test_import_rejects_bad_file_and_writes_nothing(tmp_path, random_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"session_id": "ok", "turns": [{"prompt": "a", "response": "b"}]}) + "\n"
                   + json.dumps({"session_id": "x", "turns": [{"prompt": "a", "response": 3}]}) + "\n")
    res = run_cli("import", "--data-dir", str(tmp_path / "d"), "--file", str(bad),
                  "--model-path", str(random_model_dir))
    assert res.returncode == 2 and "bad.jsonl:2" in res.stderr and "response" in res.stderr
    assert not (tmp_path / "d" / "clawloop.db").exists() or run_cli(
        "export", "--data-dir", str(tmp_path / "d"), "--out", "-").stdout == ""
