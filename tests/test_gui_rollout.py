"""The GUI track end to end: buffer -> gui generator process -> env pool (headless chromium, MiniWoB++ pages)
-> the real gateway (token ids on) -> multi-step items with a screenshot per step -> BufferSource -> one
training step."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from conftest import Gateway, make_cfg, needs_part
from test_agent_rollout import _rollout

from clawloop.envs import gui

WHY = gui.missing_requirements("playwright")
pytestmark = [pytest.mark.browser, needs_part("browser", WHY and f"gui track cannot run here: {WHY}")]


@pytest.fixture
def rig(engine, random_model_dir, tmp_path):
    from clawloop.buffer import BufferThread

    gw = Gateway(engine, random_model_dir, tmp_path / "gw")
    cfg = make_cfg(random_model_dir, tmp_path / "buf", train__method="binary", train__source="buffer",
                   train__buffer_url="http://placeholder", train__lr="1e-3")
    buf = BufferThread(cfg).start()
    yield gw, buf, cfg
    buf.stop()
    gw.stop()


def _png(path: str) -> bytes:
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return data


def test_gui_oracle_noop_and_model_through_gateway_then_train(rig, engine, random_model_dir, tmp_path):
    from clawloop.buffer import BufferSource
    from clawloop.trainer import Trainer, TrainerLoop

    gw, buf, cfg = rig
    common = {"task_type": "gui", "task_ids": ["click-button", "enter-text"], "num_tasks": 2, "max_steps": 6,
              "max_tokens": 16, "num_process": 2, "prm": "offline"}
    items = _rollout(buf.url, gw.url, agent=["oracle", "noop"], num_repeat_per_sample=2, **common)
    assert len(items) == 4
    for it in items:
        x = it["extra_info"]
        oracle = x["behaviour"] == "oracle"
        assert x["success"] is oracle and x["outcome"] == (1.0 if oracle else -1.0)
        assert "raw_reward" in x["details"] and x["token_exact"]
        shots = x["screenshots"]
        # a PNG per observation, beside the item (the buffer's artifacts/gui/<uid>/), paths in the metadata
        assert shots["dir"].startswith(str(tmp_path / "buf" / "artifacts" / "gui")) and it["uid"] in shots["dir"]
        assert _png(shots["reset"]) and len(shots["steps"]) == len(it["steps"])
        for st in it["steps"]:
            assert st["screenshot"] == shots["steps"][st["step"]] and _png(st["screenshot"])
            assert "screenshot_png_b64" not in st["info"]
        if oracle:
            assert x["n_steps"] >= 1 and all(st["info"]["calls"] for st in it["steps"])
            # the observation the agent read: the task's utterance and the element list with refs
            assert "Task:" in it["messages"][1]["content"] and "] button" in it["messages"][1]["content"]
    # the model (random weights) beside the oracle: real sampled steps with the engine's logprobs
    mixed = _rollout(buf.url, gw.url, agent=["model", "oracle"], num_repeat_per_sample=2,
                     **{**common, "task_ids": ["click-test"], "num_tasks": 1})
    model = [it for it in mixed if it["extra_info"]["behaviour"] == "model"]
    assert model and all(st["token_exact"] and len(st["response_ids"]) == len(st["response_logprobs"]) > 0
                         for it in model for st in it["steps"])

    source = BufferSource(buf.url, engine.tokenizer)
    samples = source.to_samples(items)
    assert len(samples) == sum(len(it["steps"]) for it in items)
    trainer = Trainer(cfg, str(random_model_dir))
    tl = TrainerLoop(cfg, trainer, None, None, "offline", buffer_source=source)
    before = [p.detach().clone() for p in trainer.model.parameters()][:3]
    tl.pending = list(samples)
    cfg.train.rollout_batch_size = len(samples)

    async def step():
        return await asyncio.get_running_loop().run_in_executor(None, tl.run_once)

    assert asyncio.run(step()) is True
    after = [p.detach() for p in trainer.model.parameters()][:3]
    assert any(not (a == b).all() for a, b in zip(before, after))


def test_screenshot_observations_are_image_parts_and_stripped_from_items(tmp_path):
    """An item keeps each screenshot as the gateway's reference (`clawloop-image://<sha256>.png`), its bytes
    written once under the images folder; a data URL that is no image becomes a marker."""
    import hashlib

    from test_vlm import png as make_png

    from clawloop.envs.rollout import _strip_images

    data = make_png(seed=4)
    b64 = base64.b64encode(data).decode()
    msg = {"role": "tool", "tool_call_id": "c", "content": [
        {"type": "text", "text": "clicked"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"\x89PNG..").decode()}}]}
    out = _strip_images(msg, tmp_path / "images")
    assert _strip_images(msg, tmp_path / "images") == out  # twice: the same reference, one file
    sha = hashlib.sha256(data).hexdigest()
    assert out["content"][0] == msg["content"][0]
    assert out["content"][1]["image_url"]["url"] == f"clawloop-image://{sha}.png"
    assert "did not parse" in out["content"][2]["image_url"]["url"] and b64 not in json.dumps(out)
    assert [f.name for f in (tmp_path / "images").iterdir()] == [f"{sha}.png"]
    assert (tmp_path / "images" / f"{sha}.png").read_bytes() == data


def test_screenshot_observations_reach_a_vlm_token_exact(vlm_engine, vlm_dir, tmp_path):
    """`--gui-observation screenshot`: each observation's PNG goes to the gateway as an image_url part, the
    tiny VLM sees it (the prompt ids hold its image tokens), each step is token-exact, and the item keeps
    references to the PNGs instead of data URLs. Then the item trains: BufferSource makes a sample per step,
    the trainer rebuilds each step's pixel inputs from the stored images and its logprobs are the served ones."""
    from clawloop.envs.rollout import AgentRollout

    gw = Gateway(vlm_engine, vlm_dir, tmp_path / "gw")
    try:
        ro = AgentRollout("gui", {"remote_engine_url": gw.url + "/v1", "remote_buffer_url": "http://unused",
                                  "gui_observation": "screenshot", "max_steps": 2, "max_tokens": 8,
                                  "num_process": 1, "artifact_dir": str(tmp_path / "art")})
        try:
            item = ro.run_episode("click-button", "model")
        finally:
            ro.pool.shutdown()
    finally:
        gw.stop()
    assert item is not None and item["steps"]
    pad = vlm_engine.image_token_id
    for st in item["steps"]:
        assert st["token_exact"] and st["prompt_ids"].count(pad) > 0
        assert len(st["response_ids"]) == len(st["response_logprobs"]) > 0
    first_user = item["messages"][1]["content"]
    assert isinstance(first_user, list) and first_user[-1]["type"] == "image_url"
    assert "base64" not in json.dumps(item["messages"])
    assert _png(item["extra_info"]["screenshots"]["reset"])
    # what the gateway captured for the VLM: the image stored once per distinct screenshot under its data dir;
    # the item names the same files (the rollout wrote them to its own images folder too)
    captured = sorted(p.name for p in (tmp_path / "gw" / "images").glob("*.png"))
    assert captured and sorted(p.name for p in (tmp_path / "art" / "images").glob("*.png")) == captured

    from clawloop.buffer.source import BufferSource
    from clawloop.trainer import Trainer

    samples = BufferSource("http://unused").to_samples([item, {**item, "uid": "copy", "reward": -1.0,
                                                               "raw_reward": -1.0}])
    assert len(samples) == 2 * len(item["steps"])
    cfg = make_cfg(vlm_dir, tmp_path / "gw", train__method="binary", train__lr="1e-3")
    stats = Trainer(cfg, str(vlm_dir)).step(samples, served_version=vlm_engine.policy_version)
    assert stats["train/image_samples_skipped"] == 0 and stats["train/images"] >= len(samples)
    assert stats["train/logprob_diff_abs_mean"] < 1e-3 and stats["train/logprob_diff_abs_max"] < 1e-3, stats
