"""Faults on the simulated GPU: nothing lost, nothing hangs, every region ends and says whether
it was clean. (Owner SIGKILL in a region, revocation at the time-out and a daemon SIGKILL inside
a region are in test_controller.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import HOLDER, KREX, Counter, Daemon, krex_run, run_argv, running, until

# A sibling that leaves a long kernel on the simulated GPU and then waits: its drain thread
# cannot finish the drain until the kernel does.
LONG_KERNEL = textwrap.dedent("""
    import sys, time
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    g.launch(int(float(sys.argv[1]) * 1e9))
    print("launched", flush=True)
    time.sleep(120)
""")


@pytest.fixture
def fast_drain(tmp_path: Path) -> Iterator[Daemon]:
    cfg = tmp_path / "config.toml"
    cfg.write_text("[timeouts]\ndrain_s = 1.0\nquiesce_s = 1.0\n")
    d = Daemon(tmp_path / "krex.sock", "--config", str(cfg))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def _until(d: Daemon, ready: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0) -> None:
    """Poll GPU 0's status until `ready` says so (fails after `timeout_s`)."""
    until(lambda: ready(d.status()["gpus"][0]), timeout_s, "GPU 0's status")  # type: ignore[index]


def _region(d: Daemon, tmp_path: Path, seconds: str = "0.2") -> tuple[int, dict[str, Any]]:
    report = tmp_path / f"holder-{time.monotonic_ns()}.json"
    p = krex_run(d, sys.executable, "-c", HOLDER, seconds, report=report,
                 stdout=subprocess.PIPE)  # fmt: skip
    rc = p.wait(timeout=60)
    return rc, json.loads(report.read_text())


def test_a_sibling_that_never_drains_makes_the_region_unclean_not_stuck(
    fast_drain: Daemon, tmp_path: Path
) -> None:
    sib = krex_run(fast_drain, sys.executable, "-c", LONG_KERNEL, "1000", stdout=subprocess.PIPE)
    try:
        assert sib.stdout is not None and sib.stdout.readline().strip() == "launched"
        t0 = time.monotonic()
        rc, report = _region(fast_drain, tmp_path)
        assert rc == 0 and time.monotonic() - t0 < 10
        (region,) = report["regions"]
        assert region["clean"] is False and region["drain_s"] >= 1.0, region
        assert any("drain" in p for p in region["problems"]), region
    finally:
        sib.kill()
        sib.wait(timeout=30)
    # Its command dies with it (PR_SET_PDEATHSIG), a moment later; until then it is a GPU user
    # that krex no longer manages, and a region would say so.
    _until(fast_drain, lambda g: not g["foreign"])
    rc, report = _region(fast_drain, tmp_path)
    assert rc == 0 and report["regions"][0]["clean"] is True, report["regions"]


def test_a_sibling_killed_during_the_drain_releases_it_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("[timeouts]\ndrain_s = 30.0\n")
    d = Daemon(tmp_path / "krex.sock", "--config", str(cfg))
    d.start()
    try:
        sib = krex_run(d, sys.executable, "-c", LONG_KERNEL, "20", stdout=subprocess.PIPE)
        assert sib.stdout is not None and sib.stdout.readline().strip() == "launched"
        report = tmp_path / "holder.json"
        holder = krex_run(d, sys.executable, "-c", HOLDER, "0.1", report=report,
                          stdout=subprocess.PIPE)  # fmt: skip
        time.sleep(1.0)  # the region is waiting for the sibling's drain
        assert holder.poll() is None
        t_kill = time.monotonic()
        sib.kill()
        assert holder.wait(timeout=30) == 0
        assert time.monotonic() - t_kill < 5, "the drain did not notice the sibling died"
        (region,) = json.loads(report.read_text())["regions"]
        assert region["drain_s"] < 10, region
        sib.wait(timeout=30)
    finally:
        d.stop()


def test_a_client_killed_while_queued_leaks_no_slot(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "krex.sock", "--slots", "1")
    d.start()
    try:
        # Long enough for the next client to queue behind it, on a loaded machine too.
        first = krex_run(d, "sh", "-c", "echo ready; sleep 10", stdout=subprocess.PIPE)
        assert first.stdout is not None and first.stdout.readline().strip() == "ready"
        queued = krex_run(d, "true")
        _until(d, lambda g: g["queue"] == 1)
        queued.kill()
        queued.wait(timeout=30)
        assert first.wait(timeout=30) == 0
        assert subprocess.run([*run_argv(d), "--", "true"], timeout=30).returncode == 0
        g = d.status()["gpus"][0]  # type: ignore[index]
        assert (g["used"], g["queue"]) == (0, 0), g
    finally:
        d.stop()


def test_the_segment_removed_under_running_tenants(fast_drain: Daemon, tmp_path: Path) -> None:
    """Running tenants carry on and their regions still work; a new command gets one clear
    error instead of running ungated."""
    sib = krex_run(fast_drain, "sh", "-c", "echo ready; sleep 2; exit 5", stdout=subprocess.PIPE)
    assert sib.stdout is not None and sib.stdout.readline().strip() == "ready"
    st = fast_drain.status()
    assert st is not None
    Path("/dev/shm", st["segment"].lstrip("/")).unlink()
    assert fast_drain.status()["segment_linked"] is False  # type: ignore[index]
    p = subprocess.run([*run_argv(fast_drain), "--", "true"], capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    assert p.returncode == 125 and "was removed under the daemon" in p.stderr, p.stderr
    assert sib.wait(timeout=30) == 5


def test_a_full_disk_for_the_report_loses_only_the_report(fast_drain: Daemon) -> None:
    p = subprocess.run(
        [*run_argv(fast_drain), "--report", "/dev/full", "--", "sh", "-c", "echo out; exit 3"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert (p.returncode, p.stdout) == (3, "out\n")
    assert "cannot write the report to /dev/full" in p.stderr


@pytest.mark.parametrize("step", ["queued", "running", "draining"])
def test_daemon_sigkill_at_each_step_then_restart(tmp_path: Path, step: str) -> None:
    """Kill the daemon at a protocol step, start it again: gates open, nothing frozen, running
    commands finish with their own status, a queued client and a region being set up get a
    clear error, and the new daemon serves clean regions."""
    cfg = tmp_path / "config.toml"
    cfg.write_text("[gpus]\nslots = 2\n[timeouts]\ndrain_s = 30.0\n")
    d = Daemon(tmp_path / "krex.sock", "--config", str(cfg))
    d.start()
    procs: list[subprocess.Popen[str]] = []
    try:
        # Long enough that a loaded machine still sees the queue before it ends (at 4 s a
        # loaded CI machine admitted the queued client first).
        running = krex_run(d, "sh", "-c", "echo ready; sleep 10; exit 6", stdout=subprocess.PIPE)
        procs.append(running)
        assert running.stdout is not None and running.stdout.readline().strip() == "ready"
        waiting = None
        if step == "queued":
            procs.append(krex_run(d, "sleep", "12"))
            _until(d, lambda g: g["used"] == 2)
            waiting = subprocess.Popen([*run_argv(d), "--", "true"], stderr=subprocess.PIPE,
                                       text=True)  # fmt: skip
            procs.append(waiting)
            _until(d, lambda g: g["queue"] == 1)
        elif step == "draining":
            sib = krex_run(d, sys.executable, "-c", LONG_KERNEL, "20", stdout=subprocess.PIPE)
            procs.append(sib)
            assert sib.stdout is not None and sib.stdout.readline().strip() == "launched"
            running.kill()  # its slot goes to the region's owner
            running.wait(timeout=30)
            waiting = krex_run(d, sys.executable, "-c", HOLDER, "0.1", stderr=subprocess.PIPE)
            procs.append(waiting)
            # The region waits for the sibling's drain. Polled, not slept: beside busy cores the
            # owner had not asked within 1 s, and asked the restarted daemon instead.
            _until(d, lambda g: g["setting_up"] is not None)
            assert waiting.poll() is None
        assert d.proc is not None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=30)
        d.start()
        if step != "draining":
            assert running.wait(timeout=30) == 6, "a running command carries on"
        if waiting is not None:
            rc = waiting.wait(timeout=60)
            err = waiting.stderr.read() if waiting.stderr is not None else ""
            assert rc != 0 and "daemon" in err, (rc, err)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        st = d.status()
        assert st is not None and st["gpus"][0]["region"] is None
        # This daemon's groups only: other krex daemons on the machine (tests run beside this
        # one) may be freezing theirs right now.
        root = st["segment"].lstrip("/")
        for path in _freezer_states(root):
            assert path.read_text().strip() == "THAWED", path
        rc, report = _region(d, tmp_path)
        assert rc == 0 and report["regions"][0]["clean"] is True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        d.stop()


def _freezer_states(root: str) -> list[Path]:
    """The freezer.state files of groups under `root`, wherever a cgroup mount holds it (a
    walk of all /sys/fs/cgroup would trip over other daemons' groups going meanwhile)."""
    found: list[Path] = []
    for mount in Path("/sys/fs/cgroup").iterdir():
        base = mount / root
        if base.is_dir():
            for d, _, files in os.walk(base):
                found += [Path(d) / f for f in files if f == "freezer.state"]
    return found


@pytest.mark.slow  # a soak: `make test-quick` leaves it out
def test_a_short_soak_with_random_kills(tmp_path: Path) -> None:
    """`make stress` in small: 8 tenants, 150 regions, commands SIGKILLed at random (often
    inside a region): every status right, nothing leaked or frozen at the end."""
    out = tmp_path / "soak.json"
    p = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "scripts" / "stress.py"), "soak",
         "--tenants", "8", "--regions", "150", "--timeout-s", "240", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(out.read_text()) if out.exists() else {}
    assert p.returncode == 0 and doc.get("ok"), p.stdout[-3000:] + p.stderr[-3000:]
    assert doc["regions_granted"] >= 150 and doc["killed"] >= 1, doc


def test_a_foreign_gpu_process_is_shown_and_makes_regions_unclean(
    fast_drain: Daemon, tmp_path: Path
) -> None:
    """A process on the GPU outside krex (no shim, not admitted) cannot be gated, drained or
    frozen: `krex status` lists it and a region taken meanwhile says clean = false."""
    from krex.core.paths import sim_library_dir

    st = fast_drain.status()
    assert st is not None
    env = {**os.environ, "LD_LIBRARY_PATH": str(sim_library_dir()),
           "KREX_SIM_SHM": st["segment"] + "-sim"}  # fmt: skip
    for k in [k for k in env if k.startswith("KREX_") and k != "KREX_SIM_SHM"]:
        del env[k]
    outsider = subprocess.Popen([sys.executable, "-c", LONG_KERNEL, "0.001"], env=env,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert outsider.stdout is not None and outsider.stdout.readline().strip() == "launched"
        assert fast_drain.status()["gpus"][0]["foreign"] == [outsider.pid]  # type: ignore[index]
        shown = subprocess.run([*KREX, "status", "--socket", str(fast_drain.socket)],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        assert "foreign" in shown.stdout and str(outsider.pid) in shown.stdout, shown.stdout
        rc, report = _region(fast_drain, tmp_path)
        (region,) = report["regions"]
        assert rc == 0 and region["clean"] is False
        assert any("foreign" in p for p in region["problems"]), region
    finally:
        outsider.kill()
        outsider.wait(timeout=30)
    rc, report = _region(fast_drain, tmp_path)
    assert report["regions"][0]["clean"] is True
    assert fast_drain.status()["gpus"][0]["foreign"] == []  # type: ignore[index]


MAPS = textwrap.dedent("""
    import json, os
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    g.launch(1000)
    g.sync()
    maps = [line.split() for line in open("/proc/self/maps") if "/dev/shm/krex" in line]
    print(json.dumps({"maps": [[m[1], m[5]] for m in maps], "shm": os.environ["KREX_SHM"],
                      "slots": os.environ["KREX_SLOTS"]}))
""")


def test_tenants_map_the_gates_read_only_and_only_their_own_slots(fast_drain: Daemon) -> None:
    """The gates' segment is read-only in every tenant; each tenant's writable state (its
    processes' slots) is a segment of its own that no other tenant maps."""
    seen = []
    for _ in range(2):
        p = subprocess.run([*run_argv(fast_drain), "--", sys.executable, "-c", MAPS],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        perms = {path: perm for perm, path in doc["maps"]}
        gates, slots = "/dev/shm" + doc["shm"], "/dev/shm" + doc["slots"]
        assert perms[gates] == "r--s" and perms[slots] == "rw-s", perms
        others = [p for p in perms if p not in (gates, slots) and not p.endswith("-sim")]
        assert others == [], perms
        seen.append(slots)
    assert seen[0] != seen[1]


GIVE_UP = textwrap.dedent("""
    import time, krex
    try:
        with krex.region():
            print("granted", flush=True)
    except krex.RegionError as e:
        print("gave up", flush=True)
    time.sleep(60)  # lives on well past the drain (the test kills it)
""")


def test_a_request_abandoned_while_its_region_is_set_up_ends_that_region(tmp_path: Path) -> None:
    """A thread that stops waiting for its grant while the siblings still drain (its
    KREX_REGION_WAIT_S ran out) while its process lives on: once set up, the region it asked
    for ends at once; it is not held, its siblings frozen, until the region's time-out."""
    with running(Daemon(tmp_path / "krex.sock")) as d:
        # A kernel long enough that the asker's request (its interpreter starting first, on a
        # loaded machine too) comes while it still runs: with 2 s it was once granted at once.
        slow = krex_run(d, sys.executable, "-c", LONG_KERNEL, "8.0", stdout=subprocess.PIPE)
        assert slow.stdout is not None and slow.stdout.readline().strip() == "launched"
        sib = Counter(d)
        asker = krex_run(
            d,
            sys.executable,
            "-c",
            GIVE_UP,
            stdout=subprocess.PIPE,
            env={**os.environ, "KREX_REGION_WAIT_S": "0.3"},
        )
        try:
            assert asker.stdout is not None and asker.stdout.readline().strip() == "gave up"
            # The drain ends with the kernel; the abandoned region must end with it.
            _until(d, lambda g: g["setting_up"] is not None)
            _until(d, lambda g: g["setting_up"] is None)
            time.sleep(0.3)
            gpu = (d.status() or {})["gpus"][0]
            assert gpu["region"] is None, gpu
            sib.wait_moving(within_s=30.0)
            assert asker.poll() is None, "the asker lives on: only its request was abandoned"
        finally:
            sib.stop()
            for p in (asker, slow):
                p.kill()
                p.wait(timeout=30)


def test_a_daemon_stopped_while_a_region_is_set_up_exits_cleanly(tmp_path: Path) -> None:
    """SIGTERM while a region's siblings drain: the daemon lets the bounded drain finish before
    it unmaps the segments, then exits 0. (Without that wait a daemon stopped this way died
    once of SIGSEGV; this test does not reproduce that every time.)"""
    d = Daemon(tmp_path / "krex.sock")
    d.start()
    procs = []
    try:
        slow = krex_run(d, sys.executable, "-c", LONG_KERNEL, "8.0", stdout=subprocess.PIPE)
        procs.append(slow)
        assert slow.stdout is not None and slow.stdout.readline().strip() == "launched"
        procs.append(krex_run(d, sys.executable, "-c", HOLDER, "5", stdout=subprocess.PIPE))
        _until(d, lambda g: g["setting_up"] is not None)
        d.stop()
        assert d.proc is not None and d.proc.returncode == 0, d.log.read_text()[-2000:]
    finally:
        d.stop()
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def test_a_daemon_stopped_while_a_command_is_admitted_logs_no_error(tmp_path: Path) -> None:
    """A normal SIGTERM with a command admitted: the daemon ends its connection itself (it
    used to leave the handler to be cancelled, and asyncio logged an ERROR traceback)."""
    d = Daemon(tmp_path / "krex.sock")
    d.start()
    cmd = krex_run(d, "sleep", "30")
    try:
        _until(d, lambda g: g["used"] == 1, timeout_s=10)
        d.stop()
        log = d.log.read_text()
        assert d.proc is not None and d.proc.returncode == 0, log[-2000:]
        assert " ERROR " not in log and "Traceback" not in log, log[-2000:]
    finally:
        d.stop()
        cmd.kill()
        cmd.wait(timeout=30)
