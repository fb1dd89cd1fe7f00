"""What the gateway does with the parts of the Engine contract the hf engine never
exercises: version spans from an engine that swaps weights under a running
request (vLLM), and an engine with no replica up (503 + Retry-After, nothing
captured). The real hf engine generates; a thin wrapper adds what only a vLLM
server would do (the vLLM suite, `make test-vllm`, covers the real thing).
Also: `--backend vllm` without the vLLM environment is a one-line error."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import run_cli


class SwappingEngine:
    """The real hf engine, reporting that tokens from `switch_at` on came from `new_version`."""

    def __init__(self, inner, switch_at: int, new_version: int):
        self.inner, self.switch_at, self.new_version = inner, switch_at, new_version
        self.tokenizer = inner.tokenizer
        self.eos_token_ids = inner.eos_token_ids
        self.available = True

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    async def generate(self, request):
        if not self.available:
            from clawloop.engines.base import EngineUnavailable

            raise EngineUnavailable("replica0 restarting", retry_after_s=7)
        n = 0
        v0 = self.inner.policy_version
        async for ev in self.inner.generate(request):
            n += 1 if ev.token_id is not None else 0
            if ev.finish_reason is not None:
                ev = dataclasses.replace(ev, version_spans=[(0, self.switch_at, v0),
                                                            (self.switch_at, n, self.new_version)])
            yield ev


def test_version_spans_become_per_token_versions(engine, make_gateway):
    wrapped = SwappingEngine(engine, switch_at=3, new_version=engine.policy_version + 1)
    g = make_gateway(engine=wrapped)
    c = g.client()
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
                                  temperature=1.0, seed=1, extra_headers={"X-Session-Id": "mixed"},
                                  extra_body={"return_token_ids": True})
    ch = r.choices[0].model_extra
    n = len(ch["token_ids"])
    assert n > 3
    v0 = engine.policy_version
    assert ch["token_versions"] == [v0] * 3 + [v0 + 1] * (n - 3)
    g.store.flush()
    (turn,) = g.store.session_turns("mixed")
    assert turn.response_versions == [v0] * 3 + [v0 + 1] * (n - 3)
    assert turn.policy_version == v0  # the oldest: a mixed response is never labelled with one version


def test_unmixed_turn_keeps_one_version(engine, make_gateway):
    g = make_gateway()
    c = g.client()
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
                              extra_headers={"X-Session-Id": "plain"})
    g.store.flush()
    (turn,) = g.store.session_turns("plain")
    assert turn.response_versions is None and turn.policy_version == engine.policy_version


def test_no_replica_up_is_a_503_with_retry_after_and_nothing_captured(engine, make_gateway):
    import httpx
    import openai

    wrapped = SwappingEngine(engine, switch_at=0, new_version=0)
    wrapped.available = False
    g = make_gateway(engine=wrapped)
    c = g.client()
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      stream=stream, extra_headers={"X-Session-Id": "down"})
        assert e.value.status_code == 503
        assert e.value.response.headers["retry-after"]
        assert e.value.body["code"] == "engine_unavailable" and e.value.body["type"] == "server_error"
    g.store.flush()
    assert g.store.session_turns("down") == []
    # Available again but failing before the first token (a replica that just died): 503 too.
    wrapped.available = True
    calls = {"n": 0}

    async def dying(request):
        from clawloop.engines.base import EngineUnavailable

        calls["n"] += 1
        raise EngineUnavailable("replica0 failed mid-request")
        yield  # pragma: no cover

    wrapped.generate = dying
    r = httpx.post(g.url + "/v1/chat/completions", json={"model": "m", "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "hi"}]},
                   headers={"X-Session-Id": "down"})
    assert r.status_code == 503 and r.headers["retry-after"] and calls["n"] == 1
    assert r.json()["error"]["code"] == "engine_unavailable"


def test_backend_vllm_without_its_environment_is_one_clear_line(tmp_path):
    res = run_cli("serve", "--backend", "vllm", "--vllm-python", str(tmp_path / "nope" / "python"),
                  "--data-dir", str(tmp_path / "d"), "--port", "18999")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "make vllm" in lines[0] and "Traceback" not in res.stderr, res.stderr


def test_engine_url_needs_backend_vllm(tmp_path):
    res = run_cli("serve", "--engine-url", "http://127.0.0.1:9", "--data-dir", str(tmp_path / "d"))
    assert res.returncode == 2 and "--backend vllm" in res.stderr


def test_untied_copy_for_tied_models(random_model_dir, tmp_path):
    """vLLM serves a tied model from an untied copy (its in-place reload would leave a tied head
    stale): same files, the head written out, and the config says untied."""
    from safetensors import safe_open

    from clawloop.engines.vllm import VLLMEngine

    eng = VLLMEngine(random_model_dir, urls=["http://127.0.0.1:9"], data_dir=tmp_path)
    assert eng._tied()
    out = eng._untied_model_dir()
    cfg = json.loads((tmp_path / "weights" / "base-untied" / "config.json").read_text())
    assert out.endswith("base-untied") and cfg["tie_word_embeddings"] is False
    with safe_open(str(random_model_dir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
    with safe_open(out + "/zz-lm_head.safetensors", "pt") as f:
        assert (f.get_tensor("lm_head.weight") == embed).all()
    assert eng._untied_model_dir() == out  # reused, not rewritten
    # A publish of a tied state dict carries the head explicitly.
    import torch

    eng.serve_dir = out
    path = eng._write_full({"model.embed_tokens.weight": torch.ones(3, 2)}, 4)
    with safe_open(path + "/model.safetensors", "pt") as f:
        assert set(f.keys()) == {"model.embed_tokens.weight", "lm_head.weight"}


def test_colocate_needs_cuda(random_model_dir, tmp_path):
    import shutil

    from clawloop.config import ConfigError
    from clawloop.engines.vllm import VLLMEngine

    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has CUDA: --colocate is allowed")
    with pytest.raises(ConfigError, match="sleep_while_training"):
        VLLMEngine(random_model_dir, urls=["http://127.0.0.1:9"], data_dir=tmp_path, sleep_mode=True)
