"""Device memory end to end on a simulated node of 1 GiB: commands that fit alone succeed under
krex however many share the GPU, while the same mix without krex fails some; a command larger
than the GPU fails at once, as alone; the deadlocks of docs/memory.md are constructed and end;
no accounting is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import remove_shm, unique
from helpers import KREX, Daemon, run_argv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from krex.paths import sim_library_dir

MIB = 1 << 20
CAPACITY = 1024 * MIB

# A command of the simulated GPU: allocates STEPS (MiB, one after another, HOLD seconds apart),
# then frees everything. "cache": like a caching allocator, on an out-of-memory error it frees
# what it keeps cached (its first allocation) and tries again, once; "retry": tries again once
# with nothing to free (PyTorch's allocator with an empty cache); "plain" just fails.
MEMHOG = textwrap.dedent("""
    import ctypes, json, sys, time
    from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
    import krex
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev, ctx = c_int(), c_void_p()
    assert cu.cuDeviceGet(byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    steps = [int(x) for x in sys.argv[1].split(",")]
    hold, kind, region = float(sys.argv[2]), sys.argv[3], sys.argv[4] == "region"
    ptrs, cached = [], None
    def alloc(mib):
        p = c_uint64()
        return cu.cuMemAlloc_v2(byref(p), c_size_t(mib << 20)), p
    for i, mib in enumerate(steps):
        ctxm = krex.region() if region and i == len(steps) - 1 else None
        if ctxm: ctxm.__enter__()
        rc, p = alloc(mib)
        if rc == 2 and kind == "cache" and ptrs:
            cu.cuMemFree_v2(ptrs.pop(0))  # the cache goes back; the retry waits if need be
            rc, p = alloc(mib)
        elif rc == 2 and kind == "retry":
            rc, p = alloc(mib)  # as PyTorch does when its cache is empty: once more, then fail
        if ctxm: ctxm.__exit__(None, None, None)
        if rc != 0:
            print(json.dumps({"oom": rc == 2, "rc": rc, "step": i}), flush=True)
            sys.exit(3)
        ptrs.append(p)
        time.sleep(hold)
    for p in ptrs:
        assert cu.cuMemFree_v2(p) == 0
    print(json.dumps({"ok": True}), flush=True)
""")


@pytest.fixture
def memd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A daemon of 1 GiB simulated GPUs with quick deadlock releases, 16 slots."""
    monkeypatch.setenv("KREX_SIM_MEM_BYTES", str(CAPACITY))
    cfg = tmp_path / "krex.toml"
    cfg.write_text("[memory]\ndeadlock_s = 0.5\nwait_s = 60\n")
    d = Daemon(tmp_path / "krex.sock", "--slots", "16", "--config", str(cfg))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def memhog(
    steps: list[int], hold: float = 0.2, kind: str = "plain", region: bool = False
) -> list[str]:
    return [sys.executable, "-c", MEMHOG, ",".join(map(str, steps)), str(hold), kind,
            "region" if region else "-"]  # fmt: skip


def through(d: Daemon, argv: list[str], report: Path, *opts: str) -> dict[str, Any]:
    t0 = time.monotonic()
    p = subprocess.run(
        [*run_argv(d), "--report", str(report), *opts, "--", *argv],
        capture_output=True,
        text=True,
        timeout=240,
    )
    rep = json.loads(report.read_text()) if report.exists() else {}
    return {"rc": p.returncode, "wall": time.monotonic() - t0, "report": rep, "err": p.stderr}


def plain(sim_shm: str, argv: list[str]) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.pop("LD_PRELOAD", None)
    env |= {
        "LD_LIBRARY_PATH": str(sim_library_dir()),
        "KREX_SIM_SHM": sim_shm,
        "KREX_SIM_MEM_BYTES": str(CAPACITY),
    }
    return subprocess.run(argv, env=env, capture_output=True, timeout=120).returncode


MIX = [[150, 150]] * 6 + [[100, 200]] * 3 + [[300]] * 3  # each 300 MiB, 3.5 GiB in all


def test_without_krex_the_mix_fails_some() -> None:
    """The control: the same mix at once on a plain simulated node of 1 GiB."""
    sim = unique("krex-sim-mem")
    try:
        with ThreadPoolExecutor(len(MIX)) as ex:
            codes = list(ex.map(lambda s: plain(sim, memhog(s, hold=0.3)), MIX))
    finally:
        remove_shm(sim)
    assert 3 in codes, codes  # some died of out-of-memory
    assert set(codes) <= {0, 3}


@pytest.mark.parametrize("concurrency", [8, 16])
def test_a_mix_of_three_times_the_gpu_all_succeeds_under_krex(
    memd: Daemon, tmp_path: Path, concurrency: int
) -> None:
    """Peaks that sum to 3.5x the GPU, each fitting alone: every command succeeds."""
    kinds = ["cache", "plain"]

    def one(i: int) -> dict[str, Any]:
        return through(memd, memhog(MIX[i], hold=0.3, kind=kinds[i % 2]), tmp_path / f"{i}.json")

    with ThreadPoolExecutor(concurrency) as ex:
        results = list(ex.map(one, range(len(MIX))))
    assert [r["rc"] for r in results] == [0] * len(MIX), [r["err"][-500:] for r in results]
    # A caching command may have given back its first block before taking the next.
    short = [
        (i, MIX[i], r["report"]["memory"], r["err"][-300:])
        for i, r in enumerate(results)
        if r["report"]["memory"]["peak_bytes"] < max(MIX[i]) * MIB
    ]
    assert not short, short
    assert sum(r["report"]["memory"]["waits"] for r in results) > 0  # they did share
    assert_nothing_left(memd)


@pytest.fixture
def memd2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """As memd, over two simulated GPUs of 1 GiB each, 8 slots each."""
    monkeypatch.setenv("KREX_SIM_MEM_BYTES", str(CAPACITY))
    cfg = tmp_path / "krex.toml"
    cfg.write_text("[memory]\ndeadlock_s = 0.5\nwait_s = 60\n")
    d = Daemon(tmp_path / "krex.sock", "--gpus", "2", "--slots", "8", "--config", str(cfg))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def test_memory_is_arbitrated_per_gpu(memd2: Daemon, tmp_path: Path) -> None:
    """Issue #20's memory bar, simulated: the mix of three times a GPU on each of two GPUs at
    once, 8 at a time on each, all succeed; and a GPU full of one command's memory makes
    nobody on the other GPU wait."""
    hog = subprocess.Popen(
        [*run_argv(memd2), "--gpu", "0", "--", *memhog([900], hold=4.0)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)  # the hog holds 900 of GPU 0's 1024 MiB
        r = through(memd2, memhog([900], hold=0.1), tmp_path / "other.json", "--gpu", "1")
        assert r["rc"] == 0, r["err"][-500:]
        assert r["report"]["gpu"] == 1 and r["report"]["memory"]["waits"] == 0, r["report"]
    finally:
        out, _ = hog.communicate(timeout=60)
    assert hog.returncode == 0 and '"ok": true' in out

    def one(i: int) -> dict[str, Any]:
        gpu, k = divmod(i, len(MIX))
        argv = memhog(MIX[k], hold=0.3, kind=("cache", "plain")[k % 2])
        return through(memd2, argv, tmp_path / f"{gpu}-{k}.json", "--gpu", str(gpu))

    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, range(2 * len(MIX))))
    assert [r["rc"] for r in results] == [0] * len(results), [r["err"][-300:] for r in results]
    for gpu in (0, 1):
        mine = results[gpu * len(MIX) : (gpu + 1) * len(MIX)]
        assert {r["report"]["gpu"] for r in mine} == {gpu}
        assert sum(r["report"]["memory"]["waits"] for r in mine) > 0  # each GPU's mix shared
    assert_nothing_left(memd2, gpus=2)


def test_a_command_larger_than_the_gpu_fails_at_once_as_alone(memd: Daemon, tmp_path: Path) -> None:
    r = through(memd, memhog([2048]), tmp_path / "big.json")
    assert r["rc"] == 3 and r["wall"] < 15, r
    mem = r["report"]["memory"]
    assert (mem["oom_alone"], mem["oom_shared"], mem["waits"]) == (1, 0, 0), mem
    assert "attempts" not in r["report"]  # not run again: it fails alone too


@pytest.mark.parametrize("kind", ["plain", "retry"])
def test_every_tenant_waiting_at_once_ends(memd: Daemon, tmp_path: Path, kind: str) -> None:
    """Four commands each hold 250 MiB and want 250 more: nothing can be freed. The youngest
    is released; it fails only because it shared (a retry right after the release fails too),
    and runs again alone."""

    def one(i: int) -> dict[str, Any]:
        time.sleep(0.05 * i)
        return through(memd, memhog([250, 250], hold=0.5, kind=kind), tmp_path / f"d{i}.json")

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(one, range(4)))
    assert [r["rc"] for r in results] == [0] * 4, [r["err"][-400:] for r in results]
    retried = [r for r in results if r["report"].get("attempts")]
    assert retried, "a deadlock of plain programs ends by a release and a rerun"
    assert retried[0]["report"]["attempts"][0]["memory"]["oom_shared"] >= 1
    assert_nothing_left(memd)


def test_a_caching_allocator_gives_back_its_cache_when_released(
    memd: Daemon, tmp_path: Path
) -> None:
    """Caching commands that all wait: released, each frees its cache and retries; none fails
    and none needs a rerun."""

    def one(i: int) -> dict[str, Any]:
        time.sleep(0.05 * i)
        return through(memd, memhog([250, 250], hold=0.5, kind="cache"), tmp_path / f"c{i}.json")

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(one, range(4)))
    assert [r["rc"] for r in results] == [0] * 4, [r["err"][-400:] for r in results]
    assert not any(r["report"].get("attempts") for r in results)


def test_a_region_owner_allocating_while_frozen_siblings_hold_memory_ends(
    memd: Daemon, tmp_path: Path
) -> None:
    """A sibling holds 800 MiB and is frozen by the owner's region; the owner's allocation in
    the region waits, and the wait ends (the region's time-out thaws the sibling, which then
    finishes and frees)."""
    with ThreadPoolExecutor(2) as ex:
        sib = ex.submit(through, memd, memhog([800], hold=2.0), tmp_path / "sib.json")
        time.sleep(1.0)
        owner = ex.submit(
            through,
            memd,
            memhog([100, 400], hold=0.1, region=True),
            tmp_path / "owner.json",
            "--region-timeout",
            "1.5",
        )
        rs, ro = sib.result(), owner.result()
    assert rs["rc"] == 0 and ro["rc"] == 0, (rs["err"][-400:], ro["err"][-400:])
    assert ro["report"]["memory"]["waits"] >= 1
    assert_nothing_left(memd)


def test_a_region_waits_for_room_before_it_freezes_the_holders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sibling holds 800 MiB for 2 s; the owner asks for its region and then allocates 300
    MiB inside it. With room for 300 MiB asked, the region waits (the sibling still runs and
    frees) instead of freezing the holder: the owner never waits inside its region, and the
    region is clean."""
    monkeypatch.setenv("KREX_SIM_MEM_BYTES", str(CAPACITY))
    cfg = tmp_path / "krex.toml"
    cfg.write_text("[memory]\ndeadlock_s = 0.5\nroom_gib = 0.3\nroom_wait_s = 20\n")
    d = Daemon(tmp_path / "krex.sock", "--slots", "4", "--config", str(cfg))
    d.start()
    try:
        with ThreadPoolExecutor(2) as ex:
            sib = ex.submit(through, d, memhog([800], hold=2.0), tmp_path / "sib.json")
            time.sleep(0.8)
            owner = ex.submit(
                through, d, memhog([10, 300], hold=0.1, region=True), tmp_path / "owner.json"
            )
            rs, ro = sib.result(), owner.result()
    finally:
        d.stop()
    assert rs["rc"] == 0 and ro["rc"] == 0, (rs["err"][-400:], ro["err"][-400:])
    (region,) = ro["report"]["regions"]
    assert region["clean"] and not region["revoked"], region
    assert region["wait_s"] >= 0.5  # it waited for the sibling's 800 MiB to go
    assert ro["report"]["memory"]["waits"] == 0, ro["report"]["memory"]
    assert "waited" in d.log.read_text() and "room in device memory" in d.log.read_text()


def test_a_wait_for_memory_shows_in_status_and_top(memd: Daemon, tmp_path: Path) -> None:
    """While one command holds 800 MiB, another's 400 MiB allocation waits: `krex status`
    shows who waits and for how long, and `krex top` shows it in its tables."""
    with ThreadPoolExecutor(2) as ex:
        ex.submit(through, memd, memhog([800], hold=3.0), tmp_path / "holder.json")
        time.sleep(0.8)
        waiter = ex.submit(through, memd, memhog([400], hold=0.1), tmp_path / "waiter.json")
        deadline, seen = time.monotonic() + 20, None
        while time.monotonic() < deadline and seen is None:
            g = (memd.status() or {})["gpus"][0]
            waiting = [t for t in g["tenants"] if t["memory"]["waiting_s"] > 0]
            if waiting and g["memory"]["waiting"] == 1:
                seen = g
            else:
                time.sleep(0.1)
        top = subprocess.run(
            [*KREX, "top", "--once", "--socket", str(memd.socket)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert waiter.result()["rc"] == 0
    assert seen is not None, "no tenant was seen waiting for memory"
    holder = max(seen["tenants"], key=lambda t: t["memory"]["bytes"])
    assert holder["memory"]["bytes"] >= 800 * MIB and holder["memory"]["peak_bytes"] >= 800 * MIB
    assert holder["memory"]["nvml_bytes"] is None  # NVML does not see a simulated GPU
    assert top.returncode == 0, top.stderr
    assert "memory wait s" in top.stdout and "oldest" in top.stdout, top.stdout


def assert_nothing_left(d: Daemon, gpus: int = 1) -> None:
    """No memory held or waited for, no tenant left on the first `gpus` GPUs, once everything
    finished."""
    deadline = time.monotonic() + 10
    while True:
        gs = (d.status() or {})["gpus"][:gpus]
        left = [
            g
            for g in gs
            if (g["memory"]["held_bytes"], g["memory"]["waiting"], g["used"]) != (0, 0, 0)
        ]
        if not left:
            return
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mix=st.lists(
        st.tuples(
            st.lists(st.integers(50, 400), min_size=1, max_size=3).filter(lambda s: sum(s) <= 900),
            st.sampled_from(["plain", "cache"]),
            st.booleans(),  # in a region
            st.booleans(),  # killed part-way
        ),
        min_size=2,
        max_size=8,
    )
)
def test_random_mixes_never_fail_for_sharing_never_hang_and_leave_nothing(
    memd: Daemon, tmp_path: Path, mix: list[tuple[list[int], str, bool, bool]]
) -> None:
    """Any mix of commands that each fit alone: every command not killed succeeds, within a
    bound; killed ones free what they held; the arbiter ends with nothing held or waiting."""

    def one(i: int) -> tuple[bool, dict[str, Any]]:
        steps, kind, region, kill = mix[i]
        argv = [*run_argv(memd), "--", *memhog(steps, hold=0.2, kind=kind, region=region)]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if kill:
            time.sleep(0.3)
            p.kill()
        _, err = p.communicate(timeout=180)
        return kill, {"rc": p.returncode, "err": err[-300:]}

    with ThreadPoolExecutor(len(mix)) as ex:
        results = list(ex.map(one, range(len(mix))))
    assert all(r["rc"] == 0 for killed, r in results if not killed), results
    assert_nothing_left(memd)
