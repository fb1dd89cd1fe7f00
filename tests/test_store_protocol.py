"""The `Store` protocol against its implementation: a second store (PostgreSQL) is written against
`store/base.py`, so the SQLite store must keep exactly the signatures that page promises, and the
protocol must name everything the components call."""

from __future__ import annotations

import inspect

import pytest

from clawloop.store import SQLiteStore, Store, open_store

# What SQLiteStore has that is not the protocol's: its own knobs and counters, which no component calls.
SQLITE_ONLY = {"writer_connection_factory"}


def _protocol_methods() -> list[str]:
    return sorted(n for n, v in vars(Store).items() if not n.startswith("_") and inspect.isfunction(v))


def test_sqlite_store_satisfies_the_protocol_at_runtime(tmp_path):
    store = open_store(tmp_path / "clawloop.db")
    try:
        assert isinstance(store, SQLiteStore)
        assert isinstance(store, Store)  # runtime_checkable: every member is there
    finally:
        store.close()
    assert not isinstance(object(), Store)


@pytest.mark.parametrize("name", _protocol_methods())
def test_every_protocol_method_exists_with_the_same_parameters(name):
    impl = getattr(SQLiteStore, name, None)
    assert callable(impl), f"SQLiteStore lacks {name}"
    want = inspect.signature(getattr(Store, name))
    have = inspect.signature(impl)
    # names, kinds and defaults in order; annotations as written (both modules use postponed annotations)
    assert [(p.name, p.kind, p.default, p.annotation) for p in have.parameters.values()] == \
        [(p.name, p.kind, p.default, p.annotation) for p in want.parameters.values()], name
    assert have.return_annotation == want.return_annotation, name


def test_the_protocol_names_every_public_method_of_the_sqlite_store():
    """A method a component can call on SQLiteStore but a second store need not have is a trap."""
    public = {n for n in dir(SQLiteStore) if not n.startswith("_") and callable(getattr(SQLiteStore, n))}
    assert public - set(_protocol_methods()) - SQLITE_ONLY == set()


def test_the_protocol_has_the_methods_components_call():
    # one per concern, so a regrouping of the protocol that drops a concern shows here
    for name in ("begin_turn", "finish_turns", "set_next_state", "close_session", "session_state",  # capture
                 "turns_to_judge", "save_judgement", "judged_turns",  # judge, trainer
                 "get_cursor", "set_cursor", "max_policy_version",  # trainer
                 "list_sessions", "session_turns_page", "judgements_of", "judgement_counts",  # dashboard, tenants
                 "iter_sessions", "add_turn",  # export / import
                 "flush", "overloaded", "close"):
        assert name in _protocol_methods(), name
    assert "path" in Store.__annotations__
