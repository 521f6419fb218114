"""Region markers against a fake daemon: the Python API, `krex region --`, the C entry points
of libkrex.so, and auto-regions in an unmodified child Python process."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import C_DIR, compile_c, load_script
from fake_daemon import FakeDaemon
from helpers import until

import krex
from krex.core import wire
from krex.core.errors import KrexError
from krex.core.paths import shim_library
from krex.tenant import autoregions, markers
from krex.tenant.markers import RegionError, last_region, region

KREX_ENV = (
    "KREX_SOCKET",
    "KREX_TENANT",
    "KREX_REGION_WAIT_S",
    "KREX_REGION_LINGER_S",
    "KREX_AUTO_REGIONS",
)
# For tests that count one region per wrapped call: auto-regions that do not linger (the
# lingering itself is tested on its own).
NO_LINGER = {"KREX_REGION_LINGER_S": "0"}
TENANT = 7


def clean_env(**more: str) -> dict[str, str]:
    """os.environ without any KREX_* variable (as outside krex), plus `more`."""
    env = {k: v for k, v in os.environ.items() if k not in KREX_ENV}
    env.update(more)
    return env


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in KREX_ENV:
        monkeypatch.delenv(name, raising=False)
    markers._environment.cache_clear()
    yield
    markers._environment.cache_clear()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    with FakeDaemon(tmp_path / "krex.sock") as d:
        yield d


@pytest.fixture
def inside(
    outside: None, daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeDaemon]:
    """This test process is a tenant of the fake daemon."""
    for name, value in daemon.env(TENANT).items():
        monkeypatch.setenv(name, value)
    markers._environment.cache_clear()
    yield daemon


def pairs(n: int) -> list[tuple[str, int | None, int | None]]:
    return [("region_begin", TENANT, os.getpid()), ("region_end", TENANT, os.getpid())] * n


# The Python API


def test_outside_krex_a_region_is_a_no_op(
    outside: None, daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without KREX_SOCKET/KREX_TENANT nothing connects: no socket is even made (what an
    enter/exit pair costs is a measurement, not a behaviour: under load a bound asserted here
    failed in CI)."""

    def no_socket(*args: object, **kwargs: object) -> None:
        raise AssertionError("a region outside krex made a socket")

    with region():
        pass
    monkeypatch.setattr(socket, "socket", no_socket)
    for _ in range(1000):
        with krex.region():
            pass
    assert daemon.connections == 0


def test_package_reexports_the_markers() -> None:
    """`krex.region`, `krex.last_region` and `krex.RegionError` are krex.tenant.markers' own."""
    assert krex.region is region
    assert krex.last_region is last_region
    assert krex.RegionError is RegionError
    assert issubclass(RegionError, KrexError)


def test_nested_regions_send_one_begin_end_pair(inside: FakeDaemon) -> None:
    """Only the outermost region of a thread talks to the daemon; nesting only counts."""
    with region(), region(), region():
        assert inside.ops() == ["region_begin"]
    assert inside.wait_for(2) == pairs(1)
    with region():
        pass
    assert inside.wait_for(4) == pairs(2)


def test_decorator_runs_each_call_in_a_region(inside: FakeDaemon) -> None:
    """`@region()` keeps the function's metadata and makes each call one region."""

    @region()
    def bench(x: int) -> int:
        """Doc of bench."""
        assert inside.ops()[-1] == "region_begin"
        return x + 1

    assert (bench.__name__, bench.__doc__) == ("bench", "Doc of bench.")
    assert bench(1) == 2
    assert bench(2) == 3
    assert inside.wait_for(4) == pairs(2)


def test_a_region_ends_when_its_body_raises(inside: FakeDaemon) -> None:
    """The body's exception propagates and region_end is still sent."""
    with pytest.raises(ZeroDivisionError), region():
        _ = 1 / 0
    assert inside.wait_for(2) == pairs(1)


def test_two_threads_hold_two_regions(inside: FakeDaemon) -> None:
    """Depth is per thread: two threads inside at once are two begins on two connections."""
    both_inside = threading.Barrier(2, timeout=10)

    def work() -> None:
        with region():
            both_inside.wait()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    ops = [op for op, _, _ in inside.wait_for(4)]
    assert ops[:2] == ["region_begin", "region_begin"]
    assert sorted(ops[2:]) == ["region_end", "region_end"]
    assert inside.connections == 2


def test_a_forked_child_never_ends_its_parents_region(inside: FakeDaemon) -> None:
    """A child forked inside a region leaves it without region_end; the parent's end works."""
    with region():
        pid = os.fork()
    if pid == 0:  # the child, having left the region it inherited
        os._exit(0)
    os.waitpid(pid, 0)
    assert inside.wait_for(2) == pairs(1)


def linger(monkeypatch: pytest.MonkeyPatch, seconds: str) -> None:
    monkeypatch.setenv("KREX_REGION_LINGER_S", seconds)
    markers._environment.cache_clear()


def test_an_auto_region_lingers_and_the_next_continues_it(
    inside: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An auto-region left by its thread is held KREX_REGION_LINGER_S: the thread's next
    region in that time continues it (no new begin: no new drain or freeze), and past it the
    reaper ends it with nothing more from the thread."""
    linger(monkeypatch, "0.3")
    auto = markers.auto_region()
    with auto:
        pass
    assert markers.region_depth() == 0
    assert inside.ops() == ["region_begin"]  # held, not ended
    with auto:  # the next timing, within the linger: the same region
        pass
    assert inside.ops() == ["region_begin"]
    with auto:
        pass
    assert (last_region() or {}).get("clean") is True  # asking for it ends it: the timing is over
    assert inside.ops() == ["region_begin", "region_end"]
    with auto:
        pass
    left = time.monotonic()
    assert inside.wait_for(4, timeout_s=30) == pairs(2)  # the reaper's end
    assert time.monotonic() - left > 0.25  # after the linger
    until(lambda: last_region() is not None, 30, "the record")  # once the reaper has the reply
    assert (last_region() or {}).get("clean") is True


def test_a_region_record_names_the_markers_that_held_it(
    inside: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """region_end carries `calls`: each marker's label with how often it began or continued
    the region (outermost entries only), so a record says what held the GPU; past
    MAX_CALL_NAMES - 1 names the rest count as "(others)"."""
    with region(), region():
        pass
    assert (last_region() or {}).get("calls") == {"krex.region": 1}
    linger(monkeypatch, "0.3")
    tune, timer = markers.auto_region("triton.testing.do_bench"), markers.auto_region("t.timer")
    assert markers.auto_region("t.timer") is timer  # one marker per label
    for auto in (tune, tune, timer, tune):
        with auto, auto:  # nested: one count
            pass
    assert inside.ops() == ["region_begin", "region_end", "region_begin"]  # one lingering region
    assert (last_region() or {}).get("calls") == {"triton.testing.do_bench": 3, "t.timer": 1}
    for i in range(wire.MAX_CALL_NAMES + 3):
        with markers.auto_region(f"m.f{i}"):
            pass
    calls = (last_region() or {}).get("calls") or {}
    assert len(calls) == wire.MAX_CALL_NAMES and wire.calls_problem(calls) is None
    assert calls["(others)"] == 4 and calls["m.f0"] == 1, calls


def test_an_autotuners_candidate_benchmark_says_so_in_its_region_begin(
    inside: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """region_begin carries `candidate: true` for a region an autotuner's candidate begins:
    a candidate marker's (Inductor's, cuDNN's search), or any marker inside candidates()
    (Triton's Autotuner._bench calls the user's do_bench); a timing of the user's does not."""
    linger(monkeypatch, "0")
    timer = markers.auto_region("triton.testing.do_bench")
    search = markers.auto_region("torch.nn.functional.conv2d (cuDNN search)", candidate=True)
    assert search is not markers.auto_region("torch.nn.functional.conv2d (cuDNN search)")
    with timer:
        pass
    with search:
        pass
    with markers.candidates(), timer:
        pass
    with region():  # after candidates(): a timing again
        pass
    inside.wait_for(8)
    assert inside.candidate == [False, True, True, False]


def test_a_timing_does_not_continue_a_candidates_lingering_region(
    inside: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timing that begins while an autotuner's candidate region lingers (a Triton kernel's
    first call autotunes, then do_bench times it at once) ends that region and begins its own,
    not a candidate's, so the daemon's settle rules see it; candidates continue a candidate's
    region, and a candidate continues a timing's."""
    linger(monkeypatch, "1")
    timer = markers.auto_region("triton.testing.do_bench")
    search = markers.auto_region("torch.nn.functional.conv2d (cuDNN search)", candidate=True)
    with search:
        pass
    with markers.candidates(), timer:  # Autotuner._bench: another candidate, the same region
        pass
    assert inside.ops() == ["region_begin"]
    with timer:  # the reported timing: its own region
        pass
    assert inside.ops() == ["region_begin", "region_end", "region_begin"]
    assert inside.candidate == [True, False]
    with search:  # a candidate after a timing continues the timing's region
        pass
    assert (last_region() or {}).get("calls") == {
        "triton.testing.do_bench": 1,
        "torch.nn.functional.conv2d (cuDNN search)": 1,
    }
    assert inside.ops() == ["region_begin", "region_end"] * 2


def test_a_plain_region_ends_a_lingering_one_at_its_exit(
    inside: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """krex.region() continues a lingering auto-region but, not lingering itself, ends it at
    its exit; an auto-region nested in a plain one ends with the plain one."""
    linger(monkeypatch, "1")
    with markers.auto_region():
        pass
    with region():
        assert inside.ops() == ["region_begin"]
    assert inside.ops() == ["region_begin", "region_end"]
    with region(), markers.auto_region():
        pass
    assert inside.ops() == ["region_begin", "region_end"] * 2


def test_flush_ends_lingering_regions_now(
    inside: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flush() (a command's end in a warm worker, and at exit) ends every lingering region of
    the process at once, other threads' too; a region still entered is left alone."""
    linger(monkeypatch, "1")
    other = threading.Thread(target=markers.auto_region().__enter__)
    other.start()  # entered and never left: not lingering, not flushed

    def left_in_thread() -> None:
        with markers.auto_region():
            pass

    worker = threading.Thread(target=left_in_thread)
    other.join(timeout=10)
    worker.start()
    worker.join(timeout=10)
    inside.wait_for(2)
    markers.flush()
    assert sorted(inside.ops()) == ["region_begin", "region_begin", "region_end"]


def test_a_lingering_region_ends_at_exit_and_not_in_a_forked_child(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    """A process that exits with its auto-region lingering ends it (region_end, not EOF) at
    once, without waiting for the linger; a child forked meanwhile never ends it."""
    script = textwrap.dedent("""
        import os, time
        from krex.tenant import markers
        with markers.auto_region():
            pass
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print(time.monotonic())
        """)
    env = clean_env(KREX_REGION_LINGER_S="1", **daemon.env(TENANT))
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    ended = time.monotonic()
    assert (result.returncode, result.stderr) == (0, "")
    assert ended - float(result.stdout) < 0.9  # flushed at exit, not reaped after 1 s
    assert [op for op, _, _ in daemon.wait_for(2)] == ["region_begin", "region_end"]
    assert daemon.ops() == ["region_begin", "region_end"]


@pytest.mark.parametrize("then", ["exit", "record"])
def test_a_region_the_reaper_is_ending_is_waited_for(daemon: FakeDaemon, then: str) -> None:
    """The reaper takes a lingering region whose time is up and ends it outside the lock. A
    process exiting meanwhile found nothing left to flush, and the interpreter stopped the
    reaper's daemon thread half-way: the region ended by EOF, not region_end (seen once in CI,
    tests/test_markers.py::test_auto_regions_register_into_inductors_lock_hook, 2026-12-06);
    and last_region() asked meanwhile gave the record before it. Here the reaper's ending is
    slowed so that the exit (or the question) always falls inside it: both wait for it."""
    script = textwrap.dedent("""
        import sys, time
        from krex.tenant import markers
        end = markers._end
        def slow_end(*args, **kwargs):
            time.sleep(0.5)  # the reaper between taking the region and region_end
            return end(*args, **kwargs)
        markers._end = slow_end
        with markers.auto_region():
            pass
        time.sleep(0.2)  # the linger (0.05 s) is up: the reaper has taken it
        if sys.argv[1] == "record":
            print(markers.last_region()["clean"])
        """)
    env = clean_env(KREX_REGION_LINGER_S="0.05", **daemon.env(TENANT))
    result = subprocess.run(
        [sys.executable, "-c", script, then], env=env, capture_output=True, text=True, timeout=60
    )
    out = "True\n" if then == "record" else ""
    assert (result.returncode, result.stdout, result.stderr) == (0, out, "")
    assert [op for op, _, _ in daemon.wait_for(2)] == ["region_begin", "region_end"]
    assert daemon.ops() == ["region_begin", "region_end"]


@pytest.mark.parametrize("value", ["soon", "-1", "2", "nan"])
def test_bad_linger_variable_is_one_clear_error(
    inside: FakeDaemon, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """KREX_REGION_LINGER_S outside [0, 1] s is reported as such, and no region begins."""
    linger(monkeypatch, value)
    with (
        pytest.raises(
            RegionError,
            match=f"KREX_REGION_LINGER_S must be between 0 and 1 seconds, not '{value}'",
        ),
        markers.auto_region(),
    ):
        pass
    assert inside.ops() == []


def test_last_region_is_the_daemons_record(inside: FakeDaemon) -> None:
    """last_region() returns the `region` object of the region_end reply."""
    with region():
        time.sleep(0.01)
    record = last_region()
    assert record is not None
    assert record["duration_s"] >= 0.01
    assert (record["drain_s"], record["freeze_s"]) == (0.001, 0.002)
    assert (record["clean"], record["revoked"]) == (True, False)
    assert record["problems"] == []


def test_a_short_record_gets_the_missing_keys(inside: FakeDaemon) -> None:
    """A record without some of the daemon's keys (an older or lost daemon) is completed, and
    unclean when it does not say clean."""
    assert markers._complete({"revoked": True}) == {
        "wait_s": 0.0, "drain_s": 0.0, "freeze_s": 0.0, "duration_s": 0.0,
        "clean": False, "revoked": True, "problems": [], "warnings": [],
    }  # fmt: skip
    first, second = markers._complete({}), markers._complete({})
    first["problems"].append("x")
    assert second["problems"] == []


def test_a_daemon_lost_inside_a_region_is_a_revoked_record(
    outside: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The daemon dies inside the region: the exit does not raise; one `krex:` line says so and
    last_region() is revoked and unclean."""
    gone = FakeDaemon(tmp_path / "krex.sock")
    with gone:
        for name, value in gone.env(TENANT).items():
            monkeypatch.setenv(name, value)
        markers._environment.cache_clear()
        region().__enter__()
    region().__exit__(None, None, None)  # after the daemon has gone
    record = last_region()
    assert record is not None
    assert (record["revoked"], record["clean"]) == (True, False)
    # The keys of a normal record, so that a harness indexing them does not fail here, and
    # the markers that held it (known here, not from the daemon).
    assert set(record) == {
        "wait_s", "drain_s", "freeze_s", "duration_s", "clean", "revoked", "problems", "warnings",
        "calls",
    }  # fmt: skip
    assert record["calls"] == {"krex.region": 1}
    assert (record["drain_s"], record["freeze_s"]) == (0.001, 0.002)  # the grant's
    assert len(record["problems"]) == 1 and "the krex daemon" in record["problems"][0]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("krex: "), lines
    assert lines[0].endswith("the region is recorded as revoked")


def test_unreachable_daemon_fails_fast_and_clearly(
    outside: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No daemon at KREX_SOCKET: a RegionError naming the socket once the retries run out."""
    monkeypatch.setattr(markers, "CONNECT_RETRY_S", 0.3)
    monkeypatch.setenv("KREX_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setenv("KREX_TENANT", "3")
    start = time.monotonic()
    with (
        pytest.raises(RegionError, match=r"cannot connect to the krex daemon at .*none\.sock"),
        region(),
    ):
        pytest.fail("the body ran without a region")
    assert 0.2 < time.monotonic() - start < 4  # the 0.3 s set, not the default 5 s


def test_a_daemon_that_comes_up_late_is_waited_for(
    outside: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connecting is retried: a daemon listening 0.3 s after region() was entered grants it."""
    late = FakeDaemon(tmp_path / "krex.sock")
    for name, value in late.env(TENANT).items():
        monkeypatch.setenv(name, value)
    markers._environment.cache_clear()
    timer = threading.Timer(0.3, late.__enter__)
    timer.start()
    try:
        with region():
            pass
        assert late.wait_for(2) == pairs(1)
    finally:
        timer.join()
        late.__exit__(None, None, None)


def test_refused_region_raises_the_daemons_reason(
    outside: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `ok: false` reply to region_begin is a RegionError carrying the daemon's error."""
    with FakeDaemon(tmp_path / "krex.sock", refuse="tenant 7 is not admitted") as d:
        for name, value in d.env(TENANT).items():
            monkeypatch.setenv(name, value)
        markers._environment.cache_clear()
        with (
            pytest.raises(RegionError, match="refused region_begin: tenant 7 is not admitted"),
            region(),
        ):
            pass


def test_the_wait_for_a_grant_is_bounded(
    outside: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No grant within KREX_REGION_WAIT_S: RegionError, and the daemon sees the client leave."""
    with FakeDaemon(tmp_path / "krex.sock", grant_delay_s=30) as d:
        for name, value in d.env(TENANT).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("KREX_REGION_WAIT_S", "0.3")
        markers._environment.cache_clear()
        start = time.monotonic()
        with pytest.raises(RegionError, match=r"granted no region within 0\.3 s"), region():
            pass
        assert time.monotonic() - start < 20  # not the 30 s grant delay
        assert [op for op, _, _ in d.wait_for(2)] == ["region_begin", "eof"]


def test_bad_tenant_variable_is_one_clear_error(
    outside: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed KREX_TENANT is reported as such, not as a connection problem."""
    monkeypatch.setenv("KREX_SOCKET", "/nonexistent.sock")
    monkeypatch.setenv("KREX_TENANT", "seven")
    markers._environment.cache_clear()
    with (
        pytest.raises(RegionError, match="KREX_TENANT must be a positive integer, not 'seven'"),
        region(),
    ):
        pass


# krex region -- CMD


def krex_region(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "krex.cli", "region", "--", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_krex_region_exits_with_the_commands_status(daemon: FakeDaemon) -> None:
    """`krex region -- sh -c 'exit 3'` exits 3 and is exactly one region, owned by the CLI."""
    result = krex_region("sh", "-c", "echo out; exit 3", env=clean_env(**daemon.env(TENANT)))
    assert result.returncode == 3, result.stderr
    assert result.stdout == "out\n"
    received = daemon.wait_for(2)
    assert [(op, tenant) for op, tenant, _ in received] == [
        ("region_begin", TENANT),
        ("region_end", TENANT),
    ]


def test_krex_region_reports_a_signal_as_128_plus_n(daemon: FakeDaemon) -> None:
    """A command killed by SIGTERM makes `krex region` exit 143, and the region still ends."""
    result = krex_region("sh", "-c", "kill -TERM $$", env=clean_env(**daemon.env(TENANT)))
    assert result.returncode == 128 + 15, result.stderr
    assert daemon.ops() == ["region_begin", "region_end"]


def test_krex_region_of_a_missing_command_is_127_and_one_line(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    """A command that cannot start: exit 127, one line on stderr, and no region taken."""
    missing = tmp_path / "missing"  # not a name the machine might have (a /nonexistent did)
    result = krex_region(str(missing), "--flag", env=clean_env(**daemon.env(TENANT)))
    assert result.returncode == 127
    assert result.stderr.splitlines() == [
        f"krex region: cannot run {missing}: no such file or directory"
    ]
    assert daemon.connections == 0


def test_krex_region_outside_krex_just_runs_the_command(daemon: FakeDaemon) -> None:
    """Outside krex `krex region --` runs the command with no region and its own status."""
    result = krex_region("sh", "-c", "exit 5", env=clean_env())
    assert result.returncode == 5
    assert daemon.connections == 0


# The C entry points in libkrex.so


@pytest.fixture(scope="module")
def region_user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_c(C_DIR / "region_user.c", tmp_path_factory.mktemp("c") / "region_user")


def run_c(program: Path, mode: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "LD_PRELOAD": str(shim_library())}
    return subprocess.run([str(program), mode], env=env, capture_output=True, text=True, timeout=30)


def test_c_nested_regions_are_one_pair(region_user: Path, daemon: FakeDaemon) -> None:
    """krex_region_begin/end nested twice under LD_PRELOAD: one begin/end pair, all return 0."""
    result = run_c(region_user, "nested", clean_env(**daemon.env(TENANT)))
    assert (result.returncode, result.stdout, result.stderr) == (0, "rc 0 0 0 0\n", "")
    received = daemon.wait_for(2)
    assert [(op, tenant) for op, tenant, _ in received] == [
        ("region_begin", TENANT),
        ("region_end", TENANT),
    ]
    assert received[0][2] == received[1][2] != os.getpid()  # the C program's own pid


def test_c_threads_hold_their_own_regions(region_user: Path, daemon: FakeDaemon) -> None:
    """The C depth is per thread: two threads inside at once are two regions."""
    result = run_c(region_user, "threads", clean_env(**daemon.env(TENANT)))
    assert (result.returncode, result.stdout) == (0, "rc 0 0 0 0\n"), result.stderr
    assert sorted(daemon.ops()) == ["region_begin"] * 2 + ["region_end"] * 2
    assert daemon.connections == 2


def test_c_outside_krex_returns_0_without_connecting(region_user: Path, daemon: FakeDaemon) -> None:
    """Preloaded but outside krex: both calls return 0 and nothing connects."""
    result = run_c(region_user, "nested", clean_env())
    assert (result.returncode, result.stdout, result.stderr) == (0, "rc 0 0 0 0\n", "")
    assert daemon.connections == 0


def test_c_without_libkrex_sees_null_symbols(region_user: Path) -> None:
    """<krex.h> declares the entry points weak: without libkrex.so the program still runs."""
    result = subprocess.run(
        [str(region_user)], env=clean_env(), capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stdout) == (2, "no libkrex\n")


def test_c_waits_for_a_daemon_that_comes_up_late(region_user: Path, tmp_path: Path) -> None:
    """The C client retries connecting too: a daemon listening 0.3 s later grants the region."""
    late = FakeDaemon(tmp_path / "krex.sock")
    proc = subprocess.Popen(
        [str(region_user), "once"],
        env={**clean_env(**late.env(TENANT)), "LD_PRELOAD": str(shim_library())},
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)
    with late:
        out, _ = proc.communicate(timeout=30)
        assert (proc.returncode, out) == (0, "rc 0 0\n")
        assert late.ops() == ["region_begin", "region_end"]


def test_c_refusal_is_minus_1_and_one_warning(region_user: Path, tmp_path: Path) -> None:
    """A refused begin returns -1 with one warning line naming the reason; its end is -1, quiet."""
    with FakeDaemon(tmp_path / "krex.sock", refuse="no such tenant") as d:
        result = run_c(region_user, "once", clean_env(**d.env(TENANT)))
    assert (result.returncode, result.stdout) == (1, "rc -1 -1\n")
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "krex_region_begin: the krex daemon refused: no such tenant"
    ), result.stderr


def test_c_wait_for_a_grant_is_bounded(region_user: Path, tmp_path: Path) -> None:
    """No grant within KREX_REGION_WAIT_S: begin returns -1 in time and the daemon sees EOF."""
    with FakeDaemon(tmp_path / "krex.sock", grant_delay_s=30) as d:
        start = time.monotonic()
        env = clean_env(**d.env(TENANT), KREX_REGION_WAIT_S="0.3")
        result = run_c(region_user, "once", env)
        assert time.monotonic() - start < 20  # not the 30 s grant delay
        assert [op for op, _, _ in d.wait_for(2)] == ["region_begin", "eof"]
    assert result.stdout == "rc -1 -1\n"
    assert "did not answer within 0.3 s (KREX_REGION_WAIT_S)" in result.stderr


# Auto-regions


FAKEBENCH = '''
def do_bench(fn):
    """Time fn (a stand-in for triton.testing.do_bench)."""
    fn()
    return 1.0
'''

SCRIPT = """
import sys
import fakebench.testing
from fakebench.testing import do_bench

do_bench(lambda: None)
fakebench.testing.do_bench(lambda: None)
print(do_bench.__name__, do_bench.__doc__)
print("sitecustomize" in sys.modules and sys.modules["sitecustomize"].__file__)
"""


def test_auto_regions_wrap_an_unmodified_script(daemon: FakeDaemon, tmp_path: Path) -> None:
    """With env_for(["fakebench.testing.do_bench"]), the do_bench calls of a script that never
    mentions krex are in a region (its two calls back to back, one region: they linger), and the
    user's own sitecustomize still runs."""
    (tmp_path / "fakebench").mkdir()
    (tmp_path / "fakebench" / "__init__.py").write_text("")
    (tmp_path / "fakebench" / "testing.py").write_text(FAKEBENCH)
    (tmp_path / "usersite").mkdir()
    user_site = tmp_path / "usersite" / "sitecustomize.py"
    user_site.write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\nprint('user site')\n")
    (tmp_path / "main.py").write_text(SCRIPT + "import os\nprint(os.environ['USER_SITE_RAN'])\n")
    base = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "usersite"), str(tmp_path)])}
    env = clean_env(**autoregions.env_for(["fakebench.testing.do_bench"], base))
    env.update(daemon.env(TENANT))
    # A linger a loaded machine cannot outlast between two calls (5 ms, the default, it did).
    env["KREX_REGION_LINGER_S"] = "1"
    result = subprocess.run(
        [sys.executable, str(tmp_path / "main.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        "user site",
        "do_bench Time fn (a stand-in for triton.testing.do_bench).",
        str(user_site),
        "1",
    ]
    assert [op for op, _, _ in daemon.wait_for(2)] == ["region_begin", "region_end"]
    assert daemon.ops() == ["region_begin", "region_end"]


def test_auto_regions_never_break_the_program(tmp_path: Path) -> None:
    """A bad KREX_AUTO_REGIONS costs one `krex:` warning line; the program runs on."""
    env = clean_env(PYTHONPATH=str(autoregions.AUTO_DIR), KREX_AUTO_REGIONS="not a name")
    result = subprocess.run(
        [sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (0, "ran\n")
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("krex: auto-regions are off"), result.stderr


FAKE_INDUCTOR = '''
import contextlib

_context = None


def set_gpu_benchmark_lock_context(factory):
    """The hook's contract (pytorch PR #184905): set the factory, return the previous one."""
    global _context
    previous, _context = _context, factory
    return previous


@contextlib.contextmanager
def maybe_gpu_benchmark_lock():
    if _context is None:
        yield
        return
    with _context():
        yield
'''


def write_files(root: Path, files: dict[str, str]) -> None:
    """A stand-in package's files (path relative to root: text) written under root."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def run_auto(
    daemon: FakeDaemon,
    tmp_path: Path,
    script: str,
    *args: str,
    linger: bool = True,
    extra_env: dict[str, str] | None = None,
    names: Sequence[str] = ("nomodule.f",),
) -> subprocess.CompletedProcess[str]:
    """`python -c script args` with auto-regions of `names` installed (the stand-in packages
    under tmp_path first on its path), as a tenant of `daemon`; without `linger`, one region
    per call, so that they can be counted."""
    env = clean_env(**autoregions.env_for(names, {"PYTHONPATH": str(tmp_path)}))
    env.update(daemon.env(TENANT))
    env.update(extra_env or {})
    if not linger:
        env.update(NO_LINGER)
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("version", ["2.13.0", "2.16.0"])
def test_auto_regions_register_into_inductors_lock_hook(
    daemon: FakeDaemon, tmp_path: Path, version: str
) -> None:
    """Where torch._inductor.runtime.benchmarking has set_gpu_benchmark_lock_context, its
    benchmarks (nested ones too) become one region each once the module is imported, on a
    release krex has not read too; such a release gets one warning naming what is not covered
    there (compiled convolutions' cuDNN searches), a release read where all is covered none."""
    package = tmp_path / "torch" / "_inductor" / "runtime"
    package.mkdir(parents=True)
    for directory in (package, package.parent):
        (directory / "__init__.py").write_text("")
    (tmp_path / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (package / "benchmarking.py").write_text(FAKE_INDUCTOR)
    script = textwrap.dedent("""
        from torch._inductor.runtime.benchmarking import maybe_gpu_benchmark_lock
        with maybe_gpu_benchmark_lock():
            with maybe_gpu_benchmark_lock():
                pass
        print("benchmarked")
        """)
    result = run_auto(daemon, tmp_path, script)
    assert (result.returncode, result.stdout) == (0, "benchmarked\n"), result.stderr
    if version == "2.13.0":
        assert result.stderr == ""
    else:
        assert result.stderr.splitlines() == [
            "krex: auto-regions: on torch 2.16.0 (auto-regions were read from 2.11, 2.12, 2.13,"
            " 2.14, 2.15): cuDNN's searches in torch.compile'd convolutions are in no region"
            " (Inductor's extern kernels were read from torch 2.11, 2.13)"
        ]
    assert daemon.ops() == ["region_begin", "region_end"]
    assert daemon.calls == [{autoregions.INDUCTOR_LABEL: 1}]


FAKE_BENCHMARKING = """
# torch 2.11's benchmarking module, its shape: no lock hook; the benchmarkers' benchmark_gpu.
class Benchmarker:
    def benchmark_gpu(self, _callable, **kwargs):
        raise NotImplementedError


class TritonBenchmarker(Benchmarker):
    def benchmark_gpu(self, _callable, **kwargs):
        _callable()
        return 1.0


class InductorBenchmarker(TritonBenchmarker):
    def benchmark_gpu(self, _callable, estimation_iters=5, memory_warmup_iters=100,
                      benchmark_iters=100, max_benchmark_duration=25, **kwargs):
        _callable()
        return 0.5


benchmarker = InductorBenchmarker()
"""


FAKE_SELECT_ALGORITHM = """
# Where max-autotune times its choices, as its caller of the benchmarker (torch 2.11's
# AlgorithmSelectorCache benchmarks each choice through benchmarker.benchmark_gpu).
from torch._inductor.runtime.benchmarking import benchmarker


def benchmark_choice(*args, **kwargs):
    return benchmarker.benchmark_gpu(*args, **kwargs)
"""


def stand_in_inductor(tmp_path: Path, version: str, **modules: str) -> None:
    """A stand-in torch of `version` under tmp_path whose torch._inductor.runtime holds
    benchmarking.py (torch 2.11's shape) and the other `modules` (name: source), and whose
    torch._inductor.select_algorithm calls the benchmarker as max-autotune does."""
    package = tmp_path / "torch" / "_inductor" / "runtime"
    package.mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    for directory in (package, package.parent):
        (directory / "__init__.py").write_text("")
    (package.parent / "select_algorithm.py").write_text(FAKE_SELECT_ALGORITHM)
    for name, source in {"benchmarking": FAKE_BENCHMARKING, **modules}.items():
        (package / f"{name}.py").write_text(source)


@pytest.mark.parametrize(
    ("version", "covered"), [("2.11.0+cu130", True), ("2.12.1", False), ("2.9.1", False)]
)
def test_without_the_hook_inductors_benchmarkers_are_wrapped_on_torch_2_11(
    daemon: FakeDaemon, tmp_path: Path, version: str, covered: bool
) -> None:
    """torch 2.11 predates the lock hook: each of its benchmarkers' benchmark_gpu calls (one
    per max-autotune choice or Triton config) is a region; on a release the fallback was not
    read from (2.12, read: neither hook nor fallback; 2.9, not read), nothing is patched and
    one warning says so, and what else is not covered there."""
    stand_in_inductor(tmp_path, version)
    script = textwrap.dedent("""
        from torch._inductor.runtime.benchmarking import TritonBenchmarker, benchmarker
        print(benchmarker.benchmark_gpu(lambda: None), TritonBenchmarker().benchmark_gpu(int))
        """)
    result = run_auto(daemon, tmp_path, script, linger=False)  # regions counted
    assert (result.returncode, result.stdout) == (0, "0.5 1.0\n"), result.stderr
    if covered:
        assert result.stderr == ""
        assert daemon.ops() == ["region_begin", "region_end"] * 2
        module = "torch._inductor.runtime.benchmarking"  # each record names what held it
        assert daemon.calls == [
            {f"{module}.InductorBenchmarker.benchmark_gpu": 1},
            {f"{module}.TritonBenchmarker.benchmark_gpu": 1},
        ]
    else:
        assert daemon.ops() == []
        lines = result.stderr.splitlines()
        unread = " (auto-regions were read from 2.11" if version == "2.9.1" else ":"
        assert len(lines) == 1 and f"on torch {version}{unread}" in lines[0], result.stderr
        assert "Inductor's GPU benchmarks are in no region" in lines[0]


FAKE_HEURISTICS = """
# torch 2.11's triton_heuristics, its shape: a CachingAutotuner compiled in a worker has no
# launchers, and its run() compiles (precompile()) before the launch.
import krex.tenant.markers


class CachingAutotuner:
    def __init__(self, fails=False):
        self.launchers, self.fails, self.triton_interpret = [], fails, False

    def precompile(self):
        held = krex.tenant.markers.region_depth() or krex.tenant.markers._state.held is not None
        print("compiled", "holding a region" if held else "outside any region")
        if self.fails:
            raise RuntimeError("No valid triton configs. OutOfResources: shared memory")
        self.launchers = ["launcher"]

    def run(self, *args, stream, benchmark_run=False):
        if not self.launchers:
            self.precompile()
        return "ran"
"""


def test_a_kernel_inductor_compiles_on_its_first_run_compiles_before_the_region(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    """Issue #18 (run 27): a max-autotune choice compiled in a worker compiles again on its
    first run, inside benchmark_gpu. On torch 2.11 that compile runs before the benchmark's
    region, with the thread's lingering region ended first; its error is raised from
    benchmark_gpu as before, with no region taken; a compiled kernel and other callables go
    straight to the region."""
    stand_in_inductor(tmp_path, "2.11.0+cu130", triton_heuristics=FAKE_HEURISTICS)
    script = textwrap.dedent("""
        import functools
        from torch._inductor.select_algorithm import benchmark_choice
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
        kernel, bad = CachingAutotuner(), CachingAutotuner(fails=True)
        benchmark_choice(lambda: None)  # a region, lingering after it
        print(benchmark_choice(functools.partial(kernel.run, 1, stream=0)))
        print(benchmark_choice(_callable=functools.partial(kernel.run, 2, stream=0)))
        probe = lambda: bad.run(stream=0)  # a wrapper that says what it wraps is looked through
        probe.__wrapped__ = functools.partial(bad.run, stream=0)
        try:
            benchmark_choice(probe)
        except RuntimeError as e:
            print("raised:", e)
        """)
    result = run_auto(daemon, tmp_path, script, extra_env={"KREX_REGION_LINGER_S": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "compiled outside any region",
        "0.5",
        "0.5",
        "compiled outside any region",
        "raised: No valid triton configs. OutOfResources: shared memory",
    ]
    # The first region ended for the compile; the second, begun after it, was continued by
    # the compiled kernel's next benchmark and ended for the failing compile.
    assert daemon.ops() == ["region_begin", "region_end"] * 2
    label = "torch._inductor.runtime.benchmarking.InductorBenchmarker.benchmark_gpu"
    assert daemon.calls == [{label: 1}, {label: 2}]
    assert daemon.candidate == [True, True]  # max-autotune's benchmarks time its choices


FAKE_HOOKED_BENCHMARKER = """
class InductorBenchmarker:
    def benchmark_gpu(self, _callable, **kwargs):
        with maybe_gpu_benchmark_lock():
            _callable()
        return 0.5


benchmarker = InductorBenchmarker()
"""


@pytest.mark.parametrize("hook", [False, True], ids=["torch 2.11's benchmarkers", "lock hook"])
def test_a_harness_timing_through_inductors_benchmarker_is_a_timing_not_a_candidate(
    daemon: FakeDaemon, tmp_path: Path, hook: bool
) -> None:
    """Inductor's GPU benchmarks are an autotuner's candidates where Inductor's tuning calls
    them, with a wrapper of the benchmarker between or not; a harness that calls
    `benchmarker.benchmark_gpu` itself to time the number it reports gets a timing's region,
    which the daemon's settle rules see. Without the hook (torch 2.11) and through it."""
    hooked = {"benchmarking": FAKE_INDUCTOR + FAKE_HOOKED_BENCHMARKER} if hook else {}
    stand_in_inductor(tmp_path, "2.11.0+cu130", **hooked)
    script = textwrap.dedent("""
        from torch._inductor.runtime.benchmarking import benchmarker
        from torch._inductor.select_algorithm import benchmark_choice
        benchmark_choice(lambda: None)  # max-autotune's: a candidate
        benchmarker.benchmark_gpu(lambda: None)  # the harness's own timing
        cls = type(benchmarker)
        orig = cls.benchmark_gpu
        def counted(self, fn, **kwargs):  # the harness's wrapper, as autotune_check's counter
            return orig(self, fn, **kwargs)
        cls.benchmark_gpu = counted
        benchmark_choice(lambda: None)
        print(benchmarker.benchmark_gpu(lambda: None))
        """)
    result = run_auto(daemon, tmp_path, script, linger=False)  # regions counted
    assert (result.returncode, result.stdout, result.stderr) == (0, "0.5\n", "")
    assert daemon.ops() == ["region_begin", "region_end"] * 4
    assert daemon.candidate == [True, False, True, False]


# triton 3.6's shape where its autotuner compiles: JITFunction.run(*args, grid, warmup, **kw)
# compiles through _do_compile what it has not compiled (warmup: no launch), and
# Autotuner._bench hands do_bench a call of the kernel, answering a rejected compile with inf.
FAKE_TRITON = {
    "__init__.py": "__version__ = '3.6.0'\nfrom triton import runtime, testing  # noqa: F401\n",
    "runtime/__init__.py": "from triton.runtime import autotuner, jit  # noqa: F401\n",
    "runtime/errors.py": "class PTXASError(Exception):\n    pass\n",
    "runtime/jit.py": """
import krex.tenant.markers
from triton.runtime.errors import PTXASError


def where():
    held = krex.tenant.markers.region_depth() or krex.tenant.markers._state.held is not None
    return "holding a region" if held else "outside any region"


class JITFunction:
    def __init__(self):
        self.cache = {}

    def run(self, *args, grid, warmup, **kwargs):
        key = kwargs["BLOCK"]
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self._do_compile(key, warmup)
        return kernel

    def _do_compile(self, key, warmup):
        print("compiled", key, where())
        if key > 256:
            raise PTXASError("ptxas: too many resources")
        self.cache[key] = f"kernel {key}"
        return self.cache[key]
""",
    "runtime/autotuner.py": """
from triton.runtime.errors import PTXASError


class OutOfResources(Exception):
    pass


class Config:
    def __init__(self, kwargs, pre_hook=None):
        self.kwargs, self.pre_hook = kwargs, pre_hook

    def all_kwargs(self):
        return dict(self.kwargs)


class Autotuner:
    def __init__(self, fn, configs):
        self.fn, self.configs, self.nargs = fn, configs, None

    @property
    def do_bench(self):
        from triton.testing import do_bench
        return do_bench

    def _bench(self, *args, config, **meta):
        current = dict(meta, **config.all_kwargs())

        def kernel_call():
            if config.pre_hook:
                config.pre_hook({**self.nargs, **current})
            self.fn.run(*args, **current)

        try:
            return self.do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8))
        except (OutOfResources, PTXASError):
            return [float("inf")] * 3

    def run(self, *args, **kwargs):
        self.nargs = dict(enumerate(args))
        timings = {c: self._bench(*args, config=c, **kwargs) for c in self.configs}
        best = min(timings, key=lambda c: timings[c])
        print("best", best.kwargs["BLOCK"])
        return self.fn.run(*args, **kwargs, **best.all_kwargs())
""",
    "testing.py": """
from triton.runtime.jit import where


def do_bench(fn, quantiles=None):
    fn()
    print("timed", where())
    return [1.0, 1.0, 1.0]
""",
}


@pytest.mark.parametrize("version", ["3.6.0", "3.9.0", "3.5.1"])
def test_tritons_autotuner_compiles_each_config_before_its_timings_region(
    daemon: FakeDaemon, tmp_path: Path, version: str
) -> None:
    """Issue #18 (run 27: a 4-config autotune held its region 3.2-3.8 s, JIT-compiling): on
    triton 3.6 each configuration is compiled before do_bench's region, the thread's lingering
    region ended first, so the siblings run meanwhile; a config the compiler rejects gets
    _bench's infinite time with no region; compiled configs continue one region. The same on
    3.9 (3.7 to 3.9 read alike). Elsewhere one warning, and the compiles stay in the regions."""
    write_files(
        tmp_path / "triton", {n: t.replace("3.6.0", version) for n, t in FAKE_TRITON.items()}
    )
    script = textwrap.dedent("""
        from triton.runtime.autotuner import Autotuner, Config
        from triton.runtime.jit import JITFunction
        shapes = []
        configs = [Config({"BLOCK": b}, pre_hook=lambda n: shapes.append(n["BLOCK"]))
                   for b in (64, 128, 512)]
        tuner = Autotuner(JITFunction(), configs)
        tuner.run("x", grid=(1,), warmup=False)
        tuner.run("y", grid=(1,), warmup=False)  # a new key: compiled configs timed again
        print("pre_hook", shapes[:2])
        """)
    names = ["triton.testing.do_bench"]
    linger = {"KREX_REGION_LINGER_S": "1"}
    result = run_auto(daemon, tmp_path, script, names=names, extra_env=linger)
    assert result.returncode == 0, result.stderr
    if version == "3.5.1":
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert "on triton 3.5.1 (auto-regions were read from 3.6, 3.7, 3.8, 3.9)" in lines[0]
        assert "autotuner compiles each configuration inside its timing's region" in lines[0]
        assert result.stdout.splitlines()[:2] == [
            "compiled 64 holding a region",
            "timed " + "holding a region",
        ]
        assert daemon.candidate and not any(daemon.candidate)  # not patched: timings' regions
        return
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        "compiled 64 outside any region",
        "timed holding a region",
        "compiled 128 outside any region",  # the 64's lingering region ended for it
        "timed holding a region",
        "compiled 512 outside any region",  # rejected: inf, no region
        "best 64",
        "timed holding a region",
        "timed holding a region",  # compiled already: the same region continued
        "compiled 512 outside any region",
        "best 64",
        "pre_hook [64, 64]",  # the config's pre_hook ran before its compile, as before its call
    ]
    assert daemon.ops() == ["region_begin", "region_end"] * 3
    label = "triton.testing.do_bench"
    assert daemon.calls == [{label: 1}, {label: 1}, {label: 2}]
    assert daemon.candidate == [True] * 3  # each begun by _bench: a candidate's timing


# A stand-in torch of the real one's shape where cuDNN's search is concerned: conv functions on
# torch and torch.nn.functional (the same objects, as in torch), torch.backends.cudnn's flags,
# torch.compiler.is_compiling, autocast queries, and Inductor's extern_kernels namespace that
# torch._inductor.kernel.conv fills with torch.convolution when imported.
FAKE_TORCH = {
    "__init__.py": """
__version__ = "2.11.0"


class Tensor:
    def __init__(self, *shape, cuda=True):
        self.shape, self.is_cuda, self.dtype = shape, cuda, "float16"
        self.device, self.requires_grad = ("cuda:0" if cuda else "cpu"), False

    def stride(self):
        return (1,) * len(self.shape)


def is_autocast_enabled(device_type):
    return False


def get_autocast_dtype(device_type):
    return None


def conv2d(x, w, bias=None, stride=1, padding=0):
    return ("conv2d", x.shape, stride)


def convolution(x, w, *rest):
    return ("convolution", x.shape)


from torch import backends, compiler, nn  # noqa: E402
""",
    "backends/__init__.py": "from torch.backends import cudnn\n",
    "backends/cudnn.py": "benchmark = False\nenabled = True\nallow_tf32 = True\n"
    "deterministic = False\n",
    "compiler/__init__.py": "tracing = False\n\n\ndef is_compiling():\n    return tracing\n",
    "nn/__init__.py": "from torch.nn import functional\n",
    "nn/functional.py": "from torch import conv2d\n",
    "_inductor/__init__.py": "",
    "_inductor/select_algorithm.py": "class KernelNamespace:\n    pass\n\n\n"
    "extern_kernels = KernelNamespace()\n",
    "_inductor/kernel/__init__.py": "",
    "_inductor/kernel/conv.py": "import torch\nfrom torch._inductor.select_algorithm import "
    "extern_kernels\n\nextern_kernels.convolution = torch.convolution\n",
}


@pytest.mark.parametrize(("version", "inductor"), [("2.11.0", True), ("2.9.1", False)])
def test_cudnn_benchmark_search_runs_in_a_region_once_per_configuration(
    daemon: FakeDaemon, tmp_path: Path, version: str, inductor: bool
) -> None:
    """Issue #18: with cudnn.benchmark on, the first convolution of each configuration (where
    cuDNN times its algorithms) is a region, through torch.nn.functional and Inductor's
    extern_kernels; repeats, CPU tensors, benchmark mode off, calls inside a region (a timing
    loop: no key built there) and dynamo's tracing are not; Inductor's (internal) only on the
    torch releases it was read from, else one warning; and
    torch.conv2d itself is left alone (dynamo knows torch's builtins by those attributes)."""
    write_files(
        tmp_path / "torch", {n: t.replace('"2.11.0"', repr(version)) for n, t in FAKE_TORCH.items()}
    )
    script = textwrap.dedent("""
        import sys, torch
        import torch.nn.functional as F
        from krex.tenant.markers import last_region
        def regions():
            return [l for l in open(sys.argv[1]).read().split() if l == "region_begin"]
        x, w = torch.Tensor(8, 64, 56, 56), torch.Tensor(64, 64, 3, 3)
        steps = []
        def step(what, call):
            out = call()
            steps.append(what)
            print(what, out, flush=True)
        step("off", lambda: F.conv2d(x, w))                       # benchmark mode off: none
        torch.backends.cudnn.benchmark = True
        step("first", lambda: F.conv2d(x, w))                     # 1
        step("again", lambda: F.conv2d(x, w))
        step("stride 2", lambda: F.conv2d(x, w, stride=2))        # 2
        step("other shape", lambda: F.conv2d(torch.Tensor(4, 64, 56, 56), w))  # 3
        step("torch.conv2d", lambda: torch.conv2d(x, w))          # not wrapped (dynamo)
        cpu = torch.Tensor(8, 64, 56, 56, cuda=False), torch.Tensor(64, 64, 3, 3, cuda=False)
        step("cpu", lambda: F.conv2d(*cpu))
        torch.backends.cudnn.allow_tf32 = False
        step("no tf32", lambda: F.conv2d(x, w))                   # 4
        torch.compiler.tracing = True
        step("tracing", lambda: F.conv2d(torch.Tensor(2, 3, 4, 4), w))
        torch.compiler.tracing = False
        import krex
        with krex.region():                                       # 5: the explicit one only
            step("in a region", lambda: F.conv2d(torch.Tensor(3, 64, 56, 56), w))
        import torch._inductor.kernel.conv
        from torch._inductor.select_algorithm import extern_kernels
        step("inductor", lambda: extern_kernels.convolution(torch.Tensor(1, 2), w))  # 6
        assert not hasattr(torch.conv2d, "__krex_region__")  # what dynamo knows torch by
        assert not hasattr(torch.convolution, "__krex_region__")
        step("inductor again", lambda: extern_kernels.convolution(torch.Tensor(1, 2), w))
        """)
    result = run_auto(daemon, tmp_path, script, "unused", linger=False)  # regions counted
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "off ('conv2d', (8, 64, 56, 56), 1)"  # the real function's result
    assert lines[-1] == "inductor again ('convolution', (1, 2))"
    # Inductor's extern kernels (internal) only on the releases they were read from.
    assert daemon.ops() == ["region_begin", "region_end"] * (6 if inductor else 5), result.stderr
    search = {"torch.nn.functional.conv2d (cuDNN search)": 1}
    extern = {"torch._inductor.select_algorithm.extern_kernels.convolution (cuDNN search)": 1}
    assert daemon.calls == [search] * 4 + [{"krex.region": 1}] + [extern] * inductor
    assert daemon.candidate == [True] * 4 + [False] + [True] * inductor  # krex.region: a timing
    warned = [line for line in result.stderr.splitlines() if "compile'd convolutions" in line]
    assert len(warned) == (0 if inductor else 1), result.stderr


def test_inductors_subprocess_autotuning_is_in_regions_of_the_child(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    """Inductor's autotune_in_subproc times choices in a child process it starts with the
    command's environment: the child wraps its own benchmarkers, and its regions are its own
    (its pid), the command's tenant's."""
    stand_in_inductor(tmp_path, "2.11.0")
    child = (
        "from torch._inductor.runtime.benchmarking import benchmarker as b; b.benchmark_gpu(int)"
    )
    script = textwrap.dedent(f"""
        import os, subprocess, sys
        p = subprocess.run([sys.executable, "-c", {child!r}], env=dict(os.environ))
        print(p.returncode, os.getpid())
        """)
    result = run_auto(daemon, tmp_path, script)
    assert result.returncode == 0, result.stderr
    status, parent = (int(x) for x in result.stdout.split())
    assert status == 0
    got = daemon.wait_for(2)
    assert [op for op, _, _ in got] == ["region_begin", "region_end"]
    assert {tenant for _, tenant, _ in got} == {TENANT}
    assert parent not in {pid for _, _, pid in got}  # the child's region, not its parent's


# torch.cuda.Event's shape: a Python subclass of a C base, __new__ taking enable_timing.
FAKE_CUDA = """
import time


class _EventBase:
    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls)


class Event(_EventBase):
    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls, enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def record(self, stream=None):
        self.t = time.monotonic()

    def elapsed_time(self, end_event):
        return (end_event.t - self.t) * 1000


capturing = False


def is_current_stream_capturing():
    return capturing
"""


def test_plain_cuda_event_timing_is_a_region(daemon: FakeDaemon, tmp_path: Path) -> None:
    """Issue #18: a timing loop made of CUDA events alone is a region from the first timing
    event's record to elapsed_time: one per trial, or one around a loop; not for events
    without timing, not inside a region already open, not during graph capture; inside the
    region the events record through torch's own method; a region whose events are never read
    ends when the thread makes its next timing event, once it is MAX_S old."""
    (tmp_path / "torch" / "cuda").mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text(
        '__version__ = "2.11.0"\nfrom torch import cuda\n'
    )
    (tmp_path / "torch" / "cuda" / "__init__.py").write_text(FAKE_CUDA)
    script = textwrap.dedent("""
        import time, torch, krex, krex.tenant.events
        from torch.cuda import Event
        Event().record()                                   # no timing: no region
        for _ in range(3):                                 # per trial: 3 regions
            s, e = Event(enable_timing=True), Event(True)
            s.record()
            assert "record" not in vars(e)                 # torch's own inside the region
            e.record(); s.elapsed_time(e)
            assert "record" in vars(e)                     # watched again after it
        s, e = Event(enable_timing=True), Event(enable_timing=True)
        s.record()                                         # a loop timed whole: 1
        for _ in range(5):
            e.record()
        s.elapsed_time(e)
        with krex.region():                                # already in one: just that 1
            s.record(); e.record(); s.elapsed_time(e)
            assert "record" not in vars(Event(enable_timing=True))  # made inside: torch's own
        torch.cuda.capturing = True
        s.record(); e.record()                             # graph capture: none
        torch.cuda.capturing = False
        krex.tenant.events.MAX_S = 0.05                           # never read: ended, then 1 more
        s.record(); time.sleep(0.1)
        f = Event(enable_timing=True)                      # made while it was open
        f.record(); f.elapsed_time(f)
        print("done")
        """)
    result = run_auto(daemon, tmp_path, script, linger=False)  # regions counted
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr
    assert daemon.ops() == ["region_begin", "region_end"] * 7, result.stderr
    timing = {"torch.cuda.Event (timing)": 1}
    assert daemon.calls == [timing] * 4 + [{"krex.region": 1}] + [timing] * 2


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """install() in this process without leaving its finder or names behind."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(autoregions, "_registry", autoregions._Registry())
    yield


BENCHLIB = '''
class Timer:
    def timeit(self, number):
        """Time it."""
        return number

    @staticmethod
    def helper():
        return "static"


def do_bench():
    return "bench"
'''


def test_install_wraps_now_or_on_import_and_only_once(
    fresh_registry: None, inside: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module imported later gets wrapped by the import hook, one imported already at once;
    class methods and staticmethods by dotted path; installing again wraps nothing twice;
    names whose module never comes are ignored."""
    (tmp_path / "benchlib_late.py").write_text(BENCHLIB)
    (tmp_path / "benchlib_early.py").write_text(BENCHLIB)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("benchlib_late", "benchlib_early"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import benchlib_early  # type: ignore[import-not-found]  # written by this test

    names = [
        "benchlib_late.do_bench",
        "benchlib_late.Timer.timeit",
        "benchlib_early.Timer.helper",
        "never_imported_module.run",
    ]
    monkeypatch.setenv("KREX_REGION_LINGER_S", "0")  # one region per call, counted
    markers._environment.cache_clear()
    autoregions.install(names)
    autoregions.install(names)
    import benchlib_late  # type: ignore[import-not-found]  # written by this test

    timer = benchlib_late.Timer()
    assert (timer.timeit(3), benchlib_late.do_bench(), benchlib_early.Timer.helper()) == (
        3,
        "bench",
        "static",
    )
    assert benchlib_late.Timer.timeit.__doc__ == "Time it."
    assert not hasattr(benchlib_late.Timer.timeit.__wrapped__, "__wrapped__")  # wrapped once
    assert inside.wait_for(6) == pairs(3)
    assert benchlib_late.__loader__.__class__.__name__ == "SourceFileLoader"
    assert benchlib_early.do_bench() == "bench"  # not named: not wrapped
    assert len(inside.received) == 6


def test_env_for_puts_the_sitecustomize_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """env_for() names the callables and puts krex/tenant/_auto before the existing PYTHONPATH."""
    env = autoregions.env_for(autoregions.DEFAULT_AUTO_REGIONS, {"PYTHONPATH": "/a:/b"})
    assert env["KREX_AUTO_REGIONS"] == ",".join(autoregions.DEFAULT_AUTO_REGIONS)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(autoregions.AUTO_DIR), "/a", "/b"]
    assert (autoregions.AUTO_DIR / "sitecustomize.py").is_file()
    with pytest.raises(ValueError, match="not a dotted path"):
        autoregions.env_for(["do_bench"])


# A stand-in torch.cuda.tunable of the real one's shape (torch/cuda/tunable.py): TunableOp and
# its tuning switched separately, tuning on by default, each switch returning None.
FAKE_TUNABLE = {
    "__init__.py": "__version__ = '2.11.0'\nfrom torch import cuda\n",
    "cuda/__init__.py": "from torch.cuda import tunable\n",
    "cuda/tunable.py": """
import os
import select
_on = os.environ.get("PYTORCH_TUNABLEOP_ENABLED") == "1"
_tuning = os.environ.get("PYTORCH_TUNABLEOP_TUNING", "1") != "0"


def enable(val=True):
    global _on
    _on = val


def is_enabled():
    return _on


def tuning_enable(val=True):
    global _tuning
    _tuning = val


def tuning_is_enabled():
    return _tuning
""",
}


@pytest.mark.parametrize(
    ("env", "script", "warned"),
    [
        ({"PYTORCH_TUNABLEOP_ENABLED": "1"}, "import torch", True),
        ({"PYTORCH_TUNABLEOP_ENABLED": "1", "PYTORCH_TUNABLEOP_TUNING": "0"}, "import torch", 0),
        ({}, "import torch", False),
        ({}, "import torch\nt = torch.cuda.tunable\nt.enable(True)\nt.enable(True)", True),
        ({}, "import torch\nt = torch.cuda.tunable\nt.tuning_enable(False)\nt.enable()", False),
        ({"PYTORCH_TUNABLEOP_ENABLED": "1"}, "import torch.cuda.tunable as t\nt.enable(1)", True),
    ],
)
def test_a_tuning_tunableop_is_said_once_and_left_alone(
    daemon: FakeDaemon, tmp_path: Path, env: dict[str, str], script: str, warned: int
) -> None:
    """TunableOp times GEMMs inside the op, where no region can go: a process under
    auto-regions whose TunableOp tunes (by its environment or by torch.cuda.tunable's switches)
    gets one line on stderr saying so and how to tune alone; the switches still work, and
    nothing else is touched."""
    write_files(tmp_path / "torch", FAKE_TUNABLE)
    script += "\nimport torch\nprint(torch.cuda.tunable.is_enabled())"
    result = run_auto(daemon, tmp_path, script, extra_env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    if warned:
        assert len(lines) == 1 and "TunableOp is tuning" in lines[0], result.stderr
        assert "PYTORCH_TUNABLEOP_TUNING=0" in lines[0]
    else:
        assert lines == [], result.stderr
    assert daemon.ops() == []


def test_the_gpu_linger_check_tells_a_timing_in_a_candidates_region() -> None:
    """scripts/gpu/linger_check.py (run on the H200): its program compiles, and its verdict
    fails the records of a timing that continued the last configuration's candidate region
    and passes those where the timings had a region of their own."""
    check = load_script("scripts/gpu/linger_check.py")
    compile(check.PROG, "linger_check.PROG", "exec")
    compile(check.PROG_MATMUL, "linger_check.PROG_MATMUL", "exec")
    sibling = check.SIBLING.read_text()  # the autotune check's siblings
    compile(sibling, "sibling_matmul.py", "exec")
    assert "bursty" in sibling
    bench = check.DO_BENCH
    configs = [{"candidate": True, "clean": True, "calls": {bench: 1}} for _ in range(3)]
    before = [*configs, {"candidate": True, "clean": True, "calls": {bench: 3}}]
    after = [*configs, configs[0], {"clean": True, "calls": {bench: 2}}]
    assert not all(check.judge(0, "ok 1.0", before).values())
    assert all(check.judge(0, "ok 1.0", after).values())
    assert not check.judge(1, "", after)["ran"]


# Retakes: a timing whose region is revoked for memory is timed again (docs/memory.md)


@pytest.fixture
def revoking(
    outside: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeDaemon]:
    """This test process is a tenant of a fake daemon that revokes, for memory, the first
    region begun with `retake`."""
    with FakeDaemon(tmp_path / "krex.sock", revoke=1) as d:
        for name, value in d.env(TENANT).items():
            monkeypatch.setenv(name, value)
        markers._environment.cache_clear()
        yield d


def told() -> None:
    """Wait until this thread's region has the daemon's unasked line (the fake sends it right
    after the grant; a loaded machine may deliver it later than the call would return)."""
    held = markers._state.held
    assert held is not None
    until(lambda: bool(select.select([held.conn], [], [], 0)[0]), 10, "the revoked event")


def test_a_timing_whose_region_is_revoked_for_memory_is_timed_again_in_a_new_region(
    revoking: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #47: a timer's region revoked because its owner waited for memory its frozen
    siblings held (on an H100, 3 of 8 commands' first calls, each then run again from the
    start) is timed again, once, in a new region that says `retaken`; the call's result is the
    second one's and the last record is the new region's."""
    linger(monkeypatch, "0")
    calls: list[int] = []

    def bench() -> int:
        calls.append(1)
        if len(calls) == 1:
            told()
        return len(calls)

    timed = markers.auto_region("triton.testing.do_bench", retakes=True)(bench)
    assert timed() == 2
    assert revoking.retakes == [(True, False), (False, True)]
    assert revoking.ops() == ["region_begin", "region_end"] * 2
    record = last_region() or {}
    assert record["clean"] and not record["revoked"], record
    assert timed() == 3  # the next call: one region, nothing to retake
    assert revoking.retakes[-1] == (True, False) and len(revoking.retakes) == 3


def test_a_call_that_is_not_a_known_timer_is_neither_retaken_nor_asks_to_be(
    revoking: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A region() or an auto-region of a callable the user named may do more than time: its
    region_begin does not ask for a retake (the daemon preempts and reruns the command
    instead), and its call is made once."""
    linger(monkeypatch, "0")
    calls: list[int] = []
    markers.auto_region("mylib.bench")(lambda: calls.append(1))()
    with region():
        calls.append(1)
    assert calls == [1, 1]
    assert revoking.retakes == [(False, False), (False, False)]


def test_a_lingering_region_revoked_meanwhile_is_not_continued(
    revoking: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next timing does not continue a lingering region the daemon revoked (it would run
    unprotected): that region is ended (its reply read past the event) and a new one begun."""
    linger(monkeypatch, "1")
    timer = markers.auto_region("triton.testing.do_bench", retakes=True)
    with timer:
        told()
    assert revoking.ops() == ["region_begin"]
    with timer:
        pass
    assert revoking.ops() == ["region_begin", "region_end", "region_begin"]
    markers.flush()
    record = last_region() or {}
    assert record["clean"], record
