"""The web dashboard (gateway/dashboard.py, clawloop/dashboard/): its JSON API on a real gateway
with traffic from the official client and verdicts of the offline judge (paging, a session's
turns with their verdicts and training state, API keys and tenants, posted results, the rollout
buffer), only the shipped static files, and the page itself in a real headless Chromium: the
served policy version, the sessions and a session's turns with their verdict in the rendered
DOM, and two screenshots (into DIR as well with CLAWLOOP_DASHBOARD_SHOTS=DIR: that is how
docs/dashboard-sessions.png and docs/dashboard-session.png are made)."""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import Gateway, ServerThread, make_cfg, needs_part
from clawloop.gateway import dashboard
from clawloop.judge import OfflineJudge


def converse(client, sid: str, replies: list[str], max_tokens: int = 6) -> None:
    """One session: "What is 12+7?", then each reply as the next user message; the last request ends it."""
    msgs = [{"role": "user", "content": "What is 12+7?"}]
    for reply in replies + [None]:
        headers = {"X-Session-Id": sid, **({"X-Session-Done": "1"} if reply is None else {})}
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=max_tokens, extra_headers=headers)
        if reply is not None:
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": reply}]


def judge_all(store) -> None:
    """What the judge loop does, in line: the offline judge's verdict on every turn ready for one."""
    store.flush()
    judge = OfflineJudge()
    for turn in store.turns_to_judge(judge.name, 1000):
        store.save_judgement(judge.judge_sync(turn)).result(10)
    store.flush()


@pytest.fixture(scope="module")
def site(engine, random_model_dir, tmp_path_factory):
    """One gateway for the API tests: five sessions, every turn judged ("judged": -1, +1, 0; s0..s3: one 0)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dashboard, "SAMPLE_EVERY_S", 0.2)
        g = Gateway(engine, random_model_dir, tmp_path_factory.mktemp("dash") / "data")
    c = g.client()
    converse(c, "judged", ["just the number, please", "Thanks! What is 3+4?"])
    for i in range(4):
        converse(c, f"s{i}", [])
    judge_all(g.store)
    g.http = httpx.Client(base_url=g.url, timeout=30)
    yield g
    g.http.close()
    g.stop()


def test_sessions_are_paged_newest_first(site):
    first = site.http.get("/api/sessions", params={"limit": 2}).json()
    assert first["total"] == 5 and first["limit"] == 2 and first["offset"] == 0 and first["judge"] == "offline"
    assert [r["session_id"] for r in first["data"]] == ["s3", "s2"]
    seen = []
    for offset in range(0, 6, 2):
        seen += [r["session_id"] for r in site.http.get("/api/sessions", params={"limit": 2, "offset": offset})
                 .json()["data"]]
    assert seen == ["s3", "s2", "s1", "s0", "judged"]
    rows = site.http.get("/api/sessions").json()["data"]
    assert [r["last_seen"] for r in rows] == sorted((r["last_seen"] for r in rows), reverse=True)
    judged = rows[-1]
    assert judged["turns"] == 3 and judged["main_turns"] == 3 and judged["closed"] and judged["closed_reason"] == "done"
    assert judged["judged"] == 3 and (judged["score_pos"], judged["score_zero"], judged["score_neg"]) == (1, 1, 1)
    bad = site.http.get("/api/sessions", params={"limit": "ten"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    assert site.http.get("/api/sessions", params={"limit": 0}).status_code == 400


def test_a_sessions_turns_carry_verdict_and_training_state(site):
    d = site.http.get("/api/sessions/judged").json()
    assert d["session"]["session_id"] == "judged" and d["total"] == 3
    assert d["trainer"] == {"judge": "offline", "method": "combine", "source": "store", "cursor": 0}
    t0, t1, t2 = d["data"]
    assert t0["prompt"] == "What is 12+7?" and t0["response"] == site.store.session_turns("judged")[0].response_text
    assert t0["next_state"] == {"role": "user", "content": "just the number, please"}
    assert t0["policy_version"] == site.gw.engine.policy_version and t0["response_tokens"] > 0
    (j,) = t0["judgements"]
    assert j["judge"] == "offline" and j["score"] == -1 and j["votes"] == [-1] and "number" in j["hint"]
    assert t0["train"] == {"state": "waiting", "judgement_id": j["id"]}  # judged, the trainer has not read it
    assert t1["judgements"][0]["score"] == 1 and t2["final"] and t2["next_state"] is None
    assert t2["judgements"][0]["score"] == 0  # the session ended: nothing said about the last answer

    # The trainer's committed cursor passes the first two verdicts: the -1 and +1 train, a 0 without a hint
    # would be skipped (combine needs a reward or a hint).
    site.store.set_cursor(dashboard.TRAINER_CURSOR, t1["judgements"][0]["id"]).result(10)
    deadline = time.time() + 10
    while True:
        d = site.http.get("/api/sessions/judged").json()
        states = [t["train"] for t in d["data"]]
        if states[0].get("at") is not None or time.time() > deadline:
            break
        time.sleep(0.1)
    assert [s["state"] for s in states] == ["trained", "trained", "waiting"]
    assert states[0]["at"] >= j["created_at"]  # when the history sampler saw the cursor move
    page = site.http.get("/api/sessions/judged", params={"limit": 1, "offset": 2}).json()
    assert [t["index"] for t in page["data"]] == [2] and page["total"] == 3
    missing = site.http.get("/api/sessions/nobody")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_training_state_follows_the_trainers_rules():
    from clawloop.records import Judgement, Sample, Turn
    from clawloop.trainer.loop import CURSOR, has_signal

    assert dashboard.TRAINER_CURSOR == CURSOR
    turn = Turn(session_id="s", index=0, messages=[{"role": "user", "content": "q"}], prompt_ids=[1, 2],
                response_ids=[3], response_logprobs=[-0.1])
    for method in ("binary", "opd", "combine"):
        for score, reward, hint, hints in [(1, None, None, None), (0, None, None, None), (0, None, "be brief", None),
                                           (0, None, "  ", ["x"]), (0, None, None, [" "]), (-1, 0.3, None, None),
                                           (0, 0.0, None, None), (1, float("nan"), None, None)]:
            j = Judgement(turn_id=1, score=score, reward=reward, hint=hint, hint_candidates=hints)
            assert dashboard._has_signal(method, turn, j) == has_signal(Sample.from_turn(turn, j), method), (method, j)
    turn.response_ids = []  # the trainer skips a turn with no response before asking
    assert not dashboard._has_signal("combine", turn, Judgement(turn_id=1, score=1))


def test_status_history_and_verdict_counts(site):
    st = site.http.get("/api/status").json()
    assert st["policy_version"] == site.gw.engine.policy_version and st["capture"] and not st["auth"]
    assert st["serving"]["requests"] >= 7 and st["serving"]["by_code"]["200"] >= 7
    assert st["serving"]["latency"]["count"] >= 7 and st["serving"]["latency"]["p95_s"] > 0
    assert st["stats"]["capture/turns_captured"] >= 7
    h = site.http.get("/api/history").json()
    assert h["interval_s"] == 0.2 and h["t"] and set(h["series"]) == set(h["keys"]) == set(dashboard.HISTORY_KEYS)
    assert all(len(v) == len(h["t"]) for v in h["series"].values())
    assert h["series"]["gateway/requests"][-1] >= 7 and h["series"]["train/loss"][-1] is None  # no trainer here
    later = site.http.get("/api/history", params={"since": h["t"][-1]}).json()
    assert all(t > h["t"][-1] for t in later["t"])
    v = site.http.get("/api/judgements", params={"bucket_s": 3600}).json()
    assert v["judge"] == "offline" and [sum(b[k] for b in v["data"]) for k in ("pos", "zero", "neg")] == [1, 5, 1]
    assert site.http.get("/api/judgements", params={"bucket_s": "x"}).status_code == 400


def test_results_are_validated_and_kept_newest_first(site):
    good = {"kind": "demo", "name": "combine", "created_at": 1000.0,
            "curve": [{"updates": 0, "score": 0.2}, {"updates": 4, "score": 0.4, "minutes": 0.3}],
            "summary": {"method": "combine", "final": 0.4}}
    for body, param in [({**good, "kind": "bench"}, "kind"), ({**good, "name": ""}, "name"),
                        ({**good, "created_at": "yesterday"}, "created_at"), ({**good, "curve": {}}, "curve"),
                        ({**good, "curve": [{"score": 0.1}]}, "curve[0].updates"),
                        ({**good, "curve": [{"updates": True, "score": 0.1}]}, "curve[0].updates"),
                        ({**good, "curve": [{"updates": 1, "score": "high"}]}, "curve[0].score"),
                        ({**good, "curve": [{"updates": 1, "score": float("nan")}]}, "curve[0].score"),
                        ({**good, "summary": {"final": float("inf")}}, "summary"),
                        ({**good, "summary": [1]}, "summary")]:
        r = site.http.post("/api/results", content=json.dumps(body))  # NaN and Infinity as Python writes them
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (param, r.text)
        assert param in r.json()["error"]["message"]
    r = site.http.post("/api/results", content=b'{"kind": "demo", "curve": [')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    ids = [site.http.post("/api/results", json={**good, "created_at": t, "name": f"run{t}"}).json()["id"]
           for t in (1000.0, 3000.0, 2000.0)]
    got = site.http.get("/api/results").json()["data"]
    assert [g["name"] for g in got] == ["run3000.0", "run2000.0", "run1000.0"] and got[0]["id"] == ids[1]
    assert got[0]["curve"] == good["curve"] and got[0]["summary"] == good["summary"] and got[0]["kind"] == "demo"
    folder = Path(site.cfg.data_dir) / "results"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{i}.json" for i in ids)  # no temp file left
    assert [g["name"] for g in site.http.get("/api/results", params={"limit": 1}).json()["data"]] == ["run3000.0"]


def test_results_keep_a_bounded_number(tmp_path):
    results = dashboard.Results(tmp_path / "results", keep=3)
    for t in range(1, 6):
        results.save({"kind": "eval", "name": f"e{t}", "created_at": float(t), "curve": [], "summary": {}})
    assert [r["name"] for r in results.newest(10)] == ["e5", "e4", "e3"]
    assert len(list((tmp_path / "results").iterdir())) == 3


def test_only_the_shipped_files_are_served(site):
    page = site.http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"] and 'src="dashboard/app.js"' in page.text
    for name in ("index.html", "app.js", "style.css"):  # nothing from a CDN: the only URL is SVG's namespace
        r = site.http.get(f"/dashboard/{name}")
        assert r.status_code == 200 and r.text == (dashboard.STATIC_DIR / name).read_text()
        assert set(re.findall(r"\w+://[^\s\"'`)]*", r.text)) <= {"http://www.w3.org/2000/svg"}, name
    conn = http.client.HTTPConnection("127.0.0.1", int(site.url.rsplit(":", 1)[1]), timeout=10)
    for raw in ("/dashboard/../gateway/app.py", "/dashboard/..%2Fgateway%2Fapp.py", "/dashboard/%2e%2e%2f__init__.py",
                "/dashboard/..", "/dashboard/", "/dashboard/nothing.js", "/dashboard/%2Fetc%2Fpasswd",
                "/dashboard/..%5c..%5cconfig.py", "/dashboard/index.html%00.js"):
        conn.request("GET", raw)
        r = conn.getresponse()
        body = r.read()
        assert r.status == 404 and b"import" not in body and b"root:" not in body, raw
    conn.close()
    # the gateway's own routes are untouched
    assert site.http.get("/health").json()["status"] == "ok"
    assert "clawloop_requests" in site.http.get("/metrics").text
    assert site.http.get("/v1/models").json()["data"][0]["id"] == "clawloop"
    assert site.http.get("/nothing").status_code == 404


def test_api_keys_and_tenants(make_gateway):
    g = make_gateway(serve__api_keys=["alice=sk-a", "bob=sk-b"])
    converse(g.client(api_key="sk-a"), "a1", ["thanks"])
    converse(g.client(api_key="sk-b"), "b1", [])
    judge_all(g.store)
    http = httpx.Client(base_url=g.url, timeout=30)
    alice, bob = {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-b"}
    for path in ("/api/status", "/api/sessions", "/api/sessions/alice/a1", "/api/history", "/api/judgements",
                 "/api/buffer", "/api/results"):
        r = http.get(path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        assert http.get(path, headers={"Authorization": "Bearer sk-wrong"}).status_code == 401
    assert http.post("/api/results", json={}).status_code == 401
    assert http.get("/").status_code == 200 and http.get("/dashboard/app.js").status_code == 200  # the page asks
    assert http.get("/api/status", headers=alice).json()["tenant"] == "alice"
    mine = http.get("/api/sessions", headers=alice).json()
    assert mine["total"] == 1 and [r["session_id"] for r in mine["data"]] == ["alice/a1"]
    assert mine["data"][0]["tenant"] == "alice" and mine["data"][0]["judged"] == 2
    assert http.get("/api/sessions/alice/a1", headers=alice).json()["data"][0]["judgements"][0]["score"] == 1
    assert http.get("/api/sessions/alice%2Fa1", headers=alice).status_code == 200  # the page's encoding
    assert http.get("/api/sessions/bob/b1", headers=alice).status_code == 404  # another tenant's: not there
    assert http.get("/api/sessions/bob/b1", headers=bob).json()["session"]["tenant"] == "bob"
    r = http.post("/api/results", headers=bob, json={"kind": "eval", "name": "e", "created_at": 1.0, "curve": []})
    assert r.status_code == 201
    assert http.get("/api/results", headers=alice).json()["data"][0]["tenant"] == "bob"
    # the dashboard's refusals are not counted as failed /v1 requests
    assert 'code="401"' not in http.get("/metrics").text
    http.close()


def test_buffer_is_proxied_when_attached(make_gateway, tmp_path):
    from clawloop.buffer import BufferThread
    from clawloop.config import load_config

    none = make_gateway()
    assert httpx.get(none.url + "/api/buffer").json() == {"attached": False}
    bcfg = load_config({"data_dir": str(tmp_path / "buffer")}, env={})
    bcfg.buffer.port = 0
    srv = BufferThread(bcfg).start()
    try:
        item = {"instance_id": 7, "reward": 1.0, "task_type": "math",
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
        httpx.post(srv.url + "/buffer/write", json=item).raise_for_status()
        url = srv.url.replace("http://", "http://user:secret@")
        g = make_gateway(train__source="buffer", train__buffer_url=url)
        b = httpx.get(g.url + "/api/buffer").json()
        assert b["attached"] and b["ok"] and b["error"] is None and "secret" not in b["url"]
        assert b["stats"]["total_written"] == 1 and b["stats"]["per_task"]["math"]["written"] == 1
    finally:
        srv.stop()
    down = httpx.get(g.url + "/api/buffer").json()
    assert down["attached"] and not down["ok"] and "ConnectError" in down["error"]


# -- the page in a real browser ----------------------------------------------------------
CHROMIUM = shutil.which("chromium")


def words(text: str) -> str:
    """`text` with its whitespace runs as single spaces (a sampled answer may hold any whitespace)."""
    return " ".join(text.split())


class Chromium:
    """Headless Chromium runs, each with its own profile; its processes are killed whatever happens."""

    def __init__(self, tmp: Path):
        self.tmp, self.runs = tmp, 0

    def __call__(self, url: str, *extra: str, timeout: float = 60) -> str:
        self.runs += 1
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={self.tmp / f'profile{self.runs}'}", "--virtual-time-budget=5000", *extra, url]
        # Its own process group: the renderer and GPU processes go with it if it has to be killed.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        return out

    def dom(self, url: str) -> str:
        return html.unescape(self(url, "--dump-dom"))

    def screenshot(self, url: str, name: str) -> Path:
        path = self.tmp / name
        self(url, f"--screenshot={path}", "--window-size=1280,900", "--hide-scrollbars")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("CLAWLOOP_DASHBOARD_SHOTS"):
            shutil.copyfile(path, Path(os.environ["CLAWLOOP_DASHBOARD_SHOTS"]) / name)
        return path


@pytest.mark.browser
@needs_part("browser", CHROMIUM is None and "chromium is not on PATH (Debian: apt-get install chromium; "
                                             "`make sysdeps` as root)")
def test_the_page_in_a_real_browser(random_model_dir, tmp_path, monkeypatch):
    """`clawloop up`'s parts in this process (own engine: it trains and publishes) with users talking."""
    from clawloop.engines.hf import HFEngine
    from clawloop.apps.serve import build_app

    monkeypatch.setattr(dashboard, "SAMPLE_EVERY_S", 0.25)  # a few seconds of traffic make a visible history
    cfg = make_cfg(random_model_dir, tmp_path / "data", judge__poll_interval_s=0.1, train__rollout_batch_size=2,
                   train__lr=1e-3)
    eng = HFEngine(random_model_dir, device="cpu", dtype="float32", max_batch_size=16, max_model_len=1024)
    app, parts = build_app(cfg, judge=True, train=True, engine=eng)
    store = parts.store
    server = ServerThread(app).start()  # the app's lifespan starts and stops the engine
    chromium = Chromium(tmp_path)
    try:
        import openai

        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        for i in range(6):
            converse(client, f"user-{i}", ["just the number, please", "Thanks! What is 3+4?"], max_tokens=8)
            time.sleep(0.3)
        http = httpx.Client(base_url=server.url, timeout=30)
        deadline = time.time() + 60
        while eng.policy_version < 1 or store.count_pending_judgement("offline"):
            assert time.time() < deadline, "no publish"
            time.sleep(0.1)
        curve = [{"updates": u, "score": round(0.2 + 0.05 * u, 2)} for u in range(9)]
        http.post("/api/results", json={"kind": "demo", "name": "synthetic test curve", "created_at": time.time(),
                                        "curve": curve, "summary": {"baseline": 0.2, "final": 0.6}}).raise_for_status()
        time.sleep(1.0)  # history samples after the last step

        before = eng.policy_version
        dom = chromium.dom(server.url + "/#/")
        assert before >= 1
        shown = int(re.search(r'id="policy-version" data-version="(\d+)">v(\d+)<', dom).group(2))
        assert before <= shown <= eng.policy_version
        assert all(f"user-{i}" in dom for i in range(6)) and "1–6 of 6" in dom
        assert dom.count("<svg") >= 7 and "synthetic test curve" in dom and "error:" not in dom

        turn = http.get("/api/sessions/user-0").json()["data"][0]
        verdict = turn["judgements"][0]
        assert verdict["score"] == -1 and verdict["hint"]
        dom = words(chromium.dom(server.url + "/#/session/user-0"))
        for text in ("What is 12+7?", turn["response"], "just the number, please", verdict["hint"], "−1",
                     f"v{turn['policy_version']}", {"trained": "trained on", "waiting": "waiting for the trainer",
                                                    "skipped": "consumed, skipped"}[turn["train"]["state"]]):
            assert words(text) in dom, text

        chromium.screenshot(server.url + "/#/", "dashboard-sessions.png")
        chromium.screenshot(server.url + "/#/session/user-0", "dashboard-session.png")
        http.close()
    finally:
        server.stop()
        store.close()


@pytest.mark.browser
@needs_part("browser", CHROMIUM is None and "chromium is not on PATH")
def test_the_page_asks_for_a_key(make_gateway, tmp_path):
    g = make_gateway(serve__api_keys=["alice=sk-a"])
    dom = Chromium(tmp_path).dom(g.url + "/")
    login = re.search(r'<div class="login" id="login"( hidden="")?>', dom)
    assert login and login.group(1) is None  # shown
    assert "This server has API keys: enter yours" in dom
