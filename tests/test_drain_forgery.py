"""Issue #49: a sibling's drain acknowledgement is its own word (drain_ack := drain_req in its
own slot segment, which it can write). A sibling that acknowledges without draining used to be
taken as drained while its kernels ran beside the region's owner (5 of 5 clean regions at 2x).
The daemon now confirms the drain from what the tenant cannot write through the driver API:
on the simulated GPU the simulated driver's own record of whose work is queued, running or ran
during the region; a region beside work the record shows is unclean, with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import Node
from helpers import HOLDER, Daemon, configured, krex_run

from krex.core.nvml import Nvml
from krex.daemon.machinery import NVML_MARGIN_S, NodeMachinery, late
from krex.sim import simnode

# A sibling on the simulated GPU that queues `n` kernels of `seconds` each, then sleeps. With
# "forge", a thread of its own keeps drain_ack equal to drain_req in its own slot (its slot
# segment is its tenant's, mapped read-write: the layout is krex/core/shm.py's), so a drain request
# is answered at once while its kernels run; "honest" leaves the answer to the shim's drain
# thread, which synchronises first.
SIBLING = textwrap.dedent("""
    import os, sys, threading, time
    from krex.core.shm import Segment
    from krex.sim.simgpu import SimGPU

    how, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    g = SimGPU()
    g.launch(1000)
    g.sync()
    if how == "forge":
        seg = Segment.attach(os.environ["KREX_SLOTS"])
        mine = [s.index for s in seg.slots_of(os.getpid())]
        assert mine, "no slot of my own"
        raw = seg._seg.slots

        def forge():
            while True:
                for i in mine:
                    raw[i].drain_ack = raw[i].drain_req
                time.sleep(0.0005)

        threading.Thread(target=forge, daemon=True).start()
    for _ in range(n):
        g.launch(int(seconds * 1e9))
    print("queued", os.getpid(), flush=True)
    time.sleep(300)
""")


@pytest.fixture
def patient(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose drain waits long enough for an honest sibling's queued kernels."""
    with configured(tmp_path, "[timeouts]\ndrain_s = 30.0\nquiesce_s = 5.0\n") as d:
        yield d


def _sibling(
    d: Daemon, tmp_path: Path, how: str, n: int, seconds: float
) -> tuple[subprocess.Popen[str], int]:
    """A SIBLING started through d; with its pid once its kernels are queued."""
    script = tmp_path / f"sibling_{how}.py"
    script.write_text(SIBLING)
    argv = [sys.executable, str(script), how, str(n), str(seconds)]
    sib = krex_run(d, *argv, stdout=subprocess.PIPE)
    assert sib.stdout is not None
    line = sib.stdout.readline().split()
    assert line and line[0] == "queued", line
    return sib, int(line[1])


def _regions(d: Daemon, tmp_path: Path, hold_s: float, n: int = 1) -> list[dict[str, object]]:
    """The region records of an owner that takes n regions of hold_s seconds."""
    report = tmp_path / f"owner-{time.monotonic_ns()}.json"
    code = f"import sys\nfor _ in range({n}):\n" + textwrap.indent(HOLDER, "    ")
    p = krex_run(d, sys.executable, "-c", code, str(hold_s), report=report, stdout=subprocess.PIPE)
    assert p.wait(timeout=180) == 0
    return list(json.loads(report.read_text())["regions"])


def _stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait(timeout=60)


def test_a_sibling_that_forges_its_drain_ack_makes_the_region_unclean(
    patient: Daemon, tmp_path: Path
) -> None:
    """The attack: the sibling's kernels (4 x 2 s) are queued when the owner asks; its forged
    acknowledgement comes at once, and the region used to be granted clean beside them. The
    simulated driver's record shows the sibling's work at the grant: unclean, naming it."""
    sib, pid = _sibling(patient, tmp_path, "forge", 4, 2.0)
    try:
        (region,) = _regions(patient, tmp_path, 0.3)
    finally:
        _stop(sib)
    problems = region["problems"]
    assert isinstance(problems, list)
    assert region["clean"] is False, region
    said = [p for p in problems if "after its drain was acknowledged" in p]
    assert said, region
    assert str(pid) in said[0] and "the simulated driver's record" in said[0], region


def test_an_honest_sibling_s_regions_stay_clean(patient: Daemon, tmp_path: Path) -> None:
    """The control: a sibling with the same kind of work queued (3 x 0.3 s) that lets the shim
    drain it: the drain waits for its kernels, and no region beside it is called unclean."""
    sib, _ = _sibling(patient, tmp_path, "honest", 3, 0.3)
    try:
        regions = _regions(patient, tmp_path, 0.2, n=3)
    finally:
        _stop(sib)
    assert len(regions) == 3
    for region in regions:
        assert region["clean"] is True and region["problems"] == [], region


def test_the_simulated_driver_records_whose_work_ran_after_a_time(node: Node) -> None:
    """krexsim_busy (simnode.busy): a process whose kernel is queued is named; once it has
    completed, it is named for a time before its completion and not for one after it; a node
    that does not exist yet has nobody's work."""
    code = textwrap.dedent("""
        import sys
        from krex.sim.simgpu import SimGPU
        g = SimGPU()
        g.launch(400_000_000)
        print("launched", flush=True)
        g.sync()
        print("done", flush=True)
        sys.stdin.read()
    """)
    env = node.env(tenant=1)
    env.pop("LD_PRELOAD")  # the driver's record, not the shim, is the subject
    before = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "launched"
        queued = simnode.busy(node.sim_shm, 0, None)
        assert queued is not None and p.pid in queued[0], queued
        assert p.stdout.readline().strip() == "done"
        after = time.monotonic()
        since_before = simnode.busy(node.sim_shm, 0, before)
        assert since_before is not None and p.pid in since_before[0], since_before
        assert simnode.busy(node.sim_shm, 0, after) == (set(), False)
        assert simnode.busy(node.sim_shm, 0, None) == (set(), False)
        assert simnode.busy(node.sim_shm, 1, before) == (set(), False)  # another GPU's
    finally:
        p.kill()
        p.wait(timeout=30)
    assert simnode.busy(node.sim_shm + "-none", 0, before) == (set(), False)  # no node: nobody


class _Group:
    def __init__(self, pids: list[int]) -> None:
        self._pids = pids

    def pids(self) -> list[int]:
        return self._pids


def _slot(pid: int, tenant: int) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, tenant=tenant, alive=True, ungated=0, gpu=0, gpus=1)


def _machinery(
    owner: SimpleNamespace, siblings: list[SimpleNamespace], slots: list[SimpleNamespace], nvml: Any
) -> NodeMachinery:
    """NodeMachinery of one GPU whose tenants are owner and siblings, with these slots."""
    segments = SimpleNamespace(live_slots=lambda: [(None, s) for s in slots])
    gpu = SimpleNamespace(tenants=[owner, *siblings], pool=[], pool_tenant=None)
    cfg = SimpleNamespace(sim=False)
    return NodeMachinery(cfg, [gpu], segments, nvml)  # type: ignore[arg-type,list-item]


GPU_JOB = textwrap.dedent("""
    import sys
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    for line in sys.stdin:
        g.launch(int(line))
        g.sync()
        print("done", flush=True)
""")


def test_a_sibling_s_work_during_the_region_is_named_at_its_end(node: Node) -> None:
    """NodeMachinery.audit on a simulated node at a region's end (`since`: its grant): a
    sibling's process whose kernel ran after the grant, and completed before the end, is named
    from the simulated driver's record alone; a sibling's whose work completed before the grant
    is not, nor the owner's."""
    env = node.env(tenant=1)
    env.pop("LD_PRELOAD")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GPU_JOB],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]

    def run(p: subprocess.Popen[str], ns: int) -> None:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(f"{ns}\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"

    try:
        early, late_one, mine = procs
        run(early, 50_000_000)
        time.sleep(0.05)
        grant = time.time()
        run(late_one, 100_000_000)
        run(mine, 100_000_000)
        owner = SimpleNamespace(id=1, group=_Group([mine.pid]))
        sibs = [SimpleNamespace(id=2, group=_Group([early.pid])),
                SimpleNamespace(id=3, group=_Group([late_one.pid]))]  # fmt: skip
        slots = [_slot(mine.pid, 1), _slot(early.pid, 2), _slot(late_one.pid, 3)]
        m = _machinery(owner, sibs, slots, None)
        m.sim_shm = node.sim_shm
        problems = m.audit(0, owner, since=grant)  # type: ignore[arg-type]
        assert problems == [
            f"process(es) [{late_one.pid}] of tenant 3 had GPU work running on GPU 0 after its "
            "drain was acknowledged (the simulated driver's record)"
        ], problems
        assert m.audit(0, owner, since=time.time()) == []  # type: ignore[arg-type]
        assert m.audit(0, owner) == []  # type: ignore[arg-type]
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def test_nvml_counts_a_drained_sibling_s_samples_only_clearly_after_the_grant() -> None:
    """machinery.late: a sample shows the sampling period before its timestamp, so a drained
    sibling's sample counts only when stamped later than the grant plus one period plus
    NVML_MARGIN_S (one overlapping the grant may show the work it drained); only drained pids."""
    since, period = 1000.0, 1 / 6
    cutoff = since + period + NVML_MARGIN_S
    samples = {11: since + 0.05, 12: cutoff - 0.01, 13: cutoff + 0.01, 14: since + 5, 15: since + 5}
    assert late(samples, {11, 12, 13, 14, 16}, since, period) == [13, 14]
    assert late(samples, {11, 12, 13, 14}, since, 1.0) == [14]  # a slower product's period


def test_nvml_names_a_sibling_that_worked_after_its_drain_but_not_under_mps() -> None:
    """NodeMachinery.audit with NVML: a gated sibling's work sample stamped well after the
    grant makes the region unclean, naming it and its tenant; one overlapping the grant does
    not. Under MPS NVML samples the server, which krex started (a helper): neither it nor a
    client is named, and nothing is confirmed (docs/security.md)."""
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    owner_pid, sibling, server = (p.pid for p in procs)
    stamped: dict[int, float] = {}
    nvml = SimpleNamespace(
        work_samples=lambda gpu, since: {p: since + dt for p, dt in stamped.items()},
        sample_period=lambda gpu: 1 / 6,
        processes=lambda gpu: set(),
    )
    try:
        owner = SimpleNamespace(id=1, group=_Group([owner_pid]))
        sib = SimpleNamespace(id=2, group=_Group([sibling]))
        m = _machinery(owner, [sib], [_slot(owner_pid, 1), _slot(sibling, 2)], nvml)
        since = time.time() - 3
        stamped.update({owner_pid: 2.0, sibling: 0.1})
        assert m.audit(0, owner, since) == []  # type: ignore[arg-type]
        stamped[sibling] = 2.0
        assert m.audit(0, owner, since) == [  # type: ignore[arg-type]
            f"process(es) [{sibling}] of tenant 2 had GPU work running on GPU 0 after its drain "
            "was acknowledged (NVML's process samples)"
        ]
        m.helper = lambda pid: pid == server
        stamped.clear()
        stamped[server] = 2.0  # MPS: the server is sampled, for everyone
        assert m.audit(0, owner, since) == []  # type: ignore[arg-type]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _fake_pynvml(samples: list[tuple[int, float, int]]) -> types.ModuleType:
    """pynvml whose GPU 0 has these process samples: (pid, timestamp in s, SM utilisation)."""
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]

    def utilisation(h: Any, last_us: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=p, timeStamp=int(t * 1e6), smUtil=u, memUtil=0)
            for p, t, u in samples
            if int(t * 1e6) > last_us
        ]

    m.nvmlDeviceGetProcessUtilization = utilisation  # type: ignore[attr-defined]
    return m


def test_nvml_work_samples_and_the_sampling_period_they_show(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nvml.work_samples: per pid, its latest sample with work since a time; sample_period: NVML's
    longest (1 s) until two samples of one process show the gap, then the shortest gap seen,
    never below NVML's shortest (1/6 s)."""
    samples: list[tuple[int, float, int]] = [(7, 99.9, 50), (8, 100.2, 0)]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(samples))
    nvml = Nvml.open()
    assert nvml is not None
    assert nvml.work_samples(0, 100.0) == {}  # 7's is before; 8's shows no work
    assert nvml.sample_period(0) == 1.0
    samples += [(7, 100.1, 40), (7, 100.4, 30), (7, 100.7, 0)]
    assert nvml.work_samples(0, 100.0) == {7: pytest.approx(100.4)}
    assert nvml.sample_period(0) == pytest.approx(0.2)  # 99.9 -> 100.1
    samples += [(9, 100.80, 10), (9, 100.85, 10)]
    nvml.work_samples(0, 100.0)
    assert nvml.sample_period(0) == pytest.approx(1 / 6)
    assert nvml.sample_period(1) == 1.0  # another GPU's is its own
