"""Rollout buffer: default hooks (pure), and the service on a real uvicorn server on
127.0.0.1 with a real SQLite file: group completion, validity, normalization,
padding, stale groups, restart durability, exactly-once hand-out, bad input."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from clawloop.buffer import BufferThread
from clawloop.buffer.hooks import (
    default_filter_item,
    default_get_group_data_meta_info,
    default_is_valid_group,
    default_normalize_group_data,
    default_pad_group_data,
)
from clawloop.config import load_config


def buffer_cfg(data_dir, **buffer):
    cfg = load_config({"data_dir": str(data_dir)}, env={})
    cfg.buffer.port = 0
    cfg.train.n_samples_per_prompt = buffer.pop("group_size", 4)
    for k, v in buffer.items():
        setattr(cfg.buffer, k, v)
    return cfg


@pytest.fixture
def make_buffer(tmp_path):
    made = []

    def _make(data_dir=None, **buffer):
        srv = BufferThread(buffer_cfg(data_dir or tmp_path / "data", **buffer)).start()
        made.append(srv)
        return srv, httpx.Client(base_url=srv.url, timeout=30)

    yield _make
    for srv in made:
        if srv.thread.is_alive():
            srv.stop()


def item(iid, reward, k=0, **extra):
    return {"instance_id": iid, "reward": reward, "uid": f"{iid}-{k}",
            "messages": [{"role": "user", "content": f"q{iid}"}, {"role": "assistant", "content": f"a{k}"}],
            **extra}


def stats(c):
    return c.get("/buffer/stats").json()["data"]["data"][0]


# -- default hooks, worked out by hand ----------------------------------------------------
def test_normalize_is_grpo_within_group():
    _, items = default_normalize_group_data(("g", [{"reward": r} for r in (1.0, 0.0, 0.0, 1.0)]))
    # mean 0.5, population std 0.5 -> +-1
    assert [round(it["reward"], 6) for it in items] == [1.0, -1.0, -1.0, 1.0]
    assert [it["raw_reward"] for it in items] == [1.0, 0.0, 0.0, 1.0]


def test_normalize_skips_degenerate_group():
    _, items = default_normalize_group_data(("g", [{"reward": 1.0}, {"reward": 1.0}, {"reward": 1.0}]))
    assert [it["reward"] for it in items] == [0.0, 0.0, 0.0]
    assert [it["raw_reward"] for it in items] == [1.0, 1.0, 1.0]


def test_pad_keeps_total_weight():
    # 3 of 4 arrived; normalized rewards sum to 0 in general, so use asymmetric values
    rewards = [0.9, -0.3, -0.6]
    _, padded = default_pad_group_data(("g", [{"reward": r, "uid": str(i)} for i, r in enumerate(rewards)]), 4)
    assert len(padded) == 4
    assert sum(1 for it in padded if it.get("pad_copy")) == 1
    # averaging over 4 padded items == averaging over the 3 real ones
    assert sum(it["reward"] for it in padded) / 4 == pytest.approx(sum(rewards) / 3)
    # per original item: its copies sum to reward * 4/3 (slime: scale, then halve item and copy)
    by_uid = {}
    for it in padded:
        by_uid[it["uid"]] = by_uid.get(it["uid"], 0.0) + it["reward"]
    assert by_uid == pytest.approx({str(i): r * 4 / 3 for i, r in enumerate(rewards)})
    assert padded[0]["reward"] == pytest.approx(0.9 * 4 / 3 / 2)  # the duplicated one is halved


def test_pad_more_than_half_missing():
    _, padded = default_pad_group_data(("g", [{"reward": 0.5}]), 4)
    assert len(padded) == 4 and sum(it["reward"] for it in padded) == pytest.approx(0.5 * 4)


def test_is_valid_group_default():
    items = [{"reward": r} for r in (1, 0, 1, 1)]
    assert default_is_valid_group(("g", items), 4, "t") == (True, True)
    assert default_is_valid_group(("g", [{"reward": 1}] * 4), 4, "t") == (False, True)
    assert default_is_valid_group(("g", items[:3]), 4, "t") == (False, False)


def test_filter_item_default():
    ok = item("a", 1.0)
    assert default_filter_item(ok, "t")
    assert not default_filter_item({**ok, "reward": "1"}, "t")
    assert not default_filter_item({**ok, "reward": float("nan")}, "t")
    assert not default_filter_item({**ok, "messages": "hi"}, "t")
    tokens = {"prompt_ids": [1, 2], "response_ids": [3, 4], "response_logprobs": [-0.1, -0.2]}
    assert default_filter_item({**ok, **tokens}, "t")
    assert not default_filter_item({**ok, **tokens, "response_logprobs": [-0.1]}, "t")
    assert default_filter_item({"instance_id": 1, "reward": -1, **tokens}, "t")  # tokens, no messages: fine
    assert not default_filter_item({"instance_id": 1, "reward": -1}, "t")  # nothing to train on


def test_meta_info_default():
    meta = default_get_group_data_meta_info({"a": [{"reward": 1.0}, {"reward": 0.0}], "b": [{"reward": 1.0}]})
    assert meta["total_samples"] == 3 and meta["num_groups"] == 2 and meta["avg_group_size"] == 1.5
    assert meta["avg_reward"] == pytest.approx(2 / 3)
    assert meta["reward_min"] == 0.0 and meta["reward_max"] == 1.0
    assert meta["reward_std"] == pytest.approx((((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2) ** 0.5)


# -- the service ------------------------------------------------------------------------------
def test_complete_group_is_handed_out_once(make_buffer):
    srv, c = make_buffer(group_size=4)
    for k, r in enumerate((1.0, 0.0, 0.0, 0.0)):
        ans = c.post("/buffer/write", json=item(7, r, k)).json()
        assert ans["success"] and ans["data"]["group_items"] == k + 1
    assert ans["data"]["group_complete"]
    c.post("/buffer/write", json=item("partial", 1.0)).raise_for_status()
    st = stats(c)
    assert st["total_written"] == 5 and st["ready_groups"] == 1 and st["open_groups"] == 1
    got = c.post("/get_rollout_data", json={}).json()
    assert got["success"] is True
    data = got["data"]["data"]
    assert len(data) == 4 and {d["instance_id"] for d in data} == {7}
    assert [d["raw_reward"] for d in data] == [1.0, 0.0, 0.0, 0.0]
    assert sum(d["reward"] for d in data) == pytest.approx(0.0, abs=1e-6)  # GRPO-normalized
    assert data[0]["reward"] > 0 > data[1]["reward"]
    meta = got["data"]["meta_info"]
    assert meta["finished_groups"] == [7] and meta["total_samples"] == 4 and meta["avg_reward"] == 0.25
    again = c.post("/get_rollout_data", json={}).json()
    assert again["success"] is False and again["data"]["data"] == []
    st = stats(c)
    assert st["total_read"] == 4 and st["ready_groups"] == 0 and st["open_groups"] == 1


def test_constant_reward_group_is_invalid_and_counted(make_buffer):
    srv, c = make_buffer(group_size=2)
    c.post("/buffer/write_batch", json=[item("same", 1.0, 0), item("same", 1.0, 1)]).raise_for_status()
    got = c.post("/get_rollout_data", json={}).json()
    assert got["success"] is False and got["data"]["meta_info"]["finished_groups"] == ["same"]
    st = stats(c)
    assert st["dropped_invalid_groups"] == 1 and st["total_read"] == 0


def test_batch_size_hands_whole_groups_or_nothing(make_buffer):
    srv, c = make_buffer(group_size=2)
    c.post("/buffer/write_batch", json=[item(g, float(k), k) for g in range(3) for k in range(2)]).raise_for_status()
    short = c.post("/get_rollout_data", json={"batch_size": 10}).json()
    assert short["success"] is False and "Not enough data" in short["message"]
    assert stats(c)["ready_groups"] == 3  # nothing removed
    got = c.post("/get_rollout_data", json={"batch_size": "3"}).json()  # slime sends strings too
    assert got["success"] and len(got["data"]["data"]) == 4  # whole groups until >= 3 items
    assert stats(c)["ready_groups"] == 1


def test_bad_input_is_refused_and_nothing_stored(make_buffer):
    srv, c = make_buffer(group_size=2, max_body_bytes=2000)
    r = c.post("/buffer/write", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
    r = c.post("/buffer/write", json={"reward": 1.0, "messages": []})
    assert r.status_code == 422 and "instance_id" in r.json()["message"]
    r = c.post("/buffer/write", json={"instance_id": 1, "reward": "high"})
    assert r.status_code == 422 and "reward" in r.json()["message"]
    r = c.post("/buffer/write", json={"instance_id": 1})
    assert r.status_code == 422 and "reward" in r.json()["message"]
    r = c.post("/buffer/write", json=[item(1, 1.0)])
    assert r.status_code == 422
    r = c.post("/buffer/write", json={"instance_id": True, "reward": 1})
    assert r.status_code == 422
    r = c.post("/buffer/write", json=item(1, 1.0, pad="x" * 3000))
    assert r.status_code == 413 and "too large" in r.json()["message"]
    r = c.post("/buffer/write_batch", json=[item(2, 1.0), {"instance_id": 2, "reward": None}])
    assert r.status_code == 422 and r.json()["message"].startswith("item 1:")
    st = stats(c)
    assert st["total_written"] == 0 and st["open_groups"] == 0


def test_stale_groups_finish_or_drop(make_buffer):
    srv, c = make_buffer(group_size=4, group_timeout_s=0.3, min_group_ratio=0.5)
    c.post("/buffer/write_batch", json=[item("enough", r, k) for k, r in enumerate((1.0, 0.0, 0.0))] +
           [item("few", 1.0, 0)]).raise_for_status()
    assert c.post("/get_rollout_data", json={}).json()["success"] is False  # not stale yet
    time.sleep(0.8)
    got = c.post("/get_rollout_data", json={}).json()
    assert got["success"]
    data = got["data"]["data"]
    assert {d["instance_id"] for d in data} == {"enough"}
    assert len(data) == 4 and sum(1 for d in data if d.get("pad_copy")) == 1  # padded to the group size
    assert sorted(got["data"]["meta_info"]["finished_groups"]) == ["enough", "few"]
    st = stats(c)
    assert st["dropped_stale_groups"] == 1 and st["per_task"]["default"]["stale_groups_read"] == 1
    assert st["open_groups"] == 0


def test_restart_loses_nothing(make_buffer, tmp_path):
    data_dir = tmp_path / "durable"
    srv, c = make_buffer(data_dir, group_size=3)
    c.post("/buffer/write_batch", json=[item("done", float(k), k) for k in range(3)]).raise_for_status()
    for k in range(2):
        c.post("/buffer/write", json=item("half", float(k), k)).raise_for_status()
    srv.stop()

    srv2, c2 = make_buffer(data_dir, group_size=3)
    st = stats(c2)
    assert st["total_written"] == 5 and st["ready_groups"] == 1 and st["open_groups"] == 1
    ans = c2.post("/buffer/write", json=item("half", 1.0, 2)).json()
    assert ans["data"]["group_items"] == 3 and ans["data"]["group_complete"]
    got = c2.post("/get_rollout_data", json={}).json()["data"]["data"]
    assert sorted((d["instance_id"], d["uid"]) for d in got) == sorted(
        [("done", f"done-{k}") for k in range(3)] + [("half", f"half-{k}") for k in range(3)])
    srv2.stop()

    srv3, c3 = make_buffer(data_dir, group_size=3)  # what was handed out stays handed out
    assert c3.post("/get_rollout_data", json={}).json()["success"] is False
    assert stats(c3)["total_read"] == 6


def test_each_group_handed_out_exactly_once_to_concurrent_readers(make_buffer):
    srv, c = make_buffer(group_size=4)
    n_groups = 60
    items = [item(f"g{g}", float(k == g % 4), k) for g in range(n_groups) for k in range(4)]
    for i in range(0, len(items), 80):
        c.post("/buffer/write_batch", json=items[i:i + 80]).raise_for_status()
    seen: list[str] = []
    lock = threading.Lock()

    def reader():
        with httpx.Client(base_url=srv.url, timeout=30) as rc:
            while True:
                r = rc.post("/get_rollout_data", json={"batch_size": 8}).json()
                if not r["success"]:
                    if stats(rc)["ready_groups"] == 0:
                        return
                    continue
                with lock:
                    seen.extend(d["uid"] for d in r["data"]["data"])

    threads = [threading.Thread(target=reader) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == len(set(seen)) == len(items)
    assert stats(c)["total_read"] == len(items)


def test_stats_health_and_slime_shapes(make_buffer):
    srv, c = make_buffer(group_size=2)
    h = c.get("/health").json()
    assert h["status"] == "ok" and "math" in h["generators"]
    st = c.get("/buffer/stats").json()
    assert st["success"] is True and set(st["data"]) == {"data", "meta_info"}
    s0 = st["data"]["data"][0]
    for key in ("total_written", "total_read", "current_size", "pending_groups", "per_task", "rollouts"):
        assert key in s0
    c.post("/buffer/write", json=item(1, 1.0, task_type="alpha")).raise_for_status()
    c.post("/buffer/write", json=item(1, 0.0, 1, task_type="beta")).raise_for_status()
    per = stats(c)["per_task"]
    assert per["alpha"]["open_groups"] == 1 and per["beta"]["open_groups"] == 1  # keyed by (task, instance_id)
    empty = c.post("/get_rollout_data").json()  # no body at all, like a bare curl
    assert empty["success"] is False and empty["data"]["data"] == []


def test_start_rollout_payload_errors(make_buffer):
    srv, c = make_buffer()
    r = c.post("/start_rollout", json={"input_file": "x"})
    assert r.status_code == 422 and "task_type" in r.json()["message"]
    r = c.post("/start_rollout", json={"task_type": "nope"})
    assert r.status_code == 404 and "math" in r.json()["message"]
    r = c.post("/start_rollout", json={"task_type": "math", "num_repeat_per_sample": "many"})
    assert r.status_code == 422 and "num_repeat_per_sample" in r.json()["message"]
    r = c.post("/start_rollout", content=b"[")
    assert r.status_code == 400
    assert json.loads(c.post("/stop_rollout").text)["data"]["stopped"] == []


def test_second_buffer_on_the_same_data_dir_is_refused(make_buffer, tmp_path):
    srv, c = make_buffer(tmp_path / "shared")
    with pytest.raises(RuntimeError, match="another rollout buffer is using"):
        BufferThread(buffer_cfg(tmp_path / "shared"))


def test_plain_app_route_answers_like_the_fast_path(tmp_path):
    """create_buffer_app mounted without serving_app() (e.g. inside another server)."""
    from starlette.testclient import TestClient

    from clawloop.buffer import create_buffer_app

    with TestClient(create_buffer_app(buffer_cfg(tmp_path / "plain", group_size=2, max_body_bytes=500))) as tc:
        ok = tc.post("/buffer/write", json=item(1, 1.0))
        assert ok.status_code == 200 and ok.json()["data"]["group_items"] == 1
        assert tc.post("/buffer/write", json={"reward": 1}).status_code == 422
        assert tc.post("/buffer/write", content=b"{").status_code == 400
        assert tc.post("/buffer/write", json=item(1, 1.0, pad="x" * 600)).status_code == 413


def test_a_finished_instance_id_starts_a_new_group(make_buffer):
    """A second epoch over the same prompts writes the same instance_ids again."""
    srv, c = make_buffer(group_size=2)
    for epoch in range(2):
        c.post("/buffer/write_batch", json=[item("x", float(k), f"{epoch}{k}") for k in range(2)]).raise_for_status()
    assert stats(c)["ready_groups"] == 2
    got = c.post("/get_rollout_data", json={}).json()
    assert len(got["data"]["data"]) == 4 and got["data"]["meta_info"]["finished_groups"] == ["x", "x"]
