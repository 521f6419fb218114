"""Tenant groups on this machine's real freezers: freeze, thaw, pin, destroy, recover.

Each freezer kind runs the same tests: cgroup-v1 (the v1 freezer and cpuset hierarchies),
cgroup-v2 (at /sys/fs/cgroup, or the hybrid /sys/fs/cgroup/unified mount when that is where a
writable cgroup2 hierarchy is) and signal. The cgroup kinds need root and skip without it.
Workloads are Python processes that count loop iterations into a shared file, so "frozen" is
checked as "made no progress", not only as what the kernel reports. Every test uses its own
group root and the fixture thaws, kills and removes everything afterwards, even on failure.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import blocked_tasks, until

from krex.core import tenants
from krex.core.slices import parse_cpu_list
from krex.core.tenants import FreezerKind, TenantGroup, TenantsError, detect_freezer, recover

_serial = itertools.count()

# argv: marker file (64 bytes, mapped), the test's pid, mode. Slot 0 is the process itself,
# slot 1 its child in "fork" mode (forked when a line arrives on stdin, before either counts)
# and in "later" mode (the same, but the process counts from the start); a slot holds the
# process's pid and its iteration count. Burners exit on their own once the test is gone.
BURNER = r"""
import mmap, os, select, struct, sys
m = mmap.mmap(os.open(sys.argv[1], os.O_RDWR), 64)
watch = int(sys.argv[2])
later = sys.argv[3] == "later"
slot = 0
if sys.argv[3] == "fork":
    sys.stdin.readline()
    if os.fork() == 0:
        slot = 1
struct.pack_into("Q", m, slot * 16, os.getpid())
i = 0
while True:
    i += 1
    struct.pack_into("Q", m, slot * 16 + 8, i)
    if i % 100000 == 0:
        try:
            os.kill(watch, 0)
        except ProcessLookupError:
            os._exit(0)
        if later and select.select([0], [], [], 0)[0]:
            later = False
            if os.fork() == 0:
                slot = 1
                struct.pack_into("Q", m, 16, os.getpid())
"""

# Four threads; prints "ready", then on a line on stdin forks a child (itself with two threads)
# and prints its pid; exits (killing the child) on the next line or EOF.
THREADS = r"""
import os, sys, threading, time
def idle():
    while True:
        time.sleep(0.05)
for _ in range(3):
    threading.Thread(target=idle, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
parent = os.getpid()
pid = os.fork()
if pid == 0:
    threading.Thread(target=idle, daemon=True).start()
    while os.getppid() == parent:
        time.sleep(0.05)
    os._exit(0)
print(pid, flush=True)
sys.stdin.readline()
os.kill(pid, 9)
os._exit(0)
"""


class Proc:
    """A test workload: a Python process started from one of the scripts above."""

    def __init__(self, tmp: Path, script: str, mode: str = "plain") -> None:
        self.marker = tmp / f"proc-{next(_serial)}"
        self.marker.write_bytes(bytes(64))
        fd = os.open(self.marker, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 64)
        finally:
            os.close(fd)
        self.popen = subprocess.Popen(
            [sys.executable, "-c", script, str(self.marker), str(os.getpid()), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.pid = self.popen.pid
        self.extra: list[int] = []  # other processes of it (children), to kill afterwards
        self._buf = b""

    def send(self) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(b"\n")
        self.popen.stdin.flush()

    def line(self, timeout_s: float = 10.0) -> str:
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            assert left > 0, "the workload did not answer in time"
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                assert chunk, "the workload exited"
                self._buf += chunk
        out, _, self._buf = self._buf.partition(b"\n")
        return out.decode()

    def counts(self) -> tuple[int, int]:
        """Iterations so far of slot 0 (the process) and slot 1 (its forked child)."""
        return struct.unpack_from("Q", self._map, 8)[0], struct.unpack_from("Q", self._map, 24)[0]

    def child_pid(self) -> int:
        pid: int = struct.unpack_from("Q", self._map, 16)[0]
        return pid

    def kill(self) -> bool:
        """Kill it and its children (stopped ones too); False if it would not die."""
        for pid in [*self.extra, self.child_pid(), self.pid]:
            # Only a process that is still ours: its command line names our marker file.
            with contextlib.suppress(OSError):
                if str(self.marker).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        self.popen.kill()
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                f.close()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return True


def wait_for(cond: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    until(cond, timeout_s, what or "the condition", every_s=0.01)


def proc_state(pid: int) -> str:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return data[data.rfind(b")") + 2 :].split()[0].decode()


def start_time(pid: int) -> int:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return int(data[data.rfind(b")") + 2 :].split()[19])


def thread_cpus(pid: int) -> dict[int, set[int]]:
    """Cpus_allowed_list of every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(tid)] = parse_cpu_list(line.split(":", 1)[1])
    return out


def assert_stalled(p: Proc, slots: tuple[int, ...] = (0,), window_s: float = 0.5) -> None:
    before = p.counts()
    time.sleep(window_s)
    after = p.counts()
    for s in slots:
        assert after[s] == before[s], f"slot {s} ran while frozen: {before[s]} -> {after[s]}"


def stalls(p: Proc, window_s: float = 0.3) -> bool:
    """Whether p's first slot did not move over window_s."""
    before = p.counts()[0]
    time.sleep(window_s)
    return p.counts()[0] == before


def assert_progress(p: Proc, slots: tuple[int, ...] = (0,)) -> None:
    before = p.counts()
    wait_for(lambda: all(p.counts()[s] > before[s] for s in slots), what="progress")


def cgroup_mounts() -> list[str]:
    """Every cgroup (v1 or v2) mount point: where a test's groups could be left behind."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        f = line.split()
        if len(f) >= 3 and f[2] in ("cgroup", "cgroup2"):
            out.append(f[1])
    return out


def leftover_groups(root: str) -> list[str]:
    return [p for m in cgroup_mounts() if os.path.isdir(p := os.path.join(m, root))]


def thaw_groups(root: str) -> None:
    """Last-resort thaw of every group under `root`, written directly to the cgroup files."""
    for mount in cgroup_mounts():
        for d, _, _ in os.walk(os.path.join(mount, root)):
            for name, text in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                with contextlib.suppress(OSError):
                    Path(d, name).write_text(text)


def remove_groups(root: str) -> None:
    """Last-resort clean-up: move every process out to the hierarchy root, remove the dirs."""
    for mount in cgroup_mounts():
        top = os.path.join(mount, root)
        if not os.path.isdir(top):
            continue
        for d, _, _ in os.walk(top, topdown=False):
            for _ in range(200):
                for pid in Path(d, "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        Path(mount, "cgroup.procs").write_text(pid)
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


class Env:
    """One test's group root, and everything it made there."""

    def __init__(self, tmp: Path, kind: FreezerKind) -> None:
        self.tmp = tmp
        self.kind = kind
        self.root = f"krex-test-{os.getpid()}-{next(_serial)}"
        self.groups: list[TenantGroup] = []
        self.procs: list[Proc] = []

    def group(self, tenant: int = 1, *, keep: bool = True) -> TenantGroup:
        """A group of this test's kind; `keep=False` leaves it out of clean-up (a crash)."""
        g = TenantGroup.create(self.kind, self.root, tenant)
        if keep:
            self.groups.append(g)
        return g

    def burner(self, mode: str = "plain") -> Proc:
        p = Proc(self.tmp, BURNER, mode)
        self.procs.append(p)
        return p

    def threads(self) -> Proc:
        p = Proc(self.tmp, THREADS)
        self.procs.append(p)
        return p

    def cleanup(self) -> None:
        """Thaw, kill and remove everything, also when the code under test is what failed."""
        for g in self.groups:
            with contextlib.suppress(Exception):
                g.thaw()
        with contextlib.suppress(Exception):
            recover(self.root)  # groups dropped on purpose, and the signal freezer's record
        thaw_groups(self.root)  # without relying on the code under test
        problems = []
        for p in self.procs:
            if not p.kill():
                problems.append(f"process {p.pid} did not die")
        for g in self.groups:
            try:
                g.destroy()
            except TenantsError as e:
                problems.append(str(e))
        left = leftover_groups(self.root)
        remove_groups(self.root)
        assert not problems, problems
        assert not left, f"groups left behind: {left}"


def _v2_mount(monkeypatch: pytest.MonkeyPatch) -> FreezerKind | None:
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        monkeypatch.setattr(tenants, "V2_MOUNT", mount)
        with contextlib.suppress(TenantsError):
            return detect_freezer("cgroup-v2")
    return None


def _kind(name: str, monkeypatch: pytest.MonkeyPatch) -> FreezerKind:
    """The freezer kind `name` if this machine has it; skips the test when it does not."""
    if name == "cgroup-v1":
        try:
            return detect_freezer("cgroup-v1")
        except TenantsError as e:
            pytest.skip(f"needs root and a writable cgroup v1 freezer: {e}")
    if name == "cgroup-v2":
        found = _v2_mount(monkeypatch)
        if found is None:
            pytest.skip("needs root and a writable cgroup2 hierarchy with cgroup.freeze")
        return found
    return FreezerKind.SIGNAL


def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[Env]:
    kind = _kind(name, monkeypatch)
    # The signal freezer's record goes to a directory of this test's own.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    e = Env(tmp_path, kind)
    try:
        yield e
    finally:
        e.cleanup()


@pytest.fixture(params=["cgroup-v1", "cgroup-v2", "signal"])
def env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    """A test's group root, for each freezer kind this machine has."""
    yield from _env(tmp_path, monkeypatch, request.param)


@pytest.fixture(params=["cgroup-v1", "cgroup-v2"])
def cgroup_env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    """A test's group root, for each cgroup freezer kind this machine has."""
    yield from _env(tmp_path, monkeypatch, request.param)


@pytest.fixture
def signal_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """A test's group root for the signal freezer."""
    yield from _env(tmp_path, monkeypatch, "signal")


# --- detection ---------------------------------------------------------------------------------


def test_detect_freezer_picks_cgroup_v1_here() -> None:
    """On this machine (cgroup v1 freezer writable, /sys/fs/cgroup not cgroup2) auto is v1."""
    lines = Path("/proc/self/mounts").read_text().splitlines()
    mounts = {line.split()[1]: line.split()[2] for line in lines}
    if mounts.get("/sys/fs/cgroup") == "cgroup2":
        pytest.skip("a cgroup-v2 host: auto picks cgroup-v2 there")
    try:
        detect_freezer("cgroup-v1")
    except TenantsError as e:
        pytest.skip(f"needs root and a writable cgroup v1 freezer: {e}")
    assert detect_freezer() is FreezerKind.CGROUP_V1
    assert detect_freezer("auto") is FreezerKind.CGROUP_V1


def test_detect_freezer_explicit_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """signal always works; an unusable cgroup kind or an unknown name says why it cannot."""
    assert detect_freezer("signal") is FreezerKind.SIGNAL
    assert detect_freezer(FreezerKind.SIGNAL) is FreezerKind.SIGNAL
    monkeypatch.setattr(tenants, "V2_MOUNT", str(tmp_path))
    monkeypatch.setattr(tenants, "V1_FREEZER", str(tmp_path))
    with pytest.raises(TenantsError, match=r"cgroup-v2 freezer cannot be used: .* not a cgroup2"):
        detect_freezer("cgroup-v2")
    with pytest.raises(TenantsError, match="cgroup-v1 freezer cannot be used: no cgroup v1"):
        detect_freezer("cgroup-v1")
    with pytest.raises(TenantsError, match="Unknown freezer 'cgroup'"):
        detect_freezer("cgroup")
    monkeypatch.setattr(tenants, "V1_CPUSET", str(tmp_path))
    assert detect_freezer("auto") is FreezerKind.SIGNAL


# --- freezing ----------------------------------------------------------------------------------


def test_freeze_stops_progress_and_thaw_resumes(env: Env) -> None:
    """A CPU-bound member makes no progress at all while frozen, and runs again after thaw."""
    g = env.group()
    p = env.burner()
    g.add(p.pid)
    assert g.pids() == [p.pid]
    wait_for(lambda: p.counts()[0] > 0, what="the burner to start")
    assert g.freeze(5.0)
    assert_stalled(p)
    g.thaw()
    assert_progress(p)
    g.thaw()  # idempotent
    assert_progress(p)


def test_children_forked_after_add_are_frozen(env: Env) -> None:
    """A child forked after add() is a member: listed by pids(), frozen and thawed with it."""
    g = env.group()
    p = env.burner("fork")
    g.add(p.pid)
    p.send()  # only now does it fork
    wait_for(lambda: p.counts()[1] > 0, what="the forked child to start")
    child = p.child_pid()
    assert sorted(g.pids()) == sorted([p.pid, child])
    assert g.freeze(5.0)
    assert_stalled(p, (0, 1))
    if env.kind is FreezerKind.SIGNAL:
        assert proc_state(p.pid) == "T" and proc_state(child) == "T"
    g.thaw()
    assert_progress(p, (0, 1))


def test_joining_a_frozen_group_freezes_the_newcomer(env: Env) -> None:
    """A process added while the group is frozen stops too, and thaws with the group."""
    g = env.group()
    first, second = env.burner(), env.burner()
    g.add(first.pid)
    assert g.freeze(5.0)
    wait_for(lambda: second.counts()[0] > 0, what="the second burner to start")
    g.add(second.pid)  # no further freeze(): joining is enough
    # It stops once the kernel next gets to it (a loaded machine ran it for a while first).
    wait_for(lambda: stalls(second), 10, "the newcomer to stop")
    assert_stalled(second)
    g.thaw()
    assert_progress(second)
    assert_progress(first)


def test_freeze_time_out_returns_false_and_thaw_undoes_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When members never report frozen, freeze() gives up in time with False; thaw() undoes."""
    g = env.group()
    never = lambda *args: False  # noqa: E731
    if env.kind is FreezerKind.SIGNAL:
        monkeypatch.setattr(tenants, "_fully_stopped", never)
    else:
        monkeypatch.setattr(type(g), "_is_frozen", never)
    p = env.burner()
    g.add(p.pid)
    wait_for(lambda: p.counts()[0] > 0, what="the burner to start")
    t0 = time.monotonic()
    assert g.freeze(0.2) is False
    assert time.monotonic() - t0 < 20  # it gave up, and not never
    assert_stalled(p)  # frozen as far as possible
    if env.kind is FreezerKind.SIGNAL:
        assert tenants._state_path(env.root).exists()
    g.thaw()
    assert_progress(p)
    assert not tenants._state_path(env.root).exists()


def test_signal_record_lists_stopped_processes(signal_env: Env) -> None:
    """The signal freezer writes pid and start time of what it stops, and removes the file."""
    env = signal_env
    g = env.group()
    p = env.burner("fork")
    g.add(p.pid)
    p.send()
    wait_for(lambda: p.counts()[1] > 0, what="the forked child to start")
    assert g.freeze(5.0)
    path = tenants._state_path(env.root)
    assert path == Path(os.environ["XDG_RUNTIME_DIR"]) / "krex" / f"{env.root}.stopped"
    lines = sorted(path.read_text().splitlines())
    child = p.child_pid()
    assert lines == sorted(f"{q} {start_time(q)}" for q in (p.pid, child))
    g.thaw()
    assert not path.exists()


def split_dir(env: Env) -> str:
    """Where a cgroup group of tenant 1 puts what it freezes beside processes left awake."""
    mount = tenants.V1_FREEZER if env.kind is FreezerKind.CGROUP_V1 else tenants.V2_MOUNT
    return os.path.join(mount, env.root, "t1", tenants.SPLIT_NAME)


def test_freeze_leaves_the_awake_running(env: Env) -> None:
    """freeze() with a process awake: it and what it forks since keep running, the other
    stops; pids() lists all; thaw resumes; a later freeze with none awake stops all; destroy()
    removes the split group too."""
    g = env.group()
    frozen, awake = env.burner(), env.burner("later")
    g.add(frozen.pid)
    g.add(awake.pid)
    wait_for(lambda: frozen.counts()[0] > 0, what="the first burner to start")
    wait_for(lambda: awake.counts()[0] > 0, what="the second burner to start")
    assert g.freeze(5.0, awake={awake.pid})
    assert g.awake() == [awake.pid]
    assert g.pids() == sorted([frozen.pid, awake.pid])
    assert_stalled(frozen)
    assert_progress(awake)
    awake.send()  # it forks now, while the other is frozen: the child runs
    wait_for(lambda: awake.counts()[1] > 0, what="the awake one's child to start")
    assert_progress(awake, (0, 1))
    assert_stalled(frozen)
    everyone = sorted([frozen.pid, awake.pid, awake.child_pid()])
    assert g.pids() == everyone
    g.thaw()
    assert g.awake() == []
    assert_progress(frozen)
    assert g.freeze(5.0)  # all of them, wherever the split left them
    assert g.awake() == []
    assert_stalled(frozen)
    assert_stalled(awake, (0, 1))
    g.thaw()
    assert_progress(awake, (0, 1))
    assert g.pids() == everyone
    if env.kind is not FreezerKind.SIGNAL:
        assert os.path.isdir(split_dir(env))
        g.destroy()
        assert not os.path.exists(split_dir(env))


def test_freeze_falls_back_to_the_whole_group(
    cgroup_env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the processes cannot be split (a move fails), all are frozen, with one log line."""
    env = cgroup_env
    g = env.group()
    frozen, awake = env.burner(), env.burner()
    g.add(frozen.pid)
    g.add(awake.pid)
    wait_for(lambda: awake.counts()[0] > 0, what="the burner to start")

    def fail(group: str, pid: int) -> None:
        raise TenantsError(f"Cannot move {pid} into {group}.")

    monkeypatch.setattr(tenants, "_move", fail)
    assert g.freeze(5.0, awake={awake.pid})
    assert g.awake() == []
    assert_stalled(frozen)
    assert_stalled(awake)
    assert [r.getMessage() for r in caplog.records if "freezing all" in r.getMessage()]
    g.thaw()
    assert_progress(awake)
    assert_progress(frozen)


# --- membership --------------------------------------------------------------------------------


def test_add_refuses_the_controller_and_non_processes(env: Env) -> None:
    """The caller, its parent, pid 0 and a pid that cannot exist are refused, nothing joins."""
    g = env.group()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid, message in [
        (os.getpid(), "controller"),
        (os.getppid(), "controller"),
        (0, "not a process id"),
        (pid_max, "does not exist"),
    ]:
        with pytest.raises(TenantsError, match=message):
            g.add(pid)
    assert g.pids() == []
    assert g.freeze(1.0)  # an empty group freezes at once, and we were not in it
    g.thaw()


# A controller that someone moved into the group it is about to freeze.
SELF_IN_GROUP = r"""
import os, sys
from krex.core import tenants
tenants.V2_MOUNT = sys.argv[3]
g = tenants.TenantGroup.create(sys.argv[1], sys.argv[2], 1)
with open(os.path.join(g._freeze_dir, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
assert g.pids() == [os.getpid()]
print(g.freeze(5.0), g.pids(), flush=True)
g.destroy()
"""


def test_freeze_never_freezes_the_controller(cgroup_env: Env) -> None:
    """A controller found inside the group it freezes steps out first instead of freezing
    itself (run in a child process, which the test thaws and fails if it does freeze)."""
    env = cgroup_env
    child = subprocess.Popen(
        [sys.executable, "-c", SELF_IN_GROUP, env.kind.value, env.root, tenants.V2_MOUNT],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out, _ = child.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        recover(env.root)
        child.kill()
        child.communicate()
        pytest.fail("the controller froze itself")
    assert child.returncode == 0
    assert out.split() == ["True", "[]"]


def test_exited_members_are_not_errors(env: Env) -> None:
    """A member that exits disappears from pids(); freeze, pin and thaw go on without error."""
    g = env.group()
    p = subprocess.Popen(["sleep", "0.3"])
    try:
        g.add(p.pid)
    finally:
        p.wait(timeout=10)
    wait_for(lambda: g.pids() == [], what="the exited member to leave")
    assert g.freeze(1.0)
    g.pin(set(os.sched_getaffinity(0)))
    g.thaw()


def test_create_refuses_bad_names() -> None:
    """A root must be a plain name (no path), a tenant id is not negative, a kind is concrete."""
    for root in ("", "a/b", "..", "."):
        with pytest.raises(TenantsError, match="not a usable group root name"):
            TenantGroup.create(FreezerKind.SIGNAL, root, 1)
    with pytest.raises(TenantsError, match="not a tenant id"):
        TenantGroup.create(FreezerKind.SIGNAL, "krex", -1)
    with pytest.raises(TenantsError, match="Unknown freezer 'auto'"):
        TenantGroup.create("auto", "krex", 1)  # type: ignore[arg-type]


def test_create_refuses_a_group_someone_else_can_change(cgroup_env: Env) -> None:
    """Issue #16: a tenant's cgroup that another uid made, or whose control files another uid
    can write, is refused with one error naming it, never taken up (its owner could thaw the
    group mid-region or move processes out of it); a group of ours is reused as before."""
    env = cgroup_env
    mount = tenants.V2_MOUNT if env.kind is FreezerKind.CGROUP_V2 else tenants.V1_FREEZER
    top = os.path.join(mount, env.root)
    os.mkdir(top)
    planted = os.path.join(top, "t1")
    os.mkdir(planted)
    os.chown(planted, 65534, 65534)  # nobody's
    with pytest.raises(TenantsError, match=rf"Refusing the cgroup {planted}: owned by uid 65534"):
        TenantGroup.create(env.kind, env.root, 1)
    os.chown(planted, 0, 0)
    os.chmod(os.path.join(planted, "cgroup.procs"), 0o666)
    with pytest.raises(TenantsError, match=r"its cgroup.procs is owned by uid 0 with mode 666"):
        TenantGroup.create(env.kind, env.root, 1)
    os.chmod(os.path.join(planted, "cgroup.procs"), 0o644)
    os.chmod(top, 0o777)  # the root group: anyone could make groups in it
    with pytest.raises(TenantsError, match=rf"Refusing the cgroup {top}: .* mode 777"):
        TenantGroup.create(env.kind, env.root, 2)
    os.chmod(top, 0o755)
    g = env.group(1)  # now ours again: reused
    p = env.burner()
    g.add(p.pid)
    assert g.pids() == [p.pid]


# --- pinning -----------------------------------------------------------------------------------


def test_pin_moves_every_thread_and_later_children(env: Env) -> None:
    """pin() moves every thread of every member; a child forked later starts on the same CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    g = env.group()
    if env.kind is FreezerKind.CGROUP_V1 and os.path.exists(
        os.path.join(tenants.V1_CPUSET, "cpuset.cpus")
    ):
        assert g.pin_method == "cpuset"
    p = env.threads()
    assert p.line() == "ready"
    g.add(p.pid)
    g.pin({cpus[-1]})
    seen = thread_cpus(p.pid)
    assert len(seen) >= 4
    assert all(c == {cpus[-1]} for c in seen.values()), seen
    p.send()
    child = int(p.line())
    p.extra.append(child)
    wait_for(lambda: len(thread_cpus(child)) >= 2, what="the child's thread")
    assert all(c == {cpus[-1]} for c in thread_cpus(child).values())
    g.pin({cpus[0]})
    for pid in (p.pid, child):
        assert all(c == {cpus[0]} for c in thread_cpus(pid).values()), thread_cpus(pid)
    g.pin(set(cpus))
    assert all(c == set(cpus) for c in thread_cpus(p.pid).values())
    with pytest.raises(TenantsError, match="non-empty set of CPUs"):
        g.pin(set())


# --- destroy and recover -----------------------------------------------------------------------


def test_destroy_leaves_no_cgroup_directory(cgroup_env: Env) -> None:
    """destroy() of a frozen group with a member thaws it, hands it back and removes the dirs."""
    env = cgroup_env
    g = env.group()
    other = env.group(2)
    p = env.burner()
    g.add(p.pid)
    assert g.freeze(5.0)
    g.destroy()
    assert_progress(p)  # thawed and alive
    assert not [d for d in leftover_groups(env.root) if os.path.isdir(os.path.join(d, "t1"))]
    own = Path(f"/proc/{p.pid}/cgroup").read_text()
    assert env.root not in own
    assert leftover_groups(env.root)  # the root stays while tenant 2 is there
    other.destroy()
    assert leftover_groups(env.root) == []
    g.destroy()  # idempotent
    g.thaw()


def test_recover_thaws_a_group_left_frozen(cgroup_env: Env) -> None:
    """After a crash (group frozen, object dropped) recover() thaws it and counts it."""
    env = cgroup_env
    g = env.group(keep=False)
    p = env.burner()
    g.add(p.pid)
    wait_for(lambda: p.counts()[0] > 0, what="the burner to start")
    assert g.freeze(5.0)
    del g
    assert_stalled(p, window_s=0.2)
    assert recover(env.root) == 1
    assert_progress(p)
    assert recover(env.root) == 0  # nothing frozen any more
    # The restarted controller can take the group up again (create reuses it) and remove it.
    again = TenantGroup.create(env.kind, env.root, 1)
    assert again.pids() == [p.pid]
    again.destroy()


def test_recover_continues_recorded_processes_but_not_recycled_pids(signal_env: Env) -> None:
    """recover() sends SIGCONT to what the signal freezer stopped, but not to a pid whose start
    time differs from the record (a recycled pid), and removes the record."""
    env = signal_env
    g = env.group(keep=False)
    stopped = env.burner()
    g.add(stopped.pid)
    assert g.freeze(5.0)
    del g
    stranger = env.burner()
    wait_for(lambda: stranger.counts()[0] > 0, what="the other burner to start")
    os.kill(stranger.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: proc_state(stranger.pid) == "T", what="the stranger to stop")
        path = tenants._state_path(env.root)
        with path.open("a") as f:
            f.write(f"{stranger.pid} {start_time(stranger.pid) + 1}\n")
        assert recover(env.root) == 0  # no cgroup involved
        assert_progress(stopped)
        assert not path.exists()
        time.sleep(0.2)
        assert proc_state(stranger.pid) == "T"
    finally:
        os.kill(stranger.pid, signal.SIGCONT)


def test_recover_without_hierarchies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """recover() of a root with no hierarchy, group or record does nothing and does not raise."""
    for name in ("V2_MOUNT", "V1_FREEZER", "V1_CPUSET"):
        monkeypatch.setattr(tenants, name, str(tmp_path / "none"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert recover("krex-nothing-here") == 0


def test_prune_removes_only_empty_groups_of_unknown_tenants() -> None:
    """Groups a predecessor left (its tenants since finished) go; ours and busy ones stay."""
    from krex.core.tenants import prune

    kind = detect_freezer("auto")
    if kind is FreezerKind.SIGNAL:
        pytest.skip("no cgroup freezer here")
    root = f"krex-prune-{os.getpid()}"
    mine, stale, busy = (TenantGroup.create(kind, root, i) for i in (1, 2, 3))
    p = subprocess.Popen(["sleep", "30"])
    try:
        busy.add(p.pid)
        assert prune(root, keep={1}) == len(mine._groups)  # type: ignore[attr-defined]
        assert not any(os.path.isdir(g) for _, g in stale._groups)  # type: ignore[attr-defined]
        assert all(os.path.isdir(g) for _, g in mine._groups)  # type: ignore[attr-defined]
        assert all(os.path.isdir(g) for _, g in busy._groups)  # type: ignore[attr-defined]
    finally:
        p.kill()
        p.wait()
        for g in (mine, busy, stale):
            with contextlib.suppress(Exception):
                g.destroy()


@pytest.fixture
def v1_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """A test's group root under the cgroup v1 freezer (skipped where there is none)."""
    yield from _env(tmp_path, monkeypatch, "cgroup-v1")


def test_a_frozen_member_is_among_the_blocked_tasks_named_for_a_stuck_exit(v1_env: Env) -> None:
    """tests/helpers.blocked_tasks (what a SIGKILLed tenant that will not die is reported with)
    names a task the cgroup v1 freezer holds: it sleeps uninterruptibly, D in /proc (v2's
    freezer traps its tasks interruptibly, S)."""
    g = v1_env.group()
    p = v1_env.burner()
    g.add(p.pid)
    assert g.freeze(5.0)
    try:
        assert f"{p.pid} " in blocked_tasks(limit=10_000)
    finally:
        g.thaw()
    wait_for(lambda: f"{p.pid} " not in blocked_tasks(limit=10_000), what="the thaw")
