"""The replica set (`engines/replicas.py`) with a transport in memory: routing, the health monitor,
restarts with backoff, publish fan-out and version labels, without vLLM or Ray.

The vLLM engine (`test_vllm.py`) and the Ray engine (`test_ray.py`) run the same set against real
servers and actors; these tests pin what the set decides, in a second.
"""

from __future__ import annotations

import asyncio

import pytest

from clawloop.engines.base import EngineUnavailable
from clawloop.engines.replicas import HUNG_AFTER, Probe, Replica, ReplicaSet


class FakeTransport:
    """Replicas whose probe answers what `answers[index]` says; owns (restarts) them unless `ray_like`."""

    def __init__(self, ray_like: bool = False):
        self.ray_like = ray_like
        self.answers: dict[int, Probe] = {}
        self.launched: list[int] = []
        self.halted: list[int] = []
        self.downs: list[int] = []
        self.rs: ReplicaSet | None = None

    def owns_process(self, r: Replica) -> bool:
        return not self.ray_like

    async def probe_replica(self, r: Replica) -> Probe:
        return self.answers.get(r.index, Probe("ok"))

    async def catch_up_replica(self, r: Replica) -> None:
        r.version = self.rs.version

    async def launch_replica(self, r: Replica) -> None:
        self.launched.append(r.index)
        self.answers.pop(r.index, None)

    async def halt_replica(self, r: Replica) -> None:
        self.halted.append(r.index)

    def replica_down(self, r: Replica) -> None:
        self.downs.append(r.index)


async def _started(n: int = 3, ray_like: bool = False, **kw) -> tuple[ReplicaSet, FakeTransport]:
    t = FakeTransport(ray_like)
    kw = {"version": 0, "health_interval_s": 0.02, "max_restarts": 2, **kw}
    rs = ReplicaSet([Replica(i, f"r{i}") for i in range(n)], t, **kw)
    t.rs = rs
    rs.open()
    for r in rs:
        await rs.bring_up(r)
    rs.start_monitor()
    return rs, t


async def _until(cond, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


def test_sessions_stick_and_the_rest_go_to_the_least_busy():
    async def run():
        rs, _ = await _started()
        try:
            assert all(rs.route("s-1") is rs.route("s-1") for _ in range(5))
            assert {rs.route(f"s{i}").index for i in range(60)} == {0, 1, 2}
            rs[0].inflight, rs[1].inflight = 2, 1
            assert rs.route(None).index == 2
            # Losing a replica moves only its own sessions.
            before = {f"s{i}": rs.route(f"s{i}").index for i in range(60)}
            rs.mark_down(rs[1], "test")
            after = {s: rs.route(s).index for s in before}
            assert all(after[s] == i for s, i in before.items() if i != 1) and 1 not in after.values()
            with pytest.raises(EngineUnavailable):
                rs.route("s-1", exclude={0, 2})
            assert rs.unavailable == 1
        finally:
            await rs.stop()

    asyncio.run(run())


def test_publish_fans_out_a_failed_replica_is_restarted_and_caught_up():
    async def run():
        rs, t = await _started()
        try:
            async def call(r: Replica) -> None:
                if r.index == 1:
                    raise RuntimeError("boom")

            await rs.fan_out("publish", 5, call)
            assert rs.version == 5 and [r.version for r in rs][::2] == [5, 5]
            assert rs[1].state != "up" and rs[1].last_error == "publish failed: boom" and t.downs == [1]
            await _until(lambda: rs[1].state == "up")  # after a 1 s backoff
            assert t.halted == [1] and t.launched == [1] and rs[1].restarts == 1 and rs[1].version == 5
            assert rs.stats()["engine/restarts"] == 1 and rs.health("x")["status"] == "ok"

            async def fail(r: Replica) -> None:
                raise RuntimeError("all")

            with pytest.raises(RuntimeError, match="every replica"):
                await rs.fan_out("publish", 6, fail)
            assert rs.version == 5
        finally:
            await rs.stop()

    asyncio.run(run())


def test_hung_replica_goes_down_after_missed_probes_and_a_gone_one_at_once():
    async def run():
        rs, t = await _started(ray_like=True, down_timeout_s=0.3)
        try:
            t.answers[0] = Probe("missed", "timed out")
            await _until(lambda: rs[0].state == "down")
            assert rs[0].failures >= HUNG_AFTER and rs[0].last_error == "timed out"
            t.answers[1] = Probe("gone", "died", "restarting")
            await _until(lambda: rs[1].state == "restarting")
            assert not t.launched  # the runtime restarts it, not the set
            t.answers.pop(1)  # back (a new incarnation would answer `fresh`)
            await _until(lambda: rs[1].state == "up")
            await _until(lambda: rs[0].state == "failed")  # down longer than down_timeout_s
            assert rs.health("x")["status"] == "degraded"
        finally:
            await rs.stop()

    asyncio.run(run())


def test_requests_wait_for_a_replica_that_comes_back_and_versions_only_relabel_before_start():
    async def run():
        rs, t = await _started(n=1, ray_like=True)
        try:
            with pytest.raises(RuntimeError):
                rs.relabel(3)
            t.answers[0] = Probe("gone", "died", "restarting")
            await _until(lambda: rs[0].state == "restarting")
            loop = asyncio.get_running_loop()
            waiter = asyncio.ensure_future(rs.wait_route("s", loop.time() + 5))
            await asyncio.sleep(0.1)
            assert not waiter.done()
            t.answers.pop(0)
            assert (await waiter).index == 0
            rs[0].state = "failed"
            with pytest.raises(EngineUnavailable):  # nothing can come back: at once
                await rs.wait_route("s", loop.time() + 5)
        finally:
            await rs.stop()

    asyncio.run(run())
    fresh = ReplicaSet([Replica(0, "r0")], FakeTransport(), version=0, health_interval_s=1, max_restarts=1)
    fresh.relabel(7)
    assert fresh.version == 7 and fresh.stats()["engine/policy_version"] == 7.0
