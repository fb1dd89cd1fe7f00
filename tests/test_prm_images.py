"""The step PRM shows the judge a GUI step's screenshot when the judge model takes images: the tiny random
Qwen2-VL as a frozen judge in-process and behind a real gateway (`--prm url`), and a text judge that gets the
same prompt as text (a gateway on the tiny text model refuses the image part once; the PRM remembers)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Gateway
from test_vlm import data_url, expected_prompt_ids, image_part, png

from clawloop.envs.prm import StepPRM
from clawloop.judge.prompts import IMAGES_NOTE

SHOT = png(seed=21)
HISTORY = [{"role": "system", "content": "You operate a web page."},
           {"role": "user", "content": "Click the OK button."}]
ACTION = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "computer", "arguments": '{"action": "click", "ref": 3}'}}]}
OBSERVATION = [{"role": "tool", "tool_call_id": "c1",
                "content": [{"type": "text", "text": "clicked [3] button OK"}, image_part(data_url(SHOT))]}]
SMALL = {"prm_votes": 1, "prm_max_tokens": 4, "prm_temperature": 0}


def test_frozen_vlm_judge_sees_the_screenshot(vlm_dir):
    prm = StepPRM.from_data({"prm": "frozen", "prm_model": str(vlm_dir), **SMALL}, "http://unused/v1", "gui")
    engine = prm.judge.backend.engine
    assert prm.judge.backend.takes_images is True
    seen = []
    generate = engine.generate

    def recording(req):
        seen.append(req)
        return generate(req)

    engine.generate = recording
    try:
        out = prm.score(HISTORY, ACTION, OBSERVATION, {})
    finally:
        prm.close()
    assert out["score"] in (-1, 0, 1) and len(out["votes"]) == 1, out
    (req,) = seen
    assert req.multimodal is not None and req.prompt_ids.count(engine.image_token_id) == 12
    # exactly the judge prompt with the screenshot after its text, expanded as the model's processor does
    from clawloop.judge.base import response_of
    from clawloop.judge.prompts import score_messages
    from clawloop.records import Turn

    said = response_of(Turn(session_id="x", index=0, response_text="", tool_calls=ACTION["tool_calls"]))
    msgs = score_messages(HISTORY, said, {"role": "user", "content": OBSERVATION[0]["content"]}, [data_url(SHOT)])
    text = msgs[1]["content"][0]["text"]
    assert text.endswith(IMAGES_NOTE) and "clicked [3] button OK" in text and "click" in said
    assert req.prompt_ids == expected_prompt_ids(engine, msgs, [SHOT])


def test_url_judge_at_a_vlm_gateway_gets_the_image(vlm_engine, vlm_dir, tmp_path):
    gw = Gateway(vlm_engine, vlm_dir, tmp_path / "data")
    try:
        prm = StepPRM.from_data({"prm": "url", "prm_url": gw.url, **SMALL}, "http://unused/v1", "gui")
        try:
            out = prm.score(HISTORY, ACTION, OBSERVATION, {})
            assert prm.judge.backend.takes_images is True
        finally:
            prm.close()
        assert out["score"] in (-1, 0, 1) and "error" not in out, out
        gw.store.flush()
        (turn,) = [t for _, ts in gw.store.iter_sessions() for t in ts]  # the judge's call, a side turn
        assert turn.prompt_ids.count(vlm_engine.image_token_id) == 12
        images = list((tmp_path / "data" / "images").iterdir())
        assert len(images) == 1 and images[0].read_bytes() == SHOT  # the gateway received the screenshot
    finally:
        gw.stop()


def test_text_judge_gets_the_prompt_as_text(gateway):
    """A gateway on a text model answers 400 to the image part: the same prompt goes again as text, and
    later prompts go as text from the start."""
    prm = StepPRM.from_data({"prm": "url", "prm_url": gateway.url, **SMALL}, "http://unused/v1", "gui")
    calls = []
    backend = prm.judge.backend
    post = backend._client.post

    async def counting(url, json):
        calls.append(json["messages"][1]["content"])
        return await post(url, json=json)

    backend._client.post = counting
    try:
        first = prm.score(HISTORY, ACTION, OBSERVATION, {})
        second = prm.score(HISTORY, ACTION, OBSERVATION, {})
    finally:
        prm.close()
    assert first["score"] in (-1, 0, 1) and "error" not in first, first
    assert second["score"] in (-1, 0, 1) and "error" not in second, second
    assert backend.takes_images is False
    assert isinstance(calls[0], list) and calls[0][1]["type"] == "image_url"  # tried once with the image
    assert all(isinstance(c, str) and "clicked [3] button OK" in c and IMAGES_NOTE not in c for c in calls[1:])
    assert len(calls) == 3


def test_a_text_engine_judge_never_gets_images(engine):
    """An in-process text judge (`--prm frozen` on a text model) says it takes no images: its prompt is text."""
    from clawloop.judge.llm import EngineChatBackend, LLMJudge
    from clawloop.records import Turn

    backend = EngineChatBackend(engine)
    assert backend.takes_images is False
    judge = LLMJudge(backend, name="t", votes=1, hints=False, max_tokens=2, temperature=0)
    sent = []
    complete = backend.complete

    async def recording(messages, **kw):
        sent.append(messages)
        return await complete(messages, **kw)

    backend.complete = recording
    turn = Turn(session_id="s", index=0, messages=HISTORY, response_text="ok",
                next_state={"role": "user", "content": OBSERVATION[0]["content"]})
    asyncio.run(judge.judge(turn))
    assert isinstance(sent[0][1]["content"], str) and "clicked [3] button OK" in sent[0][1]["content"]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
