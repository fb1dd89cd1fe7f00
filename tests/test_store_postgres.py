"""The `Store` contract on both implementations, and what only several writers can break.

Every test taking `any_store` runs on the SQLite store (a real file) and on the PostgreSQL store (a real
server started by `pg_server`, tests/conftest.py: Debian's postgres binaries in a temp folder). The
PostgreSQL cases are marked `postgres` and run by `make test-postgres` (.ci/run requires the part), not by
`make test`. The rest of this file is PostgreSQL's alone: judgement ids in commit order with concurrent
judges, pending rows of live gateways, the protocol's signatures, errors naming the `store` key.
"""

from __future__ import annotations

import inspect
import threading
import time

import pytest

from clawloop.records import Judgement, Turn
from clawloop.store import SharedSessions, Store, open_store

STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
def store_factory(request, tmp_path):
    opened = []

    def make(kind: str):
        if kind == "sqlite":
            st = open_store(tmp_path / "clawloop.db")
        else:
            url = request.getfixturevalue("pg_url") if not opened else opened[0][1]
            st = open_store(url, spill_path=tmp_path / "spill.jsonl")
        opened.append((st, getattr(st, "url", None)))
        return st

    yield make
    for st, _ in opened:
        st.close()


@pytest.fixture(params=STORES)
def any_store(request, store_factory) -> Store:
    return store_factory(request.param)


def pending(sid: str, index: int, key: str, prompt: list[int], tenant: str = "") -> Turn:
    return Turn(session_id=sid, index=index, type="main", messages=[{"role": "user", "content": f"q{index}"}],
                prompt_ids=prompt, finish_reason="pending", policy_version=-1, trainable=False, request_id=key,
                tenant=tenant, created_at=time.time())


def answered(sid: str, index: int, prompt: list[int], text: str, *, version: int = 1, tenant: str = "",
             choice: int = 0, versions: list[int] | None = None) -> Turn:
    return Turn(session_id=sid, index=index, type="main", messages=[{"role": "user", "content": f"q{index}"}],
                prompt_ids=prompt, response_ids=[7, 8, 9], response_logprobs=[-0.5, -0.25, -0.125],
                response_text=text, finish_reason="stop", policy_version=version, response_versions=versions,
                tenant=tenant, request_id=f"r-{sid}-{index}", choice_index=choice, created_at=time.time())


def serve_turn(st: Store, sid: str, index: int, prompt: list[int], text: str, **kw) -> Turn:
    key = f"k-{sid}-{index}"
    st.begin_turn(pending(sid, index, key, prompt, kw.get("tenant", "")), key)
    t = answered(sid, index, prompt, text, **kw)
    st.finish_turns([t], key, prompt_stored=True)
    st.flush()
    return t


def test_turns_sessions_and_long_prompts_round_trip(any_store):
    st = any_store
    system = list(range(1000, 1700))  # > 2 chunks shared by both turns: stored once, read back whole
    serve_turn(st, "s1", 0, system + [1, 2], "first", tenant="alice")
    serve_turn(st, "s1", 1, system + [1, 2, 3, 4], "second", tenant="alice", versions=[1, 2, 2])
    assert st.set_next_state("s1", 0, {"role": "user", "content": "thanks"}, response_text="first").result() == 1
    st.close_session("s1", "done", 1).result()
    turns = st.session_turns("s1")
    assert [t.prompt_ids for t in turns] == [system + [1, 2], system + [1, 2, 3, 4]]
    assert [t.response_text for t in turns] == ["first", "second"]
    assert turns[0].next_state == {"role": "user", "content": "thanks"} and turns[1].final
    assert turns[0].response_logprobs == [-0.5, -0.25, -0.125] and turns[1].response_versions == [1, 2, 2]
    assert turns[0].tenant == "alice" and turns[0].trainable and turns[0].finish_reason == "stop"
    assert st.get_turn(turns[1].id).prompt_ids == system + [1, 2, 3, 4]
    assert st.next_index("s1") == 2 and st.next_index("nope") == 0
    assert st.max_policy_version() == 2  # from response_versions
    assert [sid for sid, _ in st.iter_sessions()] == ["s1"]
    stats = st.stats()
    assert (stats["turns"], stats["main_turns"], stats["sessions"], stats["open_sessions"]) == (2, 2, 1, 0)


@pytest.mark.parametrize("kind", STORES)
def test_pending_rows_abandon_abort_and_idempotent_finish(kind, store_factory):
    st = store_factory(kind)
    st.begin_turn(pending("s", 0, "k0", [1]), "k0")
    st.begin_turn(pending("s", 1, "k1", [1, 2]), "k1")
    st.abandon_turn("s", 1, "k1").result()
    t = answered("s", 0, [1], "a")
    ids = st.finish_turns([t], "k0", prompt_stored=True).result()
    again = st.finish_turns([answered("s", 0, [1], "a")], "k0", prompt_stored=True).result()
    assert ids == again  # replayed: the same row
    st.begin_turn(pending("s", 2, "k2", [1, 2, 3]), "k2")
    st.flush()
    st.close()  # the gateway that was serving it is gone
    st = store_factory(kind)  # the next start
    assert st.abort_pending() == 1
    rows = st.session_turns("s")
    assert [(r.index, r.finish_reason, r.trainable) for r in rows] == [(0, "stop", True), (2, "abort", False)]


def test_judgements_once_per_judge_in_id_order_and_cursors(any_store):
    st = any_store
    turns = [serve_turn(st, f"s{i}", 0, [i], f"a{i}") for i in range(3)]
    for t in turns:
        st.set_next_state(t.session_id, 0, {"role": "user", "content": "ok"})
    st.flush()
    assert [t.session_id for t in st.turns_to_judge("offline", 10)] == ["s0", "s1", "s2"]
    assert st.count_pending_judgement("offline") == 3
    assert st.save_judgement(Judgement(turn_id=turns[1].id, judge="offline", score=1, votes=[1])).result() is True
    assert st.save_judgement(Judgement(turn_id=turns[1].id, judge="offline", score=-1, votes=[-1])).result() is False
    assert st.save_judgement(Judgement(turn_id=turns[0].id, judge="offline", score=-1, votes=[-1, -1],
                                       reward=-0.5, hint_candidates=["do x"])).result()
    assert st.save_judgement(Judgement(turn_id=turns[0].id, judge="url:m", score=0, votes=[0])).result()
    assert st.get_judgement(turns[1].id, "offline").score == 1  # the first verdict stays
    assert st.judge_names() == {"offline", "url:m"}
    assert [t.session_id for t in st.turns_to_judge("offline", 10)] == ["s2"]
    rows = st.judged_turns("offline", 0, 10)
    assert [(t.session_id, j.score) for _, t, j in rows] == [("s1", 1), ("s0", -1)]
    assert rows[0][0] < rows[1][0] and rows[1][2].reward == -0.5 and rows[1][2].hint_candidates == ["do x"]
    assert [t.session_id for _, t, _ in st.judged_turns("offline", rows[0][0], 10)] == ["s0"]
    assert st.get_cursor("trainer") == 0 and st.get_cursor("trainer", 7) == 7
    st.set_cursor("trainer", rows[0][0]).result()
    assert st.get_cursor("trainer") == rows[0][0]
    by_turn = st.judgements_of([turns[0].id, turns[1].id])
    assert sorted(j.judge for _, j in by_turn[turns[0].id]) == ["offline", "url:m"]
    counts = st.judgement_counts(0, 3600, judge="offline")
    assert sum(c["pos"] for c in counts) == 1 and sum(c["neg"] for c in counts) == 1


def test_tenants_and_dashboard_pages(any_store):
    st = any_store
    serve_turn(st, "alice/a", 0, [1], "x", tenant="alice")
    serve_turn(st, "bob/b", 0, [2], "y", tenant="bob")
    serve_turn(st, "bob/b", 1, [2, 3], "z", tenant="bob")
    total, rows = st.list_sessions(10, judge="offline")
    assert total == 2 and {r["session_id"] for r in rows} == {"alice/a", "bob/b"}
    total, rows = st.list_sessions(10, judge="offline", tenant="bob")
    assert total == 1 and rows[0]["turns"] == 2 and rows[0]["tenant"] == "bob" and rows[0]["main_turns"] == 2
    assert st.session_summary("alice/a", judge="offline", tenant="bob") is None
    assert st.session_summary("alice/a", judge="offline")["rows"] == 1
    assert [t.response_text for t in st.session_turns_page("bob/b", 1, 1, tenant="bob")] == ["z"]
    assert st.session_turns_page("bob/b", 10, tenant="alice") == []
    state = {s["session_id"]: s for s in st.session_state()}
    assert state["bob/b"]["last_main_index"] == 1 and state["bob/b"]["pending_main_index"] == 1
    assert [(sid, idx) for sid, idx, *_ in st.recent_answers(10)][-1][1] in (0, 1)


# -- PostgreSQL only ------------------------------------------------------------------------------
def _protocol_methods(proto) -> list[str]:
    return sorted(n for n, v in vars(proto).items() if not n.startswith("_") and inspect.isfunction(v))


@pytest.mark.postgres
def test_postgres_store_has_the_protocols_signatures(pg_url, tmp_path):
    from clawloop.store.pg_linking import PostgresStore

    st = open_store(pg_url, spill_path=tmp_path / "spill.jsonl")
    try:
        assert isinstance(st, PostgresStore) and isinstance(st, Store) and isinstance(st, SharedSessions)
        assert st.path is None
    finally:
        st.close()
    for proto in (Store, SharedSessions):
        for name in _protocol_methods(proto):
            want, have = inspect.signature(getattr(proto, name)), inspect.signature(getattr(PostgresStore, name))
            assert [(p.name, p.kind, p.default) for p in have.parameters.values()] == \
                [(p.name, p.kind, p.default) for p in want.parameters.values()], name


@pytest.mark.postgres
def test_judgement_ids_commit_in_order_with_concurrent_judges(pg_url, tmp_path):
    """Two judge processes' stores write verdicts at once while a trainer reads by cursor: every verdict is
    read exactly once (an id committed after a larger one would be skipped by the cursor)."""
    writer = open_store(pg_url, spill_path=tmp_path / "spill.jsonl")
    turns = [serve_turn(writer, f"s{i}", 0, [i], "a") for i in range(120)]
    judges = [open_store(pg_url, spill_path=tmp_path / f"spill{i}.jsonl") for i in range(2)]
    reader = open_store(pg_url, spill_path=tmp_path / "spill-r.jsonl")
    seen: list[int] = []
    done = threading.Event()

    def judge(st, name_of):
        for t in turns:
            st.save_judgement(Judgement(turn_id=t.id, judge=name_of(t), score=1, votes=[1]))
            time.sleep(0.0005)
        st.flush()

    def train():
        cursor = 0
        while True:
            finished = done.is_set()
            rows = reader.judged_turns("j", cursor, 7)
            for jid, t, _ in rows:
                seen.append(t.id)
                cursor = jid
            if finished and not rows:
                return

    # both write verdicts of one judge name, each for every other turn: ids interleave across processes
    threads = [threading.Thread(target=judge, args=(judges[0], lambda t: "j" if t.id % 2 else "other")),
               threading.Thread(target=judge, args=(judges[1], lambda t: "j" if t.id % 2 == 0 else "other"))]
    trainer = threading.Thread(target=train)
    trainer.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done.set()
    trainer.join(60)
    try:
        assert sorted(seen) == sorted(t.id for t in turns)  # each once: none skipped, none twice
    finally:
        for st in (writer, reader, *judges):
            st.close()


@pytest.mark.postgres
def test_abort_pending_spares_live_gateways_rows(pg_url, tmp_path):
    a = open_store(pg_url, spill_path=tmp_path / "a.jsonl")
    b = open_store(pg_url, spill_path=tmp_path / "b.jsonl")
    try:
        a.begin_turn(pending("s", 0, "k0", [1]), "k0")
        a.flush()
        assert b.abort_pending() == 0  # a is alive: its request is running
        a.close()  # a's gateway is gone: its lock with it
        assert b.abort_pending() == 1
        assert b.session_turns("s")[0].finish_reason == "abort"
    finally:
        a.close()
        b.close()


@pytest.mark.postgres
def test_cursor_replay_never_moves_back(pg_url, tmp_path):
    st = open_store(pg_url, spill_path=tmp_path / "s.jsonl")
    try:
        st.set_cursor("c", 10).result()
        st._submit("cursor", {"name": "c", "value": 4, "replay": True}).result()  # a spilled, older value
        assert st.get_cursor("c") == 10
    finally:
        st.close()


@pytest.mark.postgres
def test_bad_store_url_or_server_is_a_config_error_naming_the_key(pg_server, tmp_path):
    from clawloop.cli import main
    from clawloop.config import ConfigError, load_config
    from clawloop.naming import open_store as open_cfg_store

    with pytest.raises(ConfigError, match=r"^store: mysql:// is not a store"):
        load_config({"store": "mysql://x/y"}, env={})
    dead = load_config({"store": "postgresql://postgres:secret@127.0.0.1:1/x", "data_dir": str(tmp_path)}, env={})
    with pytest.raises(ConfigError, match=r"^store: cannot open postgresql://postgres:\*\*\*@127\.0\.0\.1:1/x") as e:
        open_cfg_store(dead)
    assert "secret" not in str(e.value)
    nodb = load_config({"store": pg_server.url_of("no_such_db"), "data_dir": str(tmp_path)}, env={})
    with pytest.raises(ConfigError, match="no_such_db"):
        open_cfg_store(nodb)
    assert main(["serve", "--workers", "2", "--data-dir", str(tmp_path)]) == 2  # several workers need the server


@pytest.mark.postgres
def test_import_two_judges_and_a_trainer_restart_use_every_turn_once(random_model_dir, pg_url, tmp_path, capsys):
    """`clawloop import` into the server, two judge processes' stores judging at once, the trainer for 3
    steps, a restart from its checkpoint, the rest: every judged turn trains exactly once, through the
    cursor kept in the server."""
    import json

    from clawloop.apps.train import build_loop
    from clawloop.judge.offline import OfflineJudge
    from clawloop.naming import judge_name
    from clawloop.naming import open_store as open_cfg_store
    from clawloop.trajectories import import_sessions
    from conftest import make_cfg

    n, batch = 48, 8
    flags = dict(store=pg_url, train__method="binary", train__rollout_batch_size=str(batch), train__lr="1e-3",
                 train__max_staleness="100", train__negative_weight="1")
    cfg = make_cfg(random_model_dir, tmp_path, **flags)
    data = tmp_path / "turns.jsonl"
    with open(data, "w") as f:
        for i in range(n):
            reply = "thanks, perfect!" if i % 2 else "no, just the number please"
            f.write(json.dumps({"session_id": f"s{i}", "turns": [{
                "type": "main", "prompt": f"What is {i}+1?", "response": f"It is {i + 1}.", "next_state": reply}]}) + "\n")
    assert import_sessions(cfg, data) == (n, n)
    name = judge_name(cfg)
    judges = [open_cfg_store(cfg) for _ in range(2)]

    def judge_some(st, part):
        judge = OfflineJudge()
        for turn in st.turns_to_judge(name, 10 * n):
            if turn.id % 2 == part:
                j = judge.judge_sync(turn)
                j.judge = name
                st.save_judgement(j)
        st.flush()

    threads = [threading.Thread(target=judge_some, args=(st, k)) for k, st in enumerate(judges)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for st in judges:
        st.close()
    from clawloop.cli import main
    from clawloop.trajectories import export_sessions

    assert main(["status", "--store", pg_url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["turns"], status["sessions"], status["judgements"], status["judges_pending"]) == (n, n, n, {name: 0})
    assert export_sessions(tmp_path, str(tmp_path / "pg.jsonl"), store_url=pg_url) == n
    store = open_cfg_store(cfg)
    try:
        judged = {t.id for _, t, _ in store.judged_turns(name, 0, 10 * n)}
        assert len(judged) == n and store.count_pending_judgement(name) == 0
        trained: list[int] = []

        def recording(tl):
            step = tl.trainer.step

            def record(samples, served_version=None):
                trained.extend(s.turn_id for s in samples)
                return step(samples, served_version=served_version)

            tl.trainer.step = record
            return tl

        tl = recording(build_loop(cfg, None, store))
        for _ in range(3):
            assert tl.run_once() is True
        tl.stop()
        first = len(trained)
        cfg2 = make_cfg(random_model_dir, tmp_path, train__resume_from_checkpoint="latest", **flags)
        tl2 = recording(build_loop(cfg2, None, store))
        assert tl2.resumed_from
        while tl2.run_once():
            pass
        assert first == 3 * batch and sorted(trained) == sorted(judged), "each judged turn trained once"
        store.flush()
        assert store.get_cursor("trainer") == tl2.cursor
    finally:
        store.close()
