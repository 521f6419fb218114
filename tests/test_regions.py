"""The region scheduler and protocol (krex/daemon/regions.py) against a fake node: every transition,
in seconds, with no daemon, segment or cgroup."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import pytest

from krex.core import wire
from krex.core.errors import KrexError
from krex.core.slices import Slice
from krex.core.tenants import TenantGroup
from krex.daemon.fidelity import GIB
from krex.daemon.gate import Hold
from krex.daemon.model import Gpu, Region, Tenant
from krex.daemon.regions import Regions


class FakeNode:
    """Records every effect in order; steps can be made to block, fail or find problems."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.frozen: set[int] = set()
        self.drain_gate: threading.Event | None = None  # the drain waits for it when set
        self.draining = threading.Event()
        self.freeze_fails: set[int] = set()
        self.fail_pin: set[int] = set()
        self.fail_drain = False
        self.foreigners: dict[int, set[int]] = {}
        self.procs: set[int] = set()  # tenants whose group holds a process (pools)
        self.epoch = 0
        self.lock = threading.Lock()
        self.samples: list[dict[str, int]] = []  # clock() answers these in turn, then a plain one
        self.split: tuple[int, int] | None = None
        self.memory_errors: dict[int, list[str]] = {}  # tenant -> its memory problems
        self.siblings_worked = True  # settle_idle: NVML saw the siblings work just before

    def log(self, *event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def close_gate(self, gpu: int, owner: int, deadline_s: float) -> int:
        self.epoch += 1
        self.log("close", gpu, owner)
        return self.epoch

    def open_gate(self, gpu: int) -> None:
        self.log("open", gpu)

    def quiesce_and_drain(self, hold: Hold, skip: set[int]) -> None:
        self.log("drain", hold.gpu, frozenset(skip))
        self.draining.set()
        if self.drain_gate is not None:
            assert self.drain_gate.wait(10)
        if self.fail_drain:
            raise RuntimeError("drain broke")
        hold.quiesce_s, hold.drain_s = 0.001, 0.002

    def freeze(self, tenant: Tenant) -> bool:
        self.log("freeze", tenant.id)
        if tenant.id in self.freeze_fails:
            return False
        with self.lock:
            self.frozen.add(tenant.id)
        return True

    def awake(self, tenant: Tenant) -> int:
        return 0

    def thaw(self, tenant: Tenant) -> None:
        self.log("thaw", tenant.id)
        with self.lock:
            self.frozen.discard(tenant.id)

    def frozen_holds(self, frozen: list[Tenant]) -> list[str]:
        return []

    def settle_idle(self, gpu: int, siblings: list[Tenant], settle_s: float) -> float:
        self.log("settle", gpu, tuple(s.id for s in siblings), settle_s)
        return settle_s if self.siblings_worked else 0.0

    def pin(self, tenant: Tenant, cores: set[int]) -> None:
        if tenant.id in self.fail_pin:
            raise KrexError("cannot pin")
        self.log("pin", tenant.id, frozenset(cores))

    async def make_room(self, gpu: int, owner: int) -> float:
        self.log("room", owner)
        return 0.0

    def has_processes(self, tenant: Tenant) -> bool:
        return tenant.id in self.procs

    def foreign(self, gpu: int) -> set[int]:
        return self.foreigners.get(gpu, set())

    def audit(self, gpu: int, owner: Tenant, since: float | None = None) -> list[str]:
        found = self.foreigners.get(gpu, set())
        return [f"foreign GPU process(es) {sorted(found)} on GPU {gpu}"] if found else []

    def clock(self, gpu: int) -> dict[str, int] | None:
        if self.samples:
            return self.samples.pop(0)
        return {"sm_clock_mhz": 1980, "throttle_reasons": 0}

    def memory_split(self, gpu: int, owner: Tenant) -> tuple[int, int] | None:
        return self.split

    def memory_problems(self, tenant: Tenant) -> list[str]:
        return list(self.memory_errors.get(tenant.id, []))

    def names(self) -> list[str]:
        return [e[0] for e in self.events]


def make(n_gpus: int = 1) -> tuple[Regions, FakeNode, list[Gpu]]:
    gpus = [
        Gpu(
            index=i,
            slots=8,
            slice=Slice(gpu=i, region_cores=frozenset({10 + i}), shared_cores=frozenset({i})),
        )
        for i in range(n_gpus)
    ]
    node = FakeNode()
    return Regions(gpus, node, room=node), node, gpus


def tenant(gpus: list[Gpu], tid: int, on: list[int] | None = None, timeout: float = 30.0) -> Tenant:
    on = on or [0]
    t = Tenant(
        id=tid,
        gpu=on[0],
        gpus=on,
        argv=["cmd"],
        group=cast(TenantGroup, None),  # the fake node never touches a group
        region_timeout_s=timeout,
        t_admit=0.0,
    )
    for i in on:
        gpus[i].tenants.append(t)
    return t


async def plain_wait(fut: asyncio.Future[Region]) -> None:
    await asyncio.wait_for(asyncio.shield(fut), 10)


def leaving(when: asyncio.Event) -> Callable[[asyncio.Future[Region]], Awaitable[None]]:
    """A wait that raises once `when` is set: the requester went away."""

    async def wait(fut: asyncio.Future[Region]) -> None:
        gone = asyncio.ensure_future(when.wait())
        both: set[asyncio.Future[Any]] = {fut, gone}
        done, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if fut not in done:
            raise ConnectionError("requester left")

    return wait


def region_of(t: Tenant) -> Region | None:
    """t.region, read afresh (mypy would keep an earlier narrowing)."""
    return t.region


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))


async def until(cond: Callable[[], bool]) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


def test_steps_run_in_protocol_order_and_exit_undoes_them() -> None:
    """Room, close, drain, freeze, grant, with the pin beside them once there is room; exit
    pins back, thaws and opens the gate."""

    async def main() -> None:
        regions, node, gpus = make()
        owner, sib = tenant(gpus, 1), tenant(gpus, 2)
        r = await regions.acquire(owner, plain_wait)
        assert r.granted and r.clean and r.gpus == [0] and node.frozen == {2}
        assert [n for n in node.names() if n != "pin"] == ["room", "close", "drain", "freeze"]
        assert node.names()[0] == "room" and node.names().count("pin") == 1
        assert ("pin", 1, frozenset({10})) in node.events  # the region cores
        assert regions.held(0) is r and owner.region is r
        rec = regions.release(r, why="region_end")
        assert node.names()[5:] == ["pin", "thaw", "open"]
        assert node.events[5] == ("pin", 1, frozenset({0}))  # back on the shared cores
        steps = {"room", "quiesce", "drain", "freeze", "pin", "audit", "settle", "sample"}
        assert set(rec["entry_steps_s"]) == steps, rec
        assert rec["entry_steps_s"]["drain"] == 0.002 and rec["entry_steps_s"]["quiesce"] == 0.001
        assert set(rec["exit_steps_s"]) == {"audit", "pin_back", "thaw", "open"}, rec
        assert all(v >= 0 for v in [*rec["entry_steps_s"].values(), *rec["exit_steps_s"].values()])
        assert rec["clean"] and not rec["revoked"] and rec["problems"] == []
        assert rec["sm_clock_mhz"] == [1980, 1980] and rec["throttled"] is False
        assert owner.regions == [rec] and region_of(owner) is None and regions.held(0) is None
        assert sib.region is None and node.frozen == set()

    run(main())


def test_the_owner_is_pinned_while_its_siblings_drain_not_after() -> None:
    """Issue #53: the pin (moving every thread of the owner) is not on the critical path: it
    runs beside the gate and the drain, so a drain that lasts until the pin is done ends."""

    async def main() -> None:
        regions, node, gpus = make()
        owner, _ = tenant(gpus, 1), tenant(gpus, 2)
        node.drain_gate = threading.Event()
        pin = node.pin

        def pin_then_let_drain(t: Tenant, cores: set[int]) -> None:
            pin(t, cores)
            assert node.drain_gate is not None
            node.drain_gate.set()

        node.pin = pin_then_let_drain  # type: ignore[method-assign,assignment]
        r = await regions.acquire(owner, plain_wait)
        assert r.granted and r.clean
        # The pin began before the drain ended (else the drain would have waited 10 s).
        assert node.names().index("pin") < node.names().index("freeze")
        regions.release(r, why="region_end")

    run(main())


def test_a_drain_that_fails_after_the_early_pin_leaves_the_owner_on_its_shared_cores() -> None:
    """The early pin ends before the pin-back that letting the GPU go does: never the other
    way round (which would leave the owner on the region cores)."""

    async def main() -> None:
        regions, node, gpus = make()
        owner, _ = tenant(gpus, 1), tenant(gpus, 2)
        node.fail_drain = True
        node.drain_gate = threading.Event()
        pin = node.pin

        def slow_pin(t: Tenant, cores: set[int]) -> None:
            assert node.drain_gate is not None
            node.drain_gate.set()  # the drain fails now, while this pin still runs
            threading.Event().wait(0.2)
            pin(t, cores)

        node.pin = slow_pin  # type: ignore[method-assign,assignment]
        with pytest.raises(ConnectionError):
            await regions.acquire(owner, plain_wait)
        pins = [e for e in node.events if e[0] == "pin"]
        assert pins == [("pin", 1, frozenset({10})), ("pin", 1, frozenset({0}))], node.events

    run(main())


def test_a_record_tells_its_own_entry_and_exit_from_its_queueing() -> None:
    """entry_s: the region's own set-up (room to grant); wait_s also holds the time it queued
    behind another region; exit_s: its end (audits, pin back, thaw, gates open)."""

    async def main() -> None:
        regions, _, gpus = make()
        first, second = tenant(gpus, 1), tenant(gpus, 2)
        held = await regions.acquire(first, plain_wait)
        queued = asyncio.ensure_future(regions.acquire(second, plain_wait))
        await asyncio.sleep(0.2)  # the second request queues behind the first region
        regions.release(held, why="region_end")
        rec = regions.release(await queued, why="region_end")
        assert rec["wait_s"] >= 0.2 and 0 < rec["entry_s"] < 0.2 <= rec["wait_s"], rec
        assert rec["exit_s"] >= 0 and rec["room_s"] >= 0

    run(main())


def test_a_region_settles_after_the_freeze_only_when_asked_and_siblings_worked() -> None:
    """region_settle_s: after the freeze and pin, before the grant, the node idles where the
    siblings worked just before; the record says how long. Never asked with no sibling frozen,
    nor when the tenant's settle is 0 (the default)."""

    async def main() -> None:
        regions, node, gpus = make()
        owner, sib = tenant(gpus, 1), tenant(gpus, 2)
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert "settle" not in node.names() and rec["settle_s"] == 0.0
        owner.region_settle_s = 0.4
        node.events.clear()
        r = await regions.acquire(owner, plain_wait)
        steps = [n for n in node.names() if n != "pin"]
        assert steps == ["room", "close", "drain", "freeze", "settle"] and "pin" in node.names()
        assert node.events[-1] == ("settle", 0, (2,), 0.4) and r.granted
        assert regions.release(r, why="region_end")["settle_s"] == 0.4
        node.siblings_worked = False  # they sat idle (compiling, say): no wait
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert rec["settle_s"] == 0.0
        gpus[0].tenants.remove(sib)  # alone on the GPU: nothing to ask about
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert "settle" not in node.names() and rec["settle_s"] == 0.0

    run(main())


def test_a_command_whose_region_ran_into_the_power_limit_settles_its_later_regions() -> None:
    """region_capped_settle_s: nothing until one of the command's regions is gpu_capped; then
    each later region settles that long where the siblings worked, and its record says the
    capped rule chose it; not a region an autotuner's candidate benchmark began. The command's
    own larger --settle wins (a candidate's too); 0 turns the rule off; another command's capped
    region does not make this one settle."""

    async def main() -> None:
        regions, node, gpus = make()
        owner, sib = tenant(gpus, 1), tenant(gpus, 2)
        owner.region_capped_settle_s = sib.region_capped_settle_s = 2.0
        grant = {"sm_clock_mhz": 1980, "throttle_reasons": 0, "power_capped_ns": 0}
        # The sibling runs into the limit first: only its own later regions would settle.
        node.samples = [grant, grant | {"power_capped_ns": 40_000_000}]
        rec = regions.release(await regions.acquire(sib, plain_wait), why="region_end")
        assert [w["name"] for w in rec["warnings"]] == ["gpu_capped"] and sib.power_capped
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert "settle" not in node.names() and rec["settle_s"] == 0.0
        assert "settle_capped" not in rec and [owner.power_capped] == [False]
        # The owner's region ran into the limit (its clock samples say so): from the next on.
        node.samples = [grant, grant | {"throttle_reasons": 0x4}]
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert rec["settle_s"] == 0.0 and owner.power_capped
        # The sibling's region since (not capped): the whole capped settle, not the gap rule's.
        regions.release(await regions.acquire(sib, plain_wait), why="region_end")
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert ("settle", 0, (2,), 2.0) in node.events
        assert rec["settle_s"] == 2.0 and rec["settle_capped"] is True
        assert "candidate" not in rec
        # An autotuner's candidate benchmark: no capped settle (a comparison, not a reported
        # time); its record says whose region it was.
        node.events.clear()
        r = await regions.acquire(owner, plain_wait, candidate=True)
        rec = regions.release(r, why="region_end")
        assert "settle" not in node.names() and rec["settle_s"] == 0.0
        assert rec["candidate"] is True and "settle_capped" not in rec
        node.siblings_worked = False  # the siblings sat idle: no wait, not the rule's
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert rec["settle_s"] == 0.0 and "settle_capped" not in rec
        node.siblings_worked = True
        regions.release(await regions.acquire(sib, plain_wait), why="region_end")
        owner.region_settle_s = 3.0  # its own --settle is longer: that one, not the rule's
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert ("settle", 0, (2,), 3.0) in node.events and "settle_capped" not in rec
        node.events.clear()  # --settle is every region's, a candidate's too
        r = await regions.acquire(owner, plain_wait, candidate=True)
        rec = regions.release(r, why="region_end")
        assert ("settle", 0, (2,), 3.0) in node.events and rec["settle_s"] == 3.0
        owner.region_settle_s = owner.region_capped_settle_s = 0.0  # --capped-settle 0: off
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert "settle" not in node.names() and rec["settle_s"] == 0.0

    run(main())


def test_the_capped_settle_after_the_owners_own_capped_region_lasts_the_siblings_gap() -> None:
    """The gap rule (capped_settle): where the GPU's last region was the owner's own and ran
    into the power limit, the siblings had the GPU only since it ended, so the capped settle
    idles that long, not its whole region_capped_settle_s; the whole one where that region was
    not capped, or another command's region came between. Fails where every capped settle is
    the whole one."""

    async def main() -> None:
        regions, node, gpus = make()
        owner, sib = tenant(gpus, 1), tenant(gpus, 2)
        owner.region_capped_settle_s = 2.0
        grant = {"sm_clock_mhz": 1980, "throttle_reasons": 0, "power_capped_ns": 0}
        capped = grant | {"throttle_reasons": 0x4}
        node.samples = [grant, capped]  # an autotuner's candidate runs into the limit
        r = await regions.acquire(owner, plain_wait, candidate=True)
        regions.release(r, why="region_end")
        assert owner.power_capped
        await asyncio.sleep(0.3)  # the siblings have the GPU back for 0.3 s
        node.samples = [grant, capped]
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        (settle,) = [e[3] for e in node.events if e[0] == "settle"]
        assert 0.3 <= settle < 1.5 and rec["settle_s"] == settle and rec["settle_capped"]
        # Right after its own capped region again: a settle as short as that gap.
        node.samples = [grant, grant]  # this one stays below the limit
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        (settle,) = [e[3] for e in node.events if e[0] == "settle"]
        assert 0 <= settle < 0.3, settle
        # Its last region was not capped: the heat since may be the siblings' own.
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert ("settle", 0, (2,), 2.0) in node.events and rec["settle_s"] == 2.0
        # Another command's region between: the whole settle, though the owner's was capped.
        node.samples = [grant, capped]
        regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        regions.release(await regions.acquire(sib, plain_wait), why="region_end")
        node.events.clear()
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert ("settle", 0, (2,), 2.0) in node.events and rec["settle_capped"] is True

    run(main())


def test_an_end_audit_that_does_not_return_makes_the_region_unclean_not_the_daemon_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end audit reads NVML, which can block while a GPU is in trouble: the region ends
    within CHECKS_WAIT_S all the same, unclean, saying why (before, the event loop waited on
    it for as long as it blocked: here, forever)."""
    import krex.daemon.regions as regions_mod

    monkeypatch.setattr(regions_mod, "CHECKS_WAIT_S", 0.3)

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        tenant(gpus, 2)
        stuck = threading.Event()
        audit = node.audit

        def hung(gpu: int, owner: Tenant, since: float | None = None) -> list[str]:
            if since is not None:  # the end's
                stuck.wait(30)
            return audit(gpu, owner, since)

        node.audit = hung  # type: ignore[method-assign]
        r = await regions.acquire(owner, plain_wait)
        t0 = time.monotonic()
        rec = regions.release(r, why="region_end")
        assert time.monotonic() - t0 < 10
        assert rec["clean"] is False
        assert any("audit did not complete (no answer in 0.3 s)" in p for p in rec["problems"])
        assert ("thaw", 2) in node.events and ("open", 0) in node.events  # undone all the same
        assert regions.busy()  # its thread still runs: no segment may go under it
        stuck.set()
        deadline = time.monotonic() + 10
        while regions.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not regions.busy()

    run(main())


def test_requests_on_one_gpu_are_granted_in_request_order() -> None:
    """FIFO: the second and third requesters wait for the regions ahead of them."""

    async def main() -> None:
        regions, node, gpus = make()
        a, b, c = (tenant(gpus, i) for i in (1, 2, 3))
        order: list[int] = []

        async def one(t: Tenant) -> None:
            r = await regions.acquire(t, plain_wait)
            order.append(t.id)
            assert all(x.region is None or x is t for x in (a, b, c))
            await asyncio.sleep(0.01)
            regions.release(r, why="region_end")

        tasks = [asyncio.create_task(one(t)) for t in (a, b, c)]
        await asyncio.gather(*tasks)
        assert order == [1, 2, 3]
        assert node.names().count("close") == 3 and node.names().count("open") == 3

    run(main())


def test_other_threads_of_the_owner_nest_and_the_last_holder_ends_it() -> None:
    """A second request of the owner is granted at once, into the same region; the record
    names each process that held it once."""

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        r1 = await regions.acquire(owner, plain_wait, pid=100)
        r2 = await regions.acquire(owner, plain_wait, pid=200)  # a child process of the command
        r3 = await regions.acquire(owner, plain_wait, pid=100)  # another thread of the first
        assert r1 is r2 is r3 and r1.holders == 3 and node.names().count("close") == 1
        regions.release(r1, why="region_end")
        regions.release(r3, why="region_end")
        assert not r1.ended and "open" not in node.names()
        rec = regions.release(r2, why="region_end")
        assert r1.record is not None and node.names()[-1] == "open"
        assert rec["pids"] == [100, 200]  # each process once, in the order they asked

    run(main())


def test_the_record_sums_every_holders_calls_even_after_a_revocation() -> None:
    """Each holder's region_end brings its markers' `calls`; the record sums them, and a
    region revoked before its owner's region_end gets them in the record it already has (the
    one in the tenant's list). A region no marker named has no `calls`."""

    async def main() -> None:
        regions, _, gpus = make()
        owner = tenant(gpus, 1)
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert "calls" not in rec
        r = await regions.acquire(owner, plain_wait, pid=100)
        await regions.acquire(owner, plain_wait, pid=200)
        assert regions.release(r, why="region_end", calls={"a.f": 2})["calls"] == {"a.f": 2}
        rec = regions.release(r, why="region_end", calls={"a.f": 1, "b.g": 4})
        assert rec["calls"] == {"a.f": 3, "b.g": 4} and r.ended
        r = await regions.acquire(owner, plain_wait)
        regions.revoke(r, "the memory arbiter's way out")
        rec = regions.release(r, why="region_end", calls={"krex.region": 1})
        assert rec["revoked"] and rec["calls"] == {"krex.region": 1}
        assert owner.regions[-1] is rec

    run(main())


def test_holders_calls_summed_stay_within_the_bounds_of_one_region_end() -> None:
    """Two holders with 32 names each: the record keeps 31 and counts the rest under
    `(others)`, and a count stops at the wire's maximum, so a record's `calls` is always one
    that region_end itself could have sent."""

    async def main() -> None:
        regions, _, gpus = make()
        owner = tenant(gpus, 1)
        r = await regions.acquire(owner, plain_wait, pid=100)
        await regions.acquire(owner, plain_wait, pid=200)
        first = {f"a.f{i}": 1 for i in range(wire.MAX_CALL_NAMES)}
        regions.release(r, why="region_end", calls=first)
        second = {f"b.g{i}": wire.MAX_CALL_COUNT for i in range(wire.MAX_CALL_NAMES)}
        rec = regions.release(r, why="region_end", calls=second)
        assert wire.calls_problem(rec["calls"]) is None
        assert len(rec["calls"]) == wire.MAX_CALL_NAMES
        assert rec["calls"]["a.f0"] == 1 and "b.g0" not in rec["calls"]
        assert rec["calls"][wire.OTHER_CALLS] == wire.MAX_CALL_COUNT

    run(main())


def test_a_region_past_its_time_out_is_revoked_and_the_next_one_granted() -> None:
    """I4: the time-out ends the region (revoked), the waiting request is then granted."""

    async def main() -> None:
        regions, _, gpus = make()
        a, b = tenant(gpus, 1, timeout=0.05), tenant(gpus, 2)
        ra = await regions.acquire(a, plain_wait)
        rb = await regions.acquire(b, plain_wait)
        assert ra.ended and ra.revoked and a.regions[0]["revoked"]
        # Issue #49: its owner's timing ran on unprotected: the record says so.
        assert a.regions[0]["clean"] is False
        assert any("time-out" in p for p in a.regions[0]["problems"]), a.regions[0]
        assert rb.granted and not rb.ended and regions.held(0) is rb
        assert regions.release(ra, why="region_end")["revoked"]  # a late region_end

    run(main())


def test_a_tenant_joining_while_siblings_drain_is_frozen_at_the_freeze_step() -> None:
    """Frozen while the drain runs, its drain thread could not answer: it waits for step 4."""

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        node.drain_gate = threading.Event()
        task = asyncio.create_task(regions.acquire(owner, plain_wait))
        await until(node.draining.is_set)
        joiner = tenant(gpus, 2)
        assert regions.tenant_joined(joiner) is None  # deferred, not frozen now
        pending = regions.setting_up(0)
        assert pending is not None and joiner in pending.frozen and 2 not in node.frozen
        node.drain_gate.set()
        r = await task
        assert 2 in node.frozen and r.clean
        regions.release(r, why="region_end")
        assert node.frozen == set()

    run(main())


def test_a_tenant_joining_a_granted_region_is_frozen_until_it_ends() -> None:
    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        r = await regions.acquire(owner, plain_wait)
        joiner = tenant(gpus, 2)
        task = regions.tenant_joined(joiner)
        assert task is not None
        await task
        assert 2 in node.frozen and joiner in r.frozen
        assert regions.tenant_joined(joiner) is None  # listed once
        regions.release(r, why="region_end")
        assert 2 not in node.frozen

    run(main())


def test_a_joiner_that_does_not_freeze_makes_the_region_unclean() -> None:
    async def main() -> None:
        regions, node, gpus = make()
        r = await regions.acquire(tenant(gpus, 1), plain_wait)
        node.freeze_fails.add(2)
        task = regions.tenant_joined(tenant(gpus, 2))
        assert task is not None
        await task
        assert not r.clean and "tenant 2 admitted during the region did not freeze" in r.problems

    run(main())


def test_a_joiner_whose_region_ended_while_it_froze_is_thawed() -> None:
    async def main() -> None:
        regions, node, gpus = make()
        r = await regions.acquire(tenant(gpus, 1), plain_wait)
        joiner = tenant(gpus, 2)
        task = regions.tenant_joined(joiner)
        regions.release(r, why="region_end")  # before the freeze thread ran
        assert task is not None
        await task
        assert 2 not in node.frozen and joiner not in r.frozen

    run(main())


def test_several_gpus_are_taken_in_index_order_and_commands_of_two_gpus_never_deadlock() -> None:
    """Two two-GPU commands and one-GPU commands on each GPU, all at once: all are granted,
    GPUs are closed in ascending order per region, no two regions hold a GPU at once."""

    async def main() -> None:
        regions, node, gpus = make(2)
        both = [tenant(gpus, i, on=[0, 1]) for i in (1, 2)]
        singles = [tenant(gpus, 3, on=[1]), tenant(gpus, 4, on=[0])]
        holding: dict[int, int] = {}

        async def one(t: Tenant) -> None:
            r = await regions.acquire(t, plain_wait)
            assert r.gpus == t.gpus
            for i in r.gpus:
                assert i not in holding, f"GPU {i} held by {holding.get(i)} and {t.id}"
                holding[i] = t.id
            await asyncio.sleep(0.01)
            for i in r.gpus:
                del holding[i]
            regions.release(r, why="region_end")

        await asyncio.gather(*(one(t) for t in [*both, *singles]))
        for t in both:
            closes = [e[1] for e in node.events if e[0] == "close" and e[2] == t.id]
            assert closes == [0, 1]
            assert t.regions[0]["gpus"] == [0, 1]

    run(main())


def test_a_sibling_on_two_gpus_is_thawed_only_by_the_last_region_that_froze_it() -> None:
    async def main() -> None:
        regions, node, gpus = make(2)
        sib = tenant(gpus, 9, on=[0, 1])
        r0 = await regions.acquire(tenant(gpus, 1, on=[0]), plain_wait)
        r1 = await regions.acquire(tenant(gpus, 2, on=[1]), plain_wait)
        assert sib in r0.frozen and sib in r1.frozen
        # GPU 1's drain left out the sibling frozen by GPU 0's region.
        drains = [e for e in node.events if e[0] == "drain"]
        assert drains[1] == ("drain", 1, frozenset({9}))
        regions.release(r0, why="region_end")
        assert 9 in node.frozen
        regions.release(r1, why="region_end")
        assert 9 not in node.frozen

    run(main())


def test_an_owner_leaving_while_queued_leaves_no_trace() -> None:
    async def main() -> None:
        regions, _, gpus = make()
        ra = await regions.acquire(tenant(gpus, 1), plain_wait)
        gone = asyncio.Event()
        b = tenant(gpus, 2)
        task = asyncio.create_task(regions.acquire(b, leaving(gone)))
        await until(lambda: regions.queued(0) == 1)
        gone.set()
        with pytest.raises(ConnectionError):
            await task
        assert regions.queued(0) == 0 and b.region is None
        regions.release(ra, why="region_end")
        assert regions.held(0) is None and regions.setting_up(0) is None

    run(main())


def test_an_owner_leaving_during_set_up_ends_the_region_and_reopens_the_gate() -> None:
    async def main() -> None:
        regions, node, gpus = make()
        node.drain_gate = threading.Event()
        gone = asyncio.Event()
        owner, sib = tenant(gpus, 1), tenant(gpus, 2)
        task = asyncio.create_task(regions.acquire(owner, leaving(gone)))
        await until(node.draining.is_set)
        gone.set()
        with pytest.raises(ConnectionError):
            await task
        node.drain_gate.set()
        await until(lambda: regions.setting_up(0) is None)
        assert regions.held(0) is None and owner.region is None
        assert node.names()[-1] == "open" and sib.id not in node.frozen
        assert owner.regions and owner.regions[0]["duration_s"] == 0.0

    run(main())


@pytest.mark.parametrize("step", ["drain", "pin"])
def test_a_failing_step_lets_the_gpu_go_and_the_next_request_proceeds(step: str) -> None:
    async def main() -> None:
        regions, node, gpus = make()
        a, b, sib = tenant(gpus, 1), tenant(gpus, 2), tenant(gpus, 3)
        if step == "drain":
            node.fail_drain = True
        else:
            node.fail_pin.add(1)
        with pytest.raises(ConnectionError):
            await regions.acquire(a, plain_wait)
        assert a.region is None and regions.held(0) is None and node.names()[-1] == "open"
        assert sib.id not in node.frozen
        node.fail_drain = False
        r = await regions.acquire(b, plain_wait)
        assert r.granted
        regions.release(r, why="region_end")

    run(main())


def test_problems_make_a_region_unclean_with_the_reason() -> None:
    """I2/I3: a sibling that did not freeze, a foreign process: clean = false, and why."""

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        tenant(gpus, 2)
        node.freeze_fails.add(2)
        node.foreigners[0] = {4242}
        r = await regions.acquire(owner, plain_wait)
        assert not r.clean
        assert "tenant 2 did not freeze" in r.problems
        # The grant's audit runs beside the grant: what it found is in the record at the end.
        rec = regions.release(r, why="region_end")
        assert rec["clean"] is False and any("4242" in p for p in rec["problems"])
        assert any("(at the region's end)" not in p and "4242" in p for p in rec["problems"])

    run(main())


def test_the_grant_does_not_wait_for_the_audit_and_the_record_has_what_it_found() -> None:
    """Issue #53: the grant's audit and samples (NVML reads: tens of ms at the p95 beside busy
    siblings on an H100, 2026-12-05) run beside the grant, not before it. Here the audit
    blocks until the region is granted (before the change the grant waited for it: this
    timed out); what it found is in the record when the region ends; an audit that fails
    makes the region unclean, saying so."""

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        tenant(gpus, 2)
        granted = threading.Event()
        audit = node.audit

        def slow_audit(gpu: int, owner: Tenant, since: float | None = None) -> list[str]:
            if since is None:  # the grant's, not the end's
                assert granted.wait(10), "the grant waited for the audit"
                node.foreigners[0] = {777}
            return audit(gpu, owner, since)

        node.audit = slow_audit  # type: ignore[method-assign]
        r = await regions.acquire(owner, plain_wait)
        # Its audit still reads the segments in its thread: none may be unmapped meanwhile
        # (Segments.account asks busy(); else "'NoneType' object has no attribute 'slots'",
        # the simulated memory mix, 2026-12-06).
        assert regions.busy() and not any(q.pending for q in regions._q)
        granted.set()
        rec = regions.release(r, why="region_end")
        assert not regions.busy()
        assert rec["clean"] is False and any("[777]" in p for p in rec["problems"])
        assert rec["sm_clock_mhz"] == [1980, 1980]  # the grant's sample, joined

        def broken(gpu: int, owner: Tenant, since: float | None = None) -> list[str]:
            if since is None:
                raise OSError("NVML went away")
            return []

        node.foreigners.clear()
        node.audit = broken  # type: ignore[method-assign]
        rec = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert rec["clean"] is False
        assert any("audit did not complete (NVML went away)" in p for p in rec["problems"])

    run(main())


def test_a_region_after_a_shared_out_of_memory_error_is_not_clean() -> None:
    """Issue #47, 3: a command that got an out-of-memory error only sharing caused may have
    gone down a slower path: its regions that end after it say so (clean = false, and why);
    those that ended before it stay clean."""

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        tenant(gpus, 2)
        before = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert before["clean"] is True
        node.memory_errors[1] = ["1 out-of-memory error(s) that only sharing caused ..."]
        after = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert after["clean"] is False
        assert any("only sharing caused" in p for p in after["problems"])

    run(main())


def test_power_and_placement_are_named_warnings_that_leave_a_region_clean() -> None:
    """What the GPU's counters and the memory beside the owner say goes into the record as
    warnings with their numbers; the region stays clean (nobody else ran)."""

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        grant = {"sm_clock_mhz": 1980, "throttle_reasons": 0, "energy_mj": 1_000_000,
                 "power_capped_ns": 7_000_000, "thermal_capped_ns": 0,
                 "power_limit_mw": 700_000, "temp_c": 40, "mem_temp_c": 48,
                 "power_w_before": 600}  # fmt: skip
        end = grant | {"energy_mj": 1_000_000 + 840_000, "power_capped_ns": 12_000_000,
                       "temp_c": 52, "mem_temp_c": 57, "sm_clock_mhz": 1530,
                       "throttle_reasons": 0x4}  # fmt: skip
        node.samples = [grant, end]
        node.split = (8 * GIB, 98 * GIB)
        r = await regions.acquire(owner, plain_wait)
        r.t_grant -= 1.2  # a 1.2 s region
        rec = regions.release(r, why="region_end")
        assert rec["clean"] and rec["problems"] == []
        assert {w["name"] for w in rec["warnings"]} == {
            "gpu_capped", "power_history", "memory_placement"
        }  # fmt: skip
        assert rec["power_capped_ms"] == 5.0 and rec["thermal_capped_ms"] == 0.0
        assert rec["power_w_before"] == 600 and rec["temp_c"] == [40, 52]
        assert rec["mem_temp_c"] == [48, 57]
        assert 650 < rec["power_w"] < 720  # 840 J over about 1.2 s
        assert rec["memory_gib"] == {"owner": 8.0, "others": 98.0}

    run(main())


def test_a_region_of_a_command_that_was_swapped_says_so_and_stays_clean() -> None:
    """A command taken off the GPU and put back (krex/daemon/swap.py) times on restored memory:
    its later regions name that as a warning; nothing else ran beside them, so they are clean."""

    async def main() -> None:
        regions, _node, gpus = make()
        owner = tenant(gpus, 1)
        before = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        owner.mem_swaps = 1
        after = regions.release(await regions.acquire(owner, plain_wait), why="region_end")
        assert [w["name"] for w in before["warnings"]] == []
        assert [w["name"] for w in after["warnings"]] == ["memory_swapped"] and after["clean"]

    run(main())


@pytest.mark.parametrize(
    ("before_w", "capped_ns", "split"),
    [(300, 0, (8 * GIB, GIB // 2)), (None, 0, (GIB // 2, 98 * GIB)), (100, 0, None)],
)
def test_no_warning_without_its_cause(
    before_w: int | None, capped_ns: int, split: tuple[int, int] | None
) -> None:
    """A quiet GPU, no capping, and a small owner or few others: no warning."""

    async def main() -> None:
        regions, node, gpus = make()
        owner = tenant(gpus, 1)
        grant = {"sm_clock_mhz": 1980, "throttle_reasons": 0, "energy_mj": 0,
                 "power_capped_ns": capped_ns, "power_limit_mw": 700_000}  # fmt: skip
        if before_w is not None:
            grant["power_w_before"] = before_w
        node.samples = [grant, dict(grant)]
        node.split = split
        r = await regions.acquire(owner, plain_wait)
        rec = regions.release(r, why="region_end")
        assert rec["warnings"] == [] and rec["clean"]

    run(main())


def test_the_idle_pool_is_frozen_only_when_it_holds_workers() -> None:
    async def main() -> None:
        regions, node, gpus = make()
        pool = Tenant(
            id=50,
            gpu=0,
            argv=["<pool>"],
            group=cast(TenantGroup, None),
            region_timeout_s=30,
            t_admit=0,
        )
        gpus[0].pool_tenant = pool
        owner = tenant(gpus, 1)
        r = await regions.acquire(owner, plain_wait)
        assert 50 not in node.frozen
        regions.release(r, why="region_end")
        node.procs.add(50)
        r = await regions.acquire(owner, plain_wait)
        assert 50 in node.frozen
        regions.release(r, why="region_end")

    run(main())


def test_a_tenant_leaving_ends_its_region_and_drops_its_requests() -> None:
    async def main() -> None:
        regions, _, gpus = make()
        a, b, c = tenant(gpus, 1), tenant(gpus, 2), tenant(gpus, 3)
        ra = await regions.acquire(a, plain_wait)
        task = asyncio.create_task(regions.acquire(b, plain_wait))
        await until(lambda: regions.queued(0) == 1)
        b.gone = True
        regions.tenant_left(b)
        with pytest.raises((asyncio.CancelledError, ConnectionError)):
            await task
        assert b not in ra.frozen
        c.gone = True
        regions.tenant_left(c)
        a.gone = True
        regions.tenant_left(a)
        assert ra.ended and a.regions[0]["clean"] and regions.held(0) is None

    run(main())


def test_shutdown_lets_a_set_up_finish_then_revokes_every_region() -> None:
    async def main() -> None:
        regions, node, gpus = make(2)
        r0 = await regions.acquire(tenant(gpus, 1, on=[0]), plain_wait)
        node.drain_gate, node.draining = threading.Event(), threading.Event()
        task = asyncio.create_task(regions.acquire(tenant(gpus, 2, on=[1]), plain_wait))
        await until(node.draining.is_set)
        asyncio.get_running_loop().call_later(0.05, node.drain_gate.set)
        await regions.shutdown(5.0)
        r1 = await task
        assert r0.ended and r0.revoked and r1.ended and r1.revoked
        assert not regions.busy() and node.frozen == set()

    run(main())


def test_a_capped_clock_sample_is_named_without_a_zero_count() -> None:
    """A short region whose clock sample says power-capped while NVML's violation counters have
    not moved: the warning says the samples said so, not "for 0 ms"."""
    from krex.daemon.fidelity import warnings

    by_sample = warnings({"power_capped_ms": 0.0, "thermal_capped_ms": 0.0}, True, None)
    assert [w["name"] for w in by_sample] == ["gpu_capped"]
    assert "in its clock samples" in by_sample[0]["detail"] and "0 ms" not in by_sample[0]["detail"]
    by_count = warnings({"power_capped_ms": 42.0}, False, None)
    assert "for 42 ms of the region" in by_count[0]["detail"]
    assert warnings({"power_capped_ms": 0.0}, False, None) == []
