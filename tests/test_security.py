"""Attacks and faults of docs/security.md, each shown to fail safe: another local user's
runtime directory, listener, segment; a daemon's environment; two daemons on one segment.

Tests that need a second uid run it as `nobody` (65534) and need root to switch to it; they are
skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Node, remove_shm, unique
from helpers import (
    HOLDER,
    KREX,
    Counter,
    Daemon,
    assert_slotted_once_listed,
    configured,
    krex_run,
)

from krex.core.paths import shim_library
from krex.core.trust import TrustError, _private_group, check_env, private_dir, runtime_dir
from krex.tenant.autoregions import AUTO_DIR

NOBODY = 65534
# The second uid runs a system interpreter (the test's may live where it cannot go, e.g. /root).
SYSTEM_PYTHON = next(
    (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), None
)
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or SYSTEM_PYTHON is None,
    reason="a second uid needs root to switch to it and a system python3 it can run",
)


def as_nobody(code: str) -> subprocess.Popen[str]:
    """Run Python code as uid/gid 65534 (it prints 'ready' when set up)."""

    def drop() -> None:
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.Popen(
        [str(SYSTEM_PYTHON), "-c", textwrap.dedent(code)],
        preexec_fn=drop,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory under /tmp that another uid can use (pytest's tmp_path is ours alone)."""
    d = Path(tempfile.mkdtemp(prefix="krex-sec-", dir="/tmp"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@as_root
def test_a_runtime_directory_someone_else_made_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 1: another user creates our runtime directory first (world-writable): krex uses a
    private one in our home instead, 0700 and ours."""
    xdg, home = tmp_path / "xdg", tmp_path / "home"
    (xdg / "krex").mkdir(parents=True)
    os.chown(xdg / "krex", NOBODY, NOBODY)
    (xdg / "krex").chmod(0o777)
    home.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.setenv("HOME", str(home))
    got = runtime_dir()
    assert got == home / ".krex" / "run"
    st = got.stat()
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700


def test_a_runtime_directory_that_is_a_symlink_or_open_to_others_is_refused(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(TrustError, match="symlink"):
        private_dir(tmp_path / "link")
    real.chmod(0o755)
    with pytest.raises(TrustError, match="open to others"):
        private_dir(real)
    made = private_dir(tmp_path / "new" / "krex")
    assert made.stat().st_mode & 0o777 == 0o700


FAKE_DAEMON = """
    import json, os, socket, sys
    path = sys.argv[1]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o777)
    s.listen(4)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        f = c.makefile("rwb")
        f.readline()
        env = {"LD_PRELOAD": "/tmp/evil.so", "KREX_TENANT": "1"}
        f.write((json.dumps({"ok": True, "v": 1, "tenant": 1, "gpu": 0, "gpus": [0],
                             "env": env}) + "\\n").encode())
        f.flush()
"""


@as_root
def test_a_listener_of_another_uid_is_never_taken_for_the_daemon(shared_tmp: Path) -> None:
    """Case 1: another user listens where our daemon's socket would be and answers `admit`
    with an LD_PRELOAD of theirs: `krex run` refuses it (SO_PEERCRED) and runs nothing."""
    sock = shared_tmp / "krex.sock"
    fake = as_nobody(FAKE_DAEMON.replace("sys.argv[1]", repr(str(sock))))
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        marker = shared_tmp / "ran"
        p = subprocess.run(
            [*KREX, "run", "--sim", "--socket", str(sock), "--", "touch", str(marker)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        fake.kill()
        fake.wait()
    assert p.returncode == 125, p.stderr
    assert f"runs as uid {NOBODY}" in p.stderr and "refusing it" in p.stderr
    assert "Traceback" not in p.stderr
    assert not marker.exists()


def test_the_environment_of_a_daemon_is_only_what_krex_sets(tmp_path: Path) -> None:
    """The client applies a daemon's `env` only when every variable is one a krex daemon sets
    and every library or directory in it is one only we or root can change."""
    where = tmp_path / "krex.sock"
    ok = {
        "LD_PRELOAD": str(shim_library()),
        "PYTHONPATH": str(AUTO_DIR),
        "KREX_TENANT": "3",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert check_env(ok, where) == ok
    with pytest.raises(TrustError, match="BASH_ENV, which no krex daemon sets"):
        check_env({**ok, "BASH_ENV": "/tmp/x"}, where)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    evil = open_dir / "libevil.so"
    evil.write_bytes(b"\0")
    with pytest.raises(TrustError, match=r"LD_PRELOAD=.*libevil\.so"):
        check_env({"LD_PRELOAD": str(evil)}, where)
    with pytest.raises(TrustError, match="PYTHONPATH"):
        check_env({"PYTHONPATH": str(open_dir)}, where)
    with pytest.raises(TrustError, match=r"LD_PRELOAD=relative\.so"):
        check_env({"LD_PRELOAD": "relative.so"}, where)
    # Group-writable is fine when the group is ours alone (umask 002 systems), not otherwise.
    group = tmp_path / "group"
    group.mkdir()
    lib = group / "libkrex.so"
    lib.write_bytes(b"\0")
    for p in (group, lib):
        os.chown(p, -1, os.getegid())
        p.chmod(0o775 if p.is_dir() else 0o664)
    if _private_group(os.getegid()):
        assert check_env({"LD_PRELOAD": str(lib)}, where)
    else:
        with pytest.raises(TrustError):
            check_env({"LD_PRELOAD": str(lib)}, where)


def _config(tmp_path: Path, segment: str, name: str = "krex.toml") -> Path:
    cfg = tmp_path / name
    cfg.write_text(f'[daemon]\nsegment = "{segment}"\n')
    return cfg


def _daemon_fails(tmp_path: Path, segment: str) -> subprocess.CompletedProcess[str]:
    cfg = _config(tmp_path, segment, "b.toml")
    return subprocess.run(
        [*KREX, "daemon", "--sim", "--socket", str(tmp_path / "b.sock"), "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@as_root
def test_a_gates_segment_someone_else_made_is_refused_not_recovered(tmp_path: Path) -> None:
    """Case 2: another user pre-creates our gates segment, 0666: the daemon refuses it with
    one error and never uses it (it would let them hold our gates open)."""
    name = unique("krex-sec-gates")
    maker = as_nobody(
        f"""
        import _posixshmem, os
        os.umask(0)
        fd = _posixshmem.shm_open({name!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
        os.ftruncate(fd, 1 << 16)
        print("ready", flush=True)
        """
    )
    try:
        out, err = maker.communicate(timeout=30)
        assert out.strip() == "ready", err
        before = Path("/dev/shm", name.lstrip("/")).read_bytes()
        p = _daemon_fails(tmp_path, name)
        assert p.returncode == 2, p.stderr
        assert f"belongs to uid {NOBODY}" in p.stderr and "refusing it" in p.stderr
        assert "Traceback" not in p.stderr
        assert Path("/dev/shm", name.lstrip("/")).read_bytes() == before  # untouched
    finally:
        remove_shm(name)


def test_a_gates_segment_anyone_may_write_is_refused(tmp_path: Path) -> None:
    """Ours, but mode 0666: someone could hold our gates open through it."""
    import posix_ipc

    name = unique("krex-sec-open")
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=1 << 16)
    os.fchmod(shm.fd, 0o666)
    shm.close_fd()
    try:
        p = _daemon_fails(tmp_path, name)
        assert p.returncode == 2 and "mode 666" in p.stderr and "refusing it" in p.stderr, p.stderr
    finally:
        remove_shm(name)


def test_a_second_daemon_on_the_same_segment_refuses(tmp_path: Path) -> None:
    """Case 5: two daemons on different sockets, one segment: the second refuses at once
    instead of "recovering" the first one's live segment (reopening its gates, thawing its
    siblings mid-region); the first carries on."""
    name = unique("krex-sec-two")
    first = Daemon(tmp_path / "a.sock", "--config", str(_config(tmp_path, name)))
    first.start()
    try:
        t0 = time.monotonic()
        p = _daemon_fails(tmp_path, name)
        assert p.returncode == 2, p.stderr
        assert "in use by another krex daemon" in p.stderr and "Traceback" not in p.stderr
        assert time.monotonic() - t0 < 30
        st = first.status()
        assert st is not None and st["segment"] == name and st["segment_linked"]
    finally:
        first.stop()
        remove_shm(name)
        remove_shm(name + "-sim")


def test_the_first_daemon_s_status_is_still_json(tmp_path: Path) -> None:
    """A daemon on a fresh segment starts and answers (the lock does not get in its way), and
    after it stops a new daemon takes the same segment (the lock went with it)."""
    name = unique("krex-sec-again")
    for _ in range(2):
        d = Daemon(tmp_path / "a.sock", "--config", str(_config(tmp_path, name)))
        d.start()
        try:
            st = d.status()
            assert st is not None and json.dumps(st)
        finally:
            d.stop()
    remove_shm(name)
    remove_shm(name + "-sim")


def test_a_listener_that_does_not_answer_is_no_successor(tmp_path: Path) -> None:
    """Case 6: a dying daemon can close a client's connection before its listening socket (the
    kernel closes its files one by one): a connection queued there is accepted by nobody. Only
    a daemon that answers counts as a successor (else the client left its sibling frozen,
    seen in one of three runs of the restart test)."""
    import socket

    from krex.client.watch import answers

    path = tmp_path / "dying.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    try:
        t0 = time.monotonic()
        assert answers(path) is False
        assert time.monotonic() - t0 < 5
    finally:
        listener.close()
    assert answers(path) is False  # nobody listening at all


def test_a_dead_daemon_leaves_nobody_frozen(tmp_path: Path) -> None:
    """Case 6: the daemon is SIGKILLed inside a region and not restarted: the frozen sibling's
    own `krex run` notices (its connection ends) and thaws what the daemon froze within
    seconds; the sibling moves again and its command goes on."""
    d = Daemon(tmp_path / "krex.sock", "--slots", "2")
    d.start()
    sib = Counter(d)
    holder = krex_run(d, sys.executable, "-c", HOLDER, "30", stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("in region")
        frozen_at = sib.settled()
        time.sleep(0.5)
        assert sib.value() == frozen_at, "the sibling was not frozen by the region"
        assert d.proc is not None
        d.proc.kill()
        d.proc.wait(timeout=30)
        sib.wait_moving(within_s=20.0)  # the gate's deadline and the region's time-out: 630 s
        assert sib.proc.poll() is None, "the sibling's command goes on"
    finally:
        sib.stop()
        holder.kill()
        holder.wait(timeout=30)
        d.stop()


# A GPU user of the simulated GPU that holds a stream (so the simulated driver lists it) until
# killed; "plain" talks to the driver as krex's shim would see it, "dlmopen" first loads a copy
# of the driver into a namespace of its own, "bare" is started by its tenant without the shim.
GPU_USER = textwrap.dedent("""
    import ctypes, os, subprocess, sys, time
    how = sys.argv[1]
    if how == "dlmopen":
        RTLD_NOW, LM_ID_NEWLM = 2, -1
        libc = ctypes.CDLL(None)  # the global look-up: the preloaded shim's dlmopen first
        libc.dlmopen.restype = ctypes.c_void_p
        libc.dlmopen.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
        assert libc.dlmopen(LM_ID_NEWLM, b"libcuda.so.1", RTLD_NOW)
    if how == "bare":
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        # the child dies with this process (PR_SET_PDEATHSIG, SIGKILL): the test kills only us
        die_with_parent = lambda: ctypes.CDLL(None).prctl(1, 9)
        child = subprocess.Popen([sys.executable, sys.argv[0], "plain"], env=env,
                                 preexec_fn=die_with_parent)
        child.wait()
        sys.exit(0)
    if how == "unlinked":
        os.unlink("/dev/shm/" + os.environ["KREX_SLOTS"].lstrip("/"))
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    g.launch(1000)
    g.sync()
    print("on the GPU", flush=True)
    time.sleep(120)
""")


def _sibling(d: Daemon, tmp_path: Path, how: str) -> subprocess.Popen[str]:
    script = tmp_path / f"gpu_user_{how}.py"
    script.write_text(GPU_USER)
    sib = krex_run(d, sys.executable, str(script), how, stdout=subprocess.PIPE)
    assert sib.stdout is not None and sib.stdout.readline().strip() == "on the GPU"
    return sib


def _one_region(d: Daemon, tmp_path: Path, seconds: str = "0.3") -> dict[str, object]:
    report = tmp_path / f"owner-{time.monotonic_ns()}.json"
    p = krex_run(d, sys.executable, "-c", HOLDER, seconds, report=report, stdout=subprocess.PIPE)
    assert p.wait(timeout=60) == 0
    (region,) = json.loads(report.read_text())["regions"]
    return dict(region)


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[Daemon]:
    with configured(tmp_path, "[timeouts]\ndrain_s = 1.0\nquiesce_s = 1.0\n") as d:
        yield d


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("bare", "without the krex shim"),
        ("unlinked", "without the krex shim"),
        ("dlmopen", "reach a GPU driver past the shim (loaded apart with dlmopen"),
        ("plain", None),
    ],
)
def test_ungated_work_inside_a_tenant_makes_regions_unclean(
    quick: Daemon, tmp_path: Path, how: str, words: str | None
) -> None:
    """Case 3: a sibling's child started without LD_PRELOAD, a sibling that removed its slot
    segment before it used the GPU (as logind's RemoveIPC does), and one that loaded the driver
    again with dlmopen: none of their work is gated or drained, so a region beside them is
    unclean, with the reason. The control: a plain sibling leaves the region clean."""
    sib = _sibling(quick, tmp_path, how)
    try:
        region = _one_region(quick, tmp_path)
    finally:
        sib.kill()
        sib.wait(timeout=30)
    problems = region["problems"]
    assert isinstance(problems, list)
    if words is None:
        assert region["clean"] is True and problems == [], region
    else:
        assert region["clean"] is False and any(words in p for p in problems), region


@pytest.mark.node(KREX_SIM_CTX_CREATE_MS=1500)
def test_a_process_holds_its_slot_before_the_gpu_lists_it(node: Node) -> None:
    """The GPU lists a process from early in its context's creation (NVML does; the simulated
    driver too), which takes up to seconds when many processes create theirs at once. The
    shim takes its slot before that begins, so a region's audit never sees a tenant's process
    on the GPU with no slot (on the H200, three of four commands started together were
    flagged unclean so before this)."""
    argv = [node.native.program("workload"), "hammer", "1000000", "1"]
    assert_slotted_once_listed(node, argv, node.env(tenant=1))


def test_a_foreign_process_that_starts_during_the_region_makes_it_unclean(
    quick: Daemon, tmp_path: Path
) -> None:
    """Case 4: nothing foreign at the grant; a process outside krex starts GPU work while the
    region runs: the region's end finds it, and the record says so."""
    from krex.core.paths import sim_library_dir

    st = quick.status()
    assert st is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env |= {"LD_LIBRARY_PATH": str(sim_library_dir()), "KREX_SIM_SHM": st["segment"] + "-sim"}
    report = tmp_path / "owner.json"
    owner = krex_run(
        quick, sys.executable, "-c", HOLDER, "3", report=report, stdout=subprocess.PIPE
    )
    assert owner.stdout is not None and owner.stdout.readline().startswith("in region")
    script = tmp_path / "outsider.py"
    script.write_text(GPU_USER)
    outsider = subprocess.Popen(
        [sys.executable, str(script), "plain"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert outsider.stdout is not None and outsider.stdout.readline().strip() == "on the GPU"
        assert owner.wait(timeout=60) == 0
    finally:
        outsider.kill()
        outsider.wait(timeout=30)
    (region,) = json.loads(report.read_text())["regions"]
    assert region["clean"] is False, region
    assert any("foreign" in p and "at the region's end" in p for p in region["problems"]), region


class _Slot:
    def __init__(self, pid: int, tenant: int, ungated: bool = False) -> None:
        self.pid, self.tenant, self.ungated = pid, tenant, ungated
        self.alive, self.gpu, self.gpus, self.intercepted = True, 0, 1, 0


class _Group:
    def __init__(self, pids: list[int]) -> None:
        self._pids = pids

    def pids(self) -> list[int]:
        return self._pids


def test_the_daemon_s_own_mps_server_is_not_foreign_nor_its_work_unvouched(
    tmp_path: Path,
) -> None:
    """Under `[mps] enabled`, NVML lists the MPS server krex started as the GPU's user and its
    samples show it working for every client (on the H200 every region was called unclean for
    it, docs/results/h200-settle/). Mps.owns knows it: the server's binary, our user, our pipe
    directory in its environment or its parent's (the control daemon). A process with another
    pipe directory, or another binary with ours, is still foreign."""
    from types import SimpleNamespace

    from krex.daemon.machinery import NodeMachinery
    from krex.daemon.mps import SERVER, Mps

    sleep = shutil.which("sleep")
    assert sleep is not None
    server = tmp_path / SERVER
    shutil.copy(sleep, server)  # a binary of the server's name (exe is what is read)
    mps = Mps(tmp_path / "mps")
    ours = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps" / "pipe")}
    theirs = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}
    procs = [
        subprocess.Popen([str(server), "30"], env=ours),
        subprocess.Popen([str(server), "30"], env=theirs),
        subprocess.Popen([sleep, "30"], env=ours),
        # the control daemon's child, with an environment of its own: ours by its parent
        subprocess.Popen(["sh", "-c", f"env -i {server} 30; :"], env=ours),
    ]
    try:
        time.sleep(0.3)
        child = int(subprocess.run(["pgrep", "-P", str(procs[3].pid)], capture_output=True,
                                   text=True, check=True).stdout.split()[0])  # fmt: skip
        assert [mps.owns(p.pid) for p in procs[:3]] == [True, False, False]
        assert mps.owns(child) and not mps.owns(procs[3].pid)  # sh is not the server
        helper, other = procs[0].pid, procs[1].pid
        owner = SimpleNamespace(id=1, group=_Group([]))
        nvml = SimpleNamespace(
            work_samples=lambda gpu, since: {helper: since + 2, other: since + 2},
            sample_period=lambda gpu: 1 / 6,
            processes=lambda gpu: {helper, other},
            process_memory=lambda gpu: {helper: 3 << 30, other: 1 << 30},
        )
        gpu = SimpleNamespace(tenants=[owner], pool=[], pool_tenant=None)
        segments = SimpleNamespace(live_slots=lambda: [])
        cfg = SimpleNamespace(sim=False)
        m = NodeMachinery(cfg, [gpu], segments, nvml)  # type: ignore[arg-type,list-item]
        m.helper = mps.owns
        assert m.foreign(0) == {other}
        # nor are its bytes another tenant's: a region's memory_placement counts the others'
        assert m.memory_split(0, owner) == (0, 1 << 30)  # type: ignore[arg-type]
        problems = m.audit(0, owner, since=time.time() - 1)  # type: ignore[arg-type]
        assert problems and all(str(helper) not in p for p in problems), problems
        assert any(str(other) in p for p in problems if "foreign" in p), problems
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["pkill", "-f", str(server)], check=False)


def test_nvml_samples_overlapping_the_grant_never_blame_a_drained_sibling() -> None:
    """NVML's process samples cover about 1/6 s each, so one that overlaps the grant shows a
    sibling's work from before it: on the H200, 7-8 of 31 short autotuning regions beside 7
    siblings were called unclean so. A sibling process that holds a gated slot was drained
    before the grant and gated since: not named for a sample overlapping the grant (a later
    one is: tests/test_drain_forgery.py). Named: a foreign process, a tenant's process
    without a slot, and one that loaded a driver apart (dlmopen)."""
    from types import SimpleNamespace

    from krex.daemon.machinery import NodeMachinery

    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(5)]
    owner_pid, sibling, foreign, slotless, dlmopen = (p.pid for p in procs)
    try:
        owner = SimpleNamespace(id=1, group=_Group([owner_pid]))
        other = SimpleNamespace(id=2, group=_Group([sibling, slotless, dlmopen]))
        slots = [_Slot(owner_pid, 1), _Slot(sibling, 2), _Slot(dlmopen, 2, ungated=True)]
        segments = SimpleNamespace(live_slots=lambda: [(None, s) for s in slots])
        nvml = SimpleNamespace(
            # Each stamped a moment after the grant: a sample overlapping it.
            work_samples=lambda gpu, since: {
                p: since + 0.05 for p in (owner_pid, sibling, foreign, slotless, dlmopen)
            },
            sample_period=lambda gpu: 1 / 6,
            processes=lambda gpu: set(),
        )
        gpu = SimpleNamespace(tenants=[owner, other], pool=[], pool_tenant=None)
        cfg = SimpleNamespace(sim=False)
        m = NodeMachinery(cfg, [gpu], segments, nvml)  # type: ignore[arg-type,list-item]
        problems = m.audit(0, owner, since=time.time() - 1)  # type: ignore[arg-type]
        sampled = [p for p in problems if "NVML's process samples" in p]
        assert len(sampled) == 1, problems
        assert str(sorted([foreign, slotless, dlmopen])) in sampled[0]
        assert str(sibling) not in sampled[0]
        assert any("dlmopen" in p and str(dlmopen) in p for p in problems)
        slots.remove(slots[1])  # the sibling without its slot: its samples count again
        problems = m.audit(0, owner, since=time.time() - 1)  # type: ignore[arg-type]
        assert any(str(sibling) in p for p in problems if "NVML" in p), problems
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_settle_waits_only_where_nvml_saw_a_frozen_sibling_work() -> None:
    """NodeMachinery.settle_idle: idles settle_s when NVML's process samples of the last
    second name a sibling's process; not for anyone else's, nor without NVML."""
    from types import SimpleNamespace

    from krex.daemon.machinery import NodeMachinery

    seen: set[int] = set()
    sibling = SimpleNamespace(id=2, group=_Group([4242]))
    nvml = SimpleNamespace(active=lambda gpu, since: set(seen))
    cfg = SimpleNamespace(sim=False)
    no_slots = SimpleNamespace(live_slots=lambda: [])
    m = NodeMachinery(cfg, [], no_slots, nvml)  # type: ignore[arg-type]
    assert m.settle_idle(0, [sibling], 0.2) == 0.0  # type: ignore[list-item]
    seen.add(999)  # someone else's work: not the siblings'
    assert m.settle_idle(0, [sibling], 0.2) == 0.0  # type: ignore[list-item]
    seen.add(4242)
    t0 = time.monotonic()
    waited = m.settle_idle(0, [sibling], 0.2)  # type: ignore[list-item]
    assert 0.2 <= waited <= time.monotonic() - t0
    blind = NodeMachinery(cfg, [], no_slots, None)  # type: ignore[arg-type]
    assert blind.settle_idle(0, [sibling], 0.2) == 0.0  # type: ignore[list-item]


def test_a_settle_waits_where_the_shim_counted_a_sibling_s_calls_since_a_second_ago() -> None:
    """Without NVML (the simulated GPU), or where it names the MPS server instead of its
    clients, the shim's per-process count of intercepted calls says whether a sibling
    submitted lately: settle when one of its processes on the GPU counted a call since the
    daemon's tick at least SETTLE_LOOKBACK_S ago, or is newer than that tick; not for another
    tenant's calls, another GPU's, or calls counted before that tick."""
    from types import SimpleNamespace

    from krex.daemon import machinery
    from krex.daemon.machinery import NodeMachinery

    sib, other = _Slot(4242, 2), _Slot(5151, 3)
    sib.intercepted = other.intercepted = 10
    slots = [sib, other]
    segments = SimpleNamespace(live_slots=lambda: [(None, s) for s in slots])
    sibling = SimpleNamespace(id=2, group=_Group([4242]))
    cfg = SimpleNamespace(sim=False)
    m = NodeMachinery(cfg, [], segments, None)  # type: ignore[arg-type]

    def settle() -> float:
        return m.settle_idle(0, [sibling], 0.05)  # type: ignore[list-item]

    assert settle() > 0  # no tick yet: its 10 calls are all newer than the daemon's ticks
    old = time.monotonic() - machinery.SETTLE_LOOKBACK_S - 0.1
    m.submits.note(old, (s for _, s in segments.live_slots()))
    m.submits.note(time.monotonic(), (s for _, s in segments.live_slots()))
    assert settle() == 0.0  # nothing since the tick a second ago
    other.intercepted += 5  # another tenant's calls
    assert settle() == 0.0
    sib.gpu, sib.gpus, sib.intercepted = 1, 2, 11  # its calls, on another GPU
    assert settle() == 0.0
    sib.gpu, sib.gpus = 0, 1
    assert settle() >= 0.05  # one call since the tick a second ago, on this GPU
