"""Legacy /v1/completions against a real server on loopback (one per module), through the
official `openai` client; raw httpx only where the client cannot send the bad input."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from conftest import Gateway

P = "What is 12+7?"


@pytest.fixture(scope="module")
def gw(engine, random_model_dir, tmp_path_factory):
    g = Gateway(engine, random_model_dir, tmp_path_factory.mktemp("completions"))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def client(gw):
    return gw.client()


def test_shape_logprobs_and_offsets(client):
    r = client.completions.create(model="m", prompt=P, max_tokens=6, logprobs=3, temperature=0, seed=1)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == "m"
    ch = r.choices[0]
    assert ch.index == 0 and ch.finish_reason in ("stop", "length") and isinstance(ch.text, str)
    lp = ch.logprobs
    assert 1 <= len(lp.tokens) <= r.usage.completion_tokens <= 6
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset[0] == len(P)  # offsets run over prompt + completion
    for k in range(len(lp.tokens) - 1):
        assert lp.text_offset[k + 1] - lp.text_offset[k] == len(lp.tokens[k])
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and tok in top and top[tok] == pytest.approx(l)
        assert len(top) <= 4
        assert l == pytest.approx(max(top.values()))  # greedy: the sampled token is the likeliest
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_prompt_forms_batch_and_seeds(gw, client):
    ids = gw.gw.tok.encode(P)
    kw = dict(model="m", max_tokens=8, temperature=1.0, seed=7)
    alone = client.completions.create(prompt=P, **kw).choices[0].text
    assert client.completions.create(prompt=ids, **kw).choices[0].text == alone
    assert client.completions.create(prompt=[ids], **kw).choices[0].text == alone
    batch = client.completions.create(prompt=["Hello", P], n=2, **kw)
    # choice index = prompt * n + j; choice j of each prompt uses seed + j, as a request of its own would
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[2].text == alone
    assert batch.choices[3].text == client.completions.create(prompt=P, **{**kw, "seed": 8}).choices[0].text
    assert batch.usage.prompt_tokens == len(gw.gw.tok.encode("Hello")) + len(ids)


def test_echo_prompt_logprobs_agree_with_the_engines_sampling(client):
    """The prompt logprobs `echo` computes in one forward pass equal, at the sampled positions, the
    logprobs the engine reported while decoding incrementally (same model, same distribution)."""
    first = client.completions.create(model="m", prompt=P, max_tokens=6, seed=3, extra_body={"return_token_ids": True})
    ch = first.choices[0].model_extra
    prompt_ids, ids, lps = ch["prompt_token_ids"], ch["token_ids"], ch["token_logprobs"]
    scored = client.completions.create(model="m", prompt=prompt_ids + ids, max_tokens=0, echo=True, logprobs=2)
    c = scored.choices[0]
    assert c.finish_reason == "length" and scored.usage.completion_tokens == 0
    assert c.text.startswith(P)
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert c.logprobs.text_offset[0] == 0
    echoed = c.logprobs.token_logprobs[len(prompt_ids):]
    assert echoed == pytest.approx(lps, abs=1e-4)
    # and with generation after the echo, the text starts with the prompt
    r = client.completions.create(model="m", prompt=P, max_tokens=3, echo=True, seed=1)
    assert r.choices[0].text.startswith(P)


def test_best_of_returns_the_highest_mean_logprob(client):
    kw = dict(model="m", prompt=P, max_tokens=6, seed=11, logprobs=0)
    four = client.completions.create(n=4, **kw)
    all4 = four.choices
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in all4]
    best = client.completions.create(n=1, best_of=4, **kw)
    assert len(best.choices) == 1 and best.choices[0].index == 0
    assert best.choices[0].text == all4[max(range(4), key=means.__getitem__)].text
    assert best.usage.completion_tokens == four.usage.completion_tokens  # all four were generated


def test_stream_matches_non_stream_with_usage_and_done(gw, client):
    # 32 tokens, not 10: tokens ready together leave as one chunk (serving.drain), so a short answer on a
    # loaded machine can come in one
    kw = dict(model="m", prompt=P, max_tokens=32, seed=5)
    full = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.text and len([c for c in chunks if c.choices and c.choices[0].text]) >= 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 32
    with httpx.stream("POST", gw.url + "/v1/completions", json={**kw, "stream": True, "echo": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["choices"][0]["text"] == P


def test_stop_strings_truncate(client):
    base = client.completions.create(model="m", prompt=P, max_tokens=30, temperature=0).choices[0].text
    stop = base[4:6]
    r = client.completions.create(model="m", prompt=P, max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == base[:base.index(stop)] and r.choices[0].finish_reason == "stop"


def test_logit_bias_is_honoured(gw, client):
    tid = gw.gw.tok.encode(" 19")[-1]
    r = client.completions.create(model="m", prompt=P, max_tokens=5, logit_bias={str(tid): 100},
                                  extra_body={"return_token_ids": True})
    assert set(r.choices[0].model_extra["token_ids"]) == {tid}


def test_min_tokens_holds_the_end_back(gw, client):
    end = gw.gw.tok.eos_token_id
    ask = dict(model="m", prompt=P, max_tokens=10, logit_bias={str(end): 100})
    assert client.completions.create(**ask).usage.completion_tokens == 1
    assert client.completions.create(**ask, extra_body={"min_tokens": 4}).usage.completion_tokens >= 4
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=P, max_tokens=3, extra_body={"min_tokens": 4})
    assert e.value.body["param"] == "min_tokens"


def test_capture_only_with_a_session_and_as_side_turns(gw, client):
    def sessions():
        gw.store.flush()
        return dict(gw.store.iter_sessions())

    before = set(sessions())
    client.completions.create(model="m", prompt=P, max_tokens=3)
    client.completions.create(model="m", prompt=P, max_tokens=3, extra_headers={"X-Session-Id": "c-nostore"},
                              extra_body={"store": False})
    assert set(sessions()) == before
    r = client.completions.create(model="m", prompt=[P, "Hello"], n=2, max_tokens=3,
                                  extra_headers={"X-Session-Id": "c1"}, extra_body={"return_token_ids": True})
    turns = sessions()["c1"]
    assert len(turns) == 4 and {t.type for t in turns} == {"side"} and not any(t.trainable for t in turns)
    assert sorted({t.index for t in turns}) == [0, 1]
    t0 = next(t for t in turns if t.index == 0 and t.choice_index == 1)
    ch = r.choices[1].model_extra
    assert t0.prompt_ids == ch["prompt_token_ids"] and t0.response_ids == ch["token_ids"]
    assert t0.messages == [{"role": "user", "content": P}] and t0.sampling["endpoint"] == "completions"


def test_models_by_id(client):
    m = client.models.retrieve("clawloop")
    assert m.id == "clawloop" and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"


BAD = [
    ("missing prompt", {}, "missing_required_parameter", "prompt"),
    ("empty prompt", {"prompt": ""}, "invalid_value", "prompt"),
    ("empty list", {"prompt": []}, "invalid_value", "prompt"),
    ("id out of range", {"prompt": [1, 99999]}, "invalid_value", "prompt"),
    ("mixed list", {"prompt": ["a", 3]}, "invalid_value", "prompt[1]"),
    ("suffix", {"prompt": P, "suffix": "x"}, "unsupported_parameter", "suffix"),
    ("best_of below n", {"prompt": P, "n": 3, "best_of": 2}, "invalid_value", "best_of"),
    ("best_of streamed", {"prompt": P, "best_of": 2, "stream": True}, "invalid_value", "best_of"),
    ("max_tokens 0", {"prompt": P, "max_tokens": 0}, "invalid_value", "max_tokens"),
    ("logprobs range", {"prompt": P, "logprobs": 30}, "invalid_value", "logprobs"),
    ("temperature", {"prompt": P, "temperature": 3}, "invalid_value", "temperature"),
    ("n zero", {"prompt": P, "n": 0}, "invalid_value", "n"),
    ("stop list", {"prompt": P, "stop": ["a", "b", "c", "d", "e"]}, "invalid_value", "stop"),
    ("logit_bias key", {"prompt": P, "logit_bias": {"abc": 1}}, "invalid_value", "logit_bias"),
    ("echo type", {"prompt": P, "echo": "yes"}, "invalid_type", "echo"),
    ("context", {"prompt": [5] * 5000}, "context_length_exceeded", "prompt"),
    ("stream_options alone", {"prompt": P, "stream_options": {"include_usage": True}}, "invalid_value",
     "stream_options"),
]


@pytest.mark.parametrize("name,body,code,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_400_naming_the_parameter(gw, name, body, code, param):
    r = httpx.post(gw.url + "/v1/completions", json=body, headers={"X-Session-Id": "bad"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param and err["type"] == "invalid_request_error"
    gw.store.flush()
    assert "bad" not in dict(gw.store.iter_sessions())


class _NoModel:
    """The engine without `model`: as an engine that cannot score prompts (vLLM) looks."""

    def __init__(self, engine):
        self._e = engine

    def __getattr__(self, name):
        if name == "model":
            raise AttributeError(name)
        return getattr(self._e, name)


def test_echo_logprobs_refused_where_the_engine_has_no_model(make_gateway, engine):
    g = make_gateway(engine=_NoModel(engine))
    with pytest.raises(openai.BadRequestError) as e:
        g.client().completions.create(model="m", prompt=P, max_tokens=2, echo=True, logprobs=1)
    assert e.value.body["param"] == "echo"
    r = g.client().completions.create(model="m", prompt=P, max_tokens=2, echo=True)  # echo alone is fine
    assert r.choices[0].text.startswith(P) and math.isfinite(r.usage.total_tokens)


def test_a_timeout_is_a_504_and_keeps_what_was_generated(make_gateway, engine):
    g = make_gateway(serve__request_timeout_s="0.5")
    # end-of-text banned: 1000 tokens take seconds on this model, so the 0.5 s limit is what ends it
    no_eos = {str(engine.tokenizer.eos_token_id): -100}
    r = httpx.post(g.url + "/v1/completions", json={"prompt": P, "max_tokens": 1000, "logit_bias": no_eos},
                   headers={"X-Session-Id": "slow"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    g.store.flush()
    (turn,) = g.store.session_turns("slow")
    assert turn.finish_reason == "abort" and turn.type == "side" and 0 < len(turn.response_ids) < 1000
    with httpx.stream("POST", g.url + "/v1/completions", json={"prompt": P, "max_tokens": 1000, "stream": True,
                                                              "logit_bias": no_eos}) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert json.loads(lines[-1][6:])["error"]["code"] == "timeout"
