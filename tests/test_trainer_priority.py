"""The trainer yields the CPU to serving (`train.nice`): on a machine where the trainer computes on the
same cores as the gateway and the engine, its thread runs at a lower priority, so a train step takes
the CPU serving leaves (bench/RESULTS.md "Serving while training", pinned runs). Real trainer thread,
real store file, a random 2-layer model, Linux's per-thread nice read back from /proc."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from conftest import make_cfg

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def thread_nice(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19 of stat(5): nice


def in_thread(fn):
    out = {}

    def run():
        out["tid"] = threading.get_native_id()
        out["ret"] = fn()
        out["nice"] = thread_nice(out["tid"])

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


def test_the_trainer_thread_alone_is_lowered_and_never_raised_again():
    from clawloop.trainer.loop import lower_priority

    mine = thread_nice(threading.get_native_id())
    assert in_thread(lambda: lower_priority(-1, "cpu")) | {"tid": 0} == {"tid": 0, "ret": max(10, mine),
                                                                         "nice": max(10, mine)}
    assert in_thread(lambda: lower_priority(-1, "cuda"))["nice"] == mine  # a GPU trainer keeps its priority
    assert in_thread(lambda: lower_priority(0, "cpu"))["nice"] == mine
    assert in_thread(lambda: lower_priority(19, "cuda"))["nice"] == max(19, mine)
    assert thread_nice(threading.get_native_id()) == mine  # the caller's thread is untouched

    def lowered_then_asked_for_less():
        lower_priority(15, "cpu")
        return lower_priority(5, "cpu")

    assert in_thread(lowered_then_asked_for_less)["nice"] == max(15, mine)


def test_a_running_trainer_loop_runs_at_the_configured_priority_and_reports_it(random_model_dir, tmp_path):
    from clawloop.naming import open_store
    from clawloop.trainer import Trainer, TrainerLoop

    mine = thread_nice(threading.get_native_id())
    for nice, want in ((-1, max(10, mine)), (17, max(17, mine))):
        cfg = make_cfg(random_model_dir, tmp_path / str(nice), train__device="cpu", train__nice=str(nice))
        store = open_store(cfg)
        tl = TrainerLoop(cfg, Trainer(cfg, str(random_model_dir)), store, None, "offline")
        tl.start()
        try:
            deadline = time.time() + 30
            while tl.stats()["train/nice"] != want and time.time() < deadline:
                time.sleep(0.05)
            assert tl.stats()["train/nice"] == want
            assert thread_nice(tl.thread.native_id) == want
            assert tl.error is None
        finally:
            tl.stop(checkpoint=False)
            store.close()
    assert thread_nice(threading.get_native_id()) == mine and os.getpriority(os.PRIO_PROCESS, 0) == mine


def test_train_nice_out_of_range_is_a_config_error_naming_the_key(random_model_dir, tmp_path):
    from clawloop.config import ConfigError

    with pytest.raises(ConfigError, match="train.nice"):
        make_cfg(random_model_dir, tmp_path, train__nice="20")
    with pytest.raises(ConfigError, match="train.nice"):
        make_cfg(random_model_dir, tmp_path, train__nice="-2")


def test_a_trainer_that_computes_elsewhere_keeps_the_threads_priority(random_model_dir, tmp_path):
    """A Ray trainer group has no device here (its actors compute in their own processes): the loop's
    thread only coordinates and keeps its priority; the thread runs (it used to die on the missing
    attribute, and no step was ever taken)."""
    from clawloop.naming import open_store
    from clawloop.trainer import TrainerLoop

    class Elsewhere:  # what the loop's thread needs of a trainer that computes in other processes
        version = step_count = tokens_trained = 0
        last: dict = {}
        use_lora = False

        def observe_reward(self, s):
            pass

    mine = thread_nice(threading.get_native_id())
    cfg = make_cfg(random_model_dir, tmp_path, train__device="cpu")
    store = open_store(cfg)
    tl = TrainerLoop(cfg, Elsewhere(), store, None, "offline")
    tl.start()
    try:
        time.sleep(0.3)
        assert tl.thread.is_alive() and thread_nice(tl.thread.native_id) == mine and tl.nice == 0
    finally:
        tl.stop(checkpoint=False)
        store.close()
