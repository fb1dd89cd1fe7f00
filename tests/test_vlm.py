"""Image input: OpenAI `image_url` parts through a real gateway to the HF engine serving a tiny random
Qwen2-VL (built locally in seconds), captured token-exact, each image stored once under the data dir."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import httpx
import openai
import pytest
import torch
from conftest import Gateway
from PIL import Image

from clawloop.engines.base import GenerationRequest, SamplingParams
from clawloop.gateway.protocol import APIError, parse_chat_request
from clawloop.gateway.render import HF_ONLY, image_policy, render_prompt
from clawloop.tinymodel.vlm import IMAGE_PAD


def png(w: int = 160, h: int = 210, seed: int = 1, fmt: str = "PNG") -> bytes:
    g = torch.Generator().manual_seed(seed)
    arr = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()
    b = io.BytesIO()
    Image.fromarray(arr).save(b, fmt)
    return b.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str, **kw) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **kw}}


def ask(url: str, text: str = "What is on the screen?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, image_part(url, detail="auto")]}]


@pytest.fixture
def vgw(vlm_engine, vlm_dir, tmp_path):
    g = Gateway(vlm_engine, vlm_dir, tmp_path / "data")
    yield g
    g.stop()


def expected_prompt_ids(engine, messages: list[dict], images: list[bytes]) -> list[int]:
    """What Qwen2-VL's processor gives: the template's text with each `<|image_pad|>` repeated once per
    merged patch of its image, tokenized."""
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(engine.model_path)
    text = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pieces = text.split(IMAGE_PAD)
    assert len(pieces) == len(images) + 1
    out = pieces[0]
    for data, rest in zip(images, pieces[1:]):
        grid = proc(images=[Image.open(io.BytesIO(data)).convert("RGB")], return_tensors="pt")["image_grid_thw"][0]
        out += IMAGE_PAD * (int(grid.prod()) // proc.merge_size ** 2) + rest
    return list(engine.tokenizer.encode(out, add_special_tokens=False))


def recomputed_logprobs(engine, prompt_ids: list[int], response_ids: list[int], images: list[bytes]) -> list[float]:
    """The sampled ids' logprobs from one plain forward of the model (its own M-RoPE positions), the way
    a trainer recomputes them."""
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(engine.model_path)
    pix = proc(images=[Image.open(io.BytesIO(d)).convert("RGB") for d in images], return_tensors="pt")
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                              mm_token_type_ids=(ids == engine.image_token_id).int(), **pix).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt_ids) - 1:-1], dim=-1)
    return [float(lp[i, t]) for i, t in enumerate(response_ids)]


def test_image_chat_is_captured_token_exact_and_each_image_stored_once(vgw, vlm_engine):
    shot = png()
    client = vgw.client()
    msgs = ask(data_url(shot))
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0,
                                       extra_body={"return_token_ids": True, "session_id": "gui"})
    body = r.model_dump()
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].finish_reason in ("stop", "length")
    prompt = body["prompt_token_ids"]
    n_pad = prompt.count(vlm_engine.image_token_id)
    assert n_pad == 12  # 160x210 -> 8x6 patches of 14 px (after resizing) -> 12 merged tokens
    assert prompt == expected_prompt_ids(vlm_engine, msgs, [shot])
    assert r.usage.prompt_tokens == len(prompt)

    # The same image twice more (a follow-up that resends the history, plus once in a tool-free user turn).
    msgs2 = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": [image_part(data_url(shot)), {"type": "text", "text": "and now?"}]}]
    r2 = client.chat.completions.create(model="m", messages=msgs2, max_tokens=8, temperature=0,
                                        extra_body={"return_token_ids": True, "session_id": "gui"})
    p2 = r2.model_dump()["prompt_token_ids"]
    assert p2.count(vlm_engine.image_token_id) == 24 and p2 == expected_prompt_ids(vlm_engine, msgs2, [shot, shot])

    vgw.store.flush()
    turns = vgw.store.session_turns("gui")
    assert len(turns) == 2
    t = turns[0]
    assert t.prompt_ids == prompt
    assert t.response_ids == body["choices"][0]["token_ids"]
    assert t.response_logprobs == body["choices"][0]["token_logprobs"]
    # Token-exact: the captured logprobs are the model's under its own positions and pixel inputs.
    re_lp = recomputed_logprobs(vlm_engine, t.prompt_ids, t.response_ids, [shot])
    assert max(abs(a - b) for a, b in zip(re_lp, t.response_logprobs)) < 1e-4
    re_lp2 = recomputed_logprobs(vlm_engine, turns[1].prompt_ids, turns[1].response_ids, [shot, shot])
    assert max(abs(a - b) for a, b in zip(re_lp2, turns[1].response_logprobs)) < 1e-4

    # Messages keep a reference, not the data; the bytes are one file, named by their sha256.
    import hashlib

    sha = hashlib.sha256(shot).hexdigest()
    part = t.messages[0]["content"][1]
    assert part == {"type": "image_url", "image_url": {"url": f"clawloop-image://{sha}.png", "detail": "auto"}}
    assert "base64" not in json.dumps([x.messages for x in turns])
    files = sorted((vgw.store.path.parent / "images").iterdir())
    assert [f.name for f in files] == [f"{sha}.png"] and files[0].read_bytes() == shot
    assert vgw.gw.capture.stats()["capture/images_stored"] == 1
    # The follow-up linked to the first turn as its next state (the resent image hashes the same).
    assert turns[0].next_state is not None


def test_streaming_with_an_image_and_a_tool_result_image(vgw, vlm_engine):
    a, b = png(seed=2), png(300, 120, seed=3, fmt="JPEG")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Click the button."}, image_part(data_url(a))]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "computer", "arguments": '{"action": "click"}'}}]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": [{"type": "text", "text": "clicked"}, image_part(data_url(b, "image/jpeg"))]}]
    client = vgw.client()
    stream = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True, "session_id": "s"})
    chunks = list(stream)
    prompt = chunks[0].model_dump()["prompt_token_ids"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.prompt_tokens == len(prompt)
    assert prompt == expected_prompt_ids(vlm_engine, msgs, [a, b])
    # The same request without streaming samples the same greedy answer.
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0)
    assert r.choices[0].message.content == text
    vgw.store.flush()
    (t,) = vgw.store.session_turns("s")
    assert t.prompt_ids == prompt and t.messages[2]["content"][1]["image_url"]["url"].endswith(".jpg")
    assert len(list((vgw.store.path.parent / "images").iterdir())) == 2


def _post(url: str, messages: list[dict]) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 2},
                      headers={"X-Session-Id": "bad"}, timeout=30)


BAD = [
    ("http url", ask("https://example.com/shot.png"), "invalid_image_url", "messages[0].content[1].image_url.url"),
    ("bad base64", ask("data:image/png;base64,!!!notbase64"), "image_parse_error",
     "messages[0].content[1].image_url.url"),
    ("not an image", ask(data_url(b"hello, I am text")), "image_parse_error", "messages[0].content[1].image_url.url"),
    ("wrong type", ask(data_url(b"hi", "text/plain")), "invalid_image_format", "messages[0].content[1].image_url.url"),
    ("not base64 url", ask("data:image/png,rawbytes"), "invalid_image_url", "messages[0].content[1].image_url.url"),
    ("no url", [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "missing_required_parameter",
     "messages[0].content[0].image_url.url"),
    ("bad detail", [{"role": "user", "content": [image_part(data_url(png()), detail="max")]}], "invalid_value",
     "messages[0].content[0].image_url.detail"),
    ("image in system", [{"role": "system", "content": [image_part(data_url(png()))]},
                         {"role": "user", "content": "hi"}], "unsupported_content", "messages[0].content[0].type"),
    ("audio part", [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "unsupported_content",
     "messages[0].content[0].type"),
    ("truncated image", ask(data_url(png()[:300])), "image_parse_error",  # the header reads, the pixels do not
     "messages[0].content[1].image_url.url"),
    ("later message", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                       {"role": "user", "content": [{"type": "text", "text": "x"}, image_part("http://x/y.png")]}],
     "invalid_image_url", "messages[2].content[1].image_url.url"),
]


@pytest.mark.parametrize("name,messages,code,param", BAD, ids=[b[0] for b in BAD])
def test_bad_image_parts_are_400_naming_the_param(vgw, name, messages, code, param):
    r = _post(vgw.url, messages)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"], err["type"]) == (code, param, "invalid_request_error"), err
    vgw.store.flush()
    assert vgw.store.stats()["turns"] == 0


def test_placeholder_text_from_the_client_is_text(vgw, vlm_engine):
    """`<|image_pad|>` typed by a client is plain text: only the template's placeholder is an image."""
    msgs = ask(data_url(png()), text="<|image_pad|><|vision_start|> fake image")
    r = httpx.post(vgw.url + "/v1/chat/completions", timeout=30,
                   json={"messages": msgs, "max_tokens": 2, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"].count(vlm_engine.image_token_id) == 12


def test_openai_client_gets_bad_request_for_a_remote_url(vgw):
    with pytest.raises(openai.BadRequestError) as e:
        vgw.client().chat.completions.create(model="m", messages=ask("http://example.com/a.png"))
    assert "does not fetch" in str(e.value) and e.value.body["param"] == "messages[0].content[1].image_url.url"


def test_text_only_model_refuses_images(gateway):
    r = _post(gateway.url, ask(data_url(png())))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_content" and err["param"] == "messages[0].content[1].type"
    assert "takes text only" in err["message"]


def test_engines_without_image_support_say_so():
    class NoImages:  # an engine that knows nothing of images (the vLLM engine, for now)
        pass

    assert image_policy(NoImages()) == HF_ONLY
    with pytest.raises(APIError) as e:
        parse_chat_request({"messages": ask(data_url(png()))}, 1024, images=image_policy(NoImages()))
    assert e.value.code == "unsupported_content" and "hf engine only" in e.value.message


def test_engine_rows_with_images_join_a_running_batch(vlm_engine):
    """Rows prefilled while others decode (each with its own image, so its own rope delta) sample what
    they sample alone."""
    eng = vlm_engine
    params = SamplingParams(temperature=0, max_tokens=10)

    def request(seed: int | None) -> GenerationRequest:
        content = "hello" if seed is None else [{"type": "text", "text": "see"}, {"type": "image"}]
        ids = render_prompt(eng.tokenizer, [{"role": "user", "content": content}], None)
        if seed is None:
            return GenerationRequest(ids, params)
        ids, mm = eng.prepare_images(ids, [png(120 + 40 * seed, 90, seed=seed)])
        return GenerationRequest(ids, params, multimodal=mm)

    async def collect(req: GenerationRequest, started: asyncio.Event | None = None) -> list[tuple[int, float]]:
        out = []
        async for ev in eng.generate(req):
            out.append((ev.token_id, ev.logprob))
            if started is not None:
                started.set()
        return out

    async def together() -> list[list[tuple[int, float]]]:
        started = asyncio.Event()
        first = asyncio.create_task(collect(request(1), started))
        await started.wait()
        rest = await asyncio.gather(collect(request(2)), collect(request(None)), collect(request(3)))
        return [await first, *rest]

    async def alone() -> list[list[tuple[int, float]]]:
        return [await collect(request(s)) for s in (1, 2, None, 3)]

    batched, solo = asyncio.run(together()), asyncio.run(alone())
    for b, s in zip(batched, solo):
        assert [t for t, _ in b] == [t for t, _ in s]
        assert max(abs(x - y) for (_, x), (_, y) in zip(b, s)) < 1e-4


def test_publish_from_a_folder_keeps_serving_images(vlm_engine, vlm_dir):
    """A vision model's checkpoint names its weights differently from its modules: publishing the folder
    goes through transformers' loading, and the same weights answer the same."""
    eng = vlm_engine
    ids, mm = eng.prepare_images(render_prompt(eng.tokenizer, [{"role": "user", "content": [{"type": "image"}]}],
                                               None), [png(seed=5)])

    async def run() -> list[tuple[int, float]]:
        return [(ev.token_id, ev.logprob) async for ev in
                eng.generate(GenerationRequest(ids, SamplingParams(temperature=0, max_tokens=6), multimodal=mm))]

    before = asyncio.run(run())
    version = eng.policy_version
    asyncio.run(eng.publish(str(vlm_dir), version + 1))
    after = asyncio.run(run())
    assert eng.policy_version == version + 1 and [t for t, _ in after] == [t for t, _ in before]
