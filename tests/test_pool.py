"""The warm worker pool on the simulated GPU: a command run warm behaves as if it ran alone, in
a fresh process forked from a fork server (krex/pool/worker.py).

Each test has its own daemon with a pool (`krex daemon --pool N`); commands are Python scripts
run with this interpreter, so they can run warm; `--report` says whether they did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    KREX,
    Counter,
    Daemon,
    assert_frozen_for_the_region,
    preloading_daemon,
    wait_pool_ready,
)

from krex.pool.plan import plan


class Result:
    def __init__(self, p: subprocess.CompletedProcess[str], report: dict[str, Any]) -> None:
        self.rc, self.out, self.err, self.report = p.returncode, p.stdout, p.stderr, report


def krun(
    d: Daemon,
    tmp: Path,
    script: str,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    pre: tuple[str, ...] = (),
    argv: list[str] | None = None,
) -> Result:
    path = tmp / "cmd.py"
    path.write_text(textwrap.dedent(script))
    report = tmp / f"report-{time.monotonic_ns()}.json"
    cmd = argv if argv is not None else [sys.executable, str(path), *args]
    p = subprocess.run(
        [
            *KREX,
            "run",
            "--sim",
            "--socket",
            str(d.socket),
            "--report",
            str(report),
            *pre,
            "--",
            *cmd,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd or tmp,
    )
    return Result(p, json.loads(report.read_text()) if report.exists() else {})


SHOW = """
    import json, os, sys
    import mymod
    mymod.counter += 1
    leftover = globals().get("LEFTOVER")
    LEFTOVER = "set by a previous command"
    os.environ["SET_BY_COMMAND"] = "1"
    print(json.dumps({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                      "foo": os.environ.get("FOO"), "counter": mymod.counter,
                      "leftover": leftover, "pid": os.getpid(), "ppid": os.getppid(),
                      "set_before": os.environ.get("SET_BY_COMMAND_BEFORE"),
                      "path0": sys.path[0]}))
    os.environ["SET_BY_COMMAND_BEFORE"] = "leaked"
"""


def test_each_command_sees_a_fresh_interpreter(pool: Daemon, tmp_path: Path) -> None:
    """A fresh __main__, its own environment, cwd and argv; module state does not leak."""
    outs = []
    for i, (where, foo) in enumerate([("a", "one"), ("b", "two"), ("a", "three")]):
        cwd = tmp_path / where
        cwd.mkdir(exist_ok=True)
        (tmp_path / "mymod.py").write_text("counter = 0\n")
        r = krun(pool, tmp_path, SHOW, f"arg{i}", "x y", env={"FOO": foo}, cwd=cwd)
        assert r.rc == 0, r.err
        assert r.report["pool"] == "warm", r.report
        outs.append(json.loads(r.out))
    assert len({o["pid"] for o in outs}) == 3, "a fresh process each"
    assert len({o["ppid"] for o in outs}) == 1, "forked by one worker"
    for i, (o, (where, foo)) in enumerate(
        zip(outs, [("a", "one"), ("b", "two"), ("a", "three")], strict=True)
    ):
        assert o["name"] == "__main__" and o["leftover"] is None
        assert o["argv"] == [str(tmp_path / "cmd.py"), f"arg{i}", "x y"]
        assert o["cwd"] == str(tmp_path / where) and o["foo"] == foo
        assert o["counter"] == 1, "a user module starts from scratch every time"
        assert o["set_before"] is None, "the environment is the client's, not the last one's"
        assert o["path0"] == str(tmp_path)


def test_regions_of_consecutive_commands_in_one_worker(pool: Daemon, tmp_path: Path) -> None:
    """Each command's regions are its own tenant's, in a process of its own: no warning about
    what another command did in the process (docs/results/h200-fidelity/run2/)."""
    script = """
        import os, krex
        names = []
        for _ in range(2):
            with krex.region():
                pass
            names.append(",".join(w["name"] for w in krex.last_region()["warnings"]) or "-")
        print(os.getppid(), os.environ["KREX_TENANT"], krex.last_region()["clean"], *names)
    """
    outs = []
    for _ in range(3):
        r = krun(pool, tmp_path, script)
        assert r.rc == 0 and r.report["pool"] == "warm", r.err
        assert len(r.report["regions"]) == 2, r.report
        assert all(g["warnings"] == [] for g in r.report["regions"]), r.report
        outs.append(r.out.split())
    assert len({o[0] for o in outs}) == 1 and len({o[1] for o in outs}) == 3
    assert all(o[2:] == ["True", "-", "-"] for o in outs), outs


ALLOC = """
    import ctypes, sys
    from ctypes import byref, c_size_t, c_uint64, c_void_p
    cu = ctypes.CDLL("libcuda.so.1")
    ctx = c_void_p()
    assert cu.cuCtxGetCurrent(byref(ctx)) == 0 and ctx.value  # the worker's, or ours
    mib, sets = int(sys.argv[1]), int(sys.argv[2])
    p = c_uint64()
    assert cu.cuMemAlloc_v2(byref(p), c_size_t(mib << 20)) == 0
    for _ in range(sets):
        assert cu.cuMemsetD8_v2(p, 0, c_size_t(4)) == 0
    assert cu.cuMemFree_v2(p) == 0
"""


def test_each_warm_command_reports_its_own_calls_and_memory(pool: Daemon, tmp_path: Path) -> None:
    """One worker runs three commands: each report has that command's peak and call count,
    not the last command's added (a slot's counters start again at each hand-over) and not
    lost (the worker going back to the pool folds them into the command first)."""
    prelude = "import ctypes\nfrom ctypes import byref, c_int, c_void_p\n"
    ensure_ctx = (
        "cu0 = ctypes.CDLL('libcuda.so.1'); cu0.cuInit(0); d, c = c_int(), c_void_p()\n"
        "cu0.cuDeviceGet(byref(d), 0); cu0.cuDevicePrimaryCtxRetain(byref(c), d)\n"
        "cu0.cuCtxSetCurrent(c)\n"
    )
    script = prelude + ensure_ctx + textwrap.dedent(ALLOC)
    reports = []
    for mib, sets in [(64, 40), (16, 4), (32, 10)]:
        r = krun(pool, tmp_path, script, str(mib), str(sets))
        assert r.rc == 0 and r.report["pool"] == "warm", r.err
        reports.append((mib, sets, r.report))
    for mib, sets, rep in reports:
        assert mib << 20 <= rep["memory"]["peak_bytes"] < (mib + 8) << 20, (mib, rep["memory"])
        assert sets <= rep["intercepted"] < sets + 10, (sets, rep["intercepted"])


def test_exit_status_and_traceback_are_the_commands(pool: Daemon, tmp_path: Path) -> None:
    r = krun(pool, tmp_path, "import sys\nsys.exit(3)\n")
    assert (r.rc, r.report["pool"], r.report["exit_code"]) == (3, "warm", 3)
    r = krun(pool, tmp_path, "raise SystemExit('bye')\n")
    assert r.rc == 1 and r.err.strip() == "bye"
    r = krun(pool, tmp_path, "def f():\n    raise ValueError('boom')\nf()\n")
    assert r.rc == 1 and r.report["pool"] == "warm"
    lines = r.err.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith(f'  File "{tmp_path / "cmd.py"}", line 3'), r.err
    assert lines[-1] == "ValueError: boom"
    assert "worker.py" not in r.err and "runpy" not in r.err
    r = krun(pool, tmp_path, "print('fine')\n")
    assert (r.rc, r.out, r.report["pool"]) == (0, "fine\n", "warm")


def test_module_and_code_invocations(pool: Daemon, tmp_path: Path) -> None:
    (tmp_path / "pkgmod.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    r = krun(pool, tmp_path, "", argv=[sys.executable, "-m", "pkgmod", "a", "b"])
    assert (r.rc, r.out, r.report["pool"]) == (0, "__main__ ['a', 'b']\n", "warm"), r.err
    r = krun(pool, tmp_path, "", argv=[sys.executable, "-u", "-c", "import sys; print(sys.argv)"])
    assert (r.rc, r.out, r.report["pool"]) == (0, "['-c']\n", "warm"), r.err


def test_stdin_reaches_the_command(pool: Daemon, tmp_path: Path) -> None:
    (tmp_path / "cmd.py").write_text("import sys\nprint(sys.stdin.read().upper(), end='')\n")
    report = tmp_path / "r.json"
    p = subprocess.run(
        [*KREX, "run", "--sim", "--socket", str(pool.socket), "--report", str(report), "--",
         sys.executable, str(tmp_path / "cmd.py")],
        input="hello\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (p.returncode, p.stdout) == (0, "HELLO\n"), p.stderr
    assert json.loads(report.read_text())["pool"] == "warm"


@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("import os\nos._exit(7)\n", 7),
        ("import ctypes\nctypes.string_at(0)\n", 128 + 11),
        # Damage to its worker: the command kills the fork server that started it.
        ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", 0),
    ],
    ids=["os._exit", "segfault", "kills-its-worker"],
)
def test_a_dying_command_gives_its_status_and_the_pool_serves_on(
    pool: Daemon, tmp_path: Path, script: str, status: int
) -> None:
    first = krun(pool, tmp_path, "import os\nprint(os.getppid())\n")
    r = krun(pool, tmp_path, script)
    assert (r.rc, r.report["pool"], r.report["exit_code"]) == (status, "warm", status), r.err
    wait_pool_ready(pool, 1)
    after = krun(pool, tmp_path, "import os\nprint(os.getppid())\n")
    assert after.rc == 0 and after.report["pool"] == "warm", after.err
    if status == 0:
        assert after.out != first.out, "a new worker replaced the one it killed"
    else:
        assert after.out == first.out, "the worker is unharmed by its child's death"
    assert pool.proc is not None and pool.proc.poll() is None, "the daemon is unharmed"


def _interrupt_when_ready(pool: Daemon, tmp_path: Path, script: str) -> Result:
    (tmp_path / "cmd.py").write_text(textwrap.dedent(script))
    report = tmp_path / "r.json"
    p = subprocess.Popen(
        [*KREX, "run", "--sim", "--socket", str(pool.socket), "--report", str(report), "--",
         sys.executable, "-u", str(tmp_path / "cmd.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert p.stdout is not None
    assert p.stdout.readline() == "ready\n"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    done = subprocess.CompletedProcess(p.args, p.returncode, "ready\n" + out, err)
    return Result(done, json.loads(report.read_text()))


def test_ctrl_c_raises_keyboardinterrupt_in_the_command(pool: Daemon, tmp_path: Path) -> None:
    caught = """
        import time
        try:
            print("ready")
            time.sleep(60)
        except KeyboardInterrupt:
            print("caught")
    """
    r = _interrupt_when_ready(pool, tmp_path, caught)
    assert (r.rc, r.out, r.report["pool"]) == (0, "ready\ncaught\n", "warm"), r.err
    r = _interrupt_when_ready(pool, tmp_path, 'import time\nprint("ready")\ntime.sleep(60)\n')
    assert r.rc == 130 and r.err.rstrip().endswith("KeyboardInterrupt"), r.err
    # The worker is unharmed: the next command runs warm.
    assert krun(pool, tmp_path, "pass\n").report["pool"] == "warm"


def test_nothing_a_command_changes_reaches_the_next(pool: Daemon, tmp_path: Path) -> None:
    """Signal handlers, environment, cwd, sys.path, modules, threads, native code and random
    seeds: the next command starts from the worker's state, never from the last command's."""
    (tmp_path / "leaky.py").write_text("value = 'imported by the first command'\n")
    so = extension(tmp_path, "native_mod", "0")
    r = krun(
        pool,
        tmp_path,
        f"""
        import importlib.util, os, random, signal, sys, threading, time
        import leaky
        spec = importlib.util.spec_from_file_location("native_mod", {str(so)!r})
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        signal.signal(signal.SIGUSR1, lambda *a: None)
        os.environ["LEAK"] = "1"
        sys.path.insert(0, "/leak")
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        os.chdir("/")
        print(random.random())
        """,
    )
    assert r.rc == 0 and r.report["pool"] == "warm", r.err
    r2 = krun(
        pool,
        tmp_path,
        """
        import os, random, signal, sys, threading
        print(random.random())
        print(signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL,
              signal.getsignal(signal.SIGINT) is signal.default_int_handler,
              "LEAK" in os.environ, "/leak" in sys.path, os.getcwd(),
              "leaky" in sys.modules, "native_mod" in sys.modules, threading.active_count())
        """,
    )
    first, second = r2.out.splitlines()
    assert r2.rc == 0 and r2.report["pool"] == "warm", r2.err
    assert first != r.out.strip(), "random is seeded afresh in each command"
    # One thread, as natively: the command's process runs nothing of krex's (issue #48).
    assert second == f"True True False False {tmp_path} False False 1", second


def extension(tmp: Path, name: str, tag: str) -> Path:
    """A native extension module `name`, built into a directory of its own."""
    import importlib.machinery
    import sysconfig

    d = tmp / f"ext-{tag}"
    d.mkdir()
    src = d / f"{name}.c"
    src.write_text(EXTENSION_C.replace("NAME", name))
    out = d / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    include = sysconfig.get_paths()["include"]
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", f"-I{include}", "-o", str(out), str(src)], check=True)
    return out


EXTENSION_C = """
#include <Python.h>
static PyObject *launch(PyObject *self, PyObject *args) { Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"launch", launch, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&def); }
"""


def test_cold_fallback_says_why(pool: Daemon, tmp_path: Path) -> None:
    r = krun(pool, tmp_path, "print('x')\n", pre=("--no-pool",))
    assert (r.rc, r.report["pool"], r.report["pool_reason"]) == (0, "cold", "--no-pool")
    r = krun(pool, tmp_path, "", argv=["/bin/true"])
    assert (r.rc, r.report["pool"], r.report["pool_reason"]) == (0, "cold", "not a Python command")
    r = krun(
        pool, tmp_path, "print('x')\n", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    )
    assert r.report["pool"] == "cold" and "PYTORCH_CUDA_ALLOC_CONF" in r.report["pool_reason"]
    r = krun(pool, tmp_path, "print('x')\n", env={"TRITON_CACHE_DIR": str(tmp_path / "cache")})
    assert r.report["pool"] == "warm", "read at each compile: fine to change per command"
    r = krun(pool, tmp_path, "print('x')\n", pre=("--auto-regions",))
    assert r.report["pool"] == "warm", "auto-regions are installed in the forked child"


def test_plan_reasons() -> None:
    py = sys.executable
    # The workers started with this environment (a machine's own OPENBLAS_CORETYPE, say, is
    # theirs too): only what a command changes decides.
    env = dict(os.environ)
    ok = plan([py, "b.py", "x"], env, py, env)
    assert ok.warm and ok.invocation is not None and ok.invocation.args == ["x"]
    assert not plan([py, "-X", "dev", "b.py"], env, py, env).warm
    assert "interactive" in plan([py], env, py, env).reason
    assert "-m without" in plan([py, "-m"], env, py, env).reason
    w = plan([py, "-W", "error", "-uB", "b.py"], env, py, env)
    assert w.warm and w.invocation is not None
    assert (w.invocation.warnings, w.invocation.unbuffered, w.invocation.dont_write_bytecode) == (
        ["error"],
        True,
        True,
    )
    assert "another interpreter" in plan(["/bin/sh", "b.py"], env, py, env).reason or (
        plan(["/bin/sh", "b.py"], env, py, env).reason == "not a Python command"
    )
    other = plan([py, "b.py"], {**env, "CUDA_LAUNCH_BLOCKING": "1"}, py, env)
    assert not other.warm and "CUDA_LAUNCH_BLOCKING" in other.reason
    unset = plan([py, "b.py"], {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}, py,
                 {**env, "OMP_NUM_THREADS": "4"})  # fmt: skip
    assert not unset.warm and "OMP_NUM_THREADS" in unset.reason
    assert plan([py, "b.py"], {**env, "CUDA_VISIBLE_DEVICES": "3"}, py, env).warm  # ours


def test_sixteen_commands_at_once_all_run_warm_from_one_worker(tmp_path: Path) -> None:
    """A fork server serves any number of commands at once: 16 at once on 16 slots with one
    worker all run warm (issue #17's bar is 95 %), each in its own process."""
    d = Daemon(tmp_path / "krex.sock", "--pool", "1", "--slots", "16")
    d.start()
    try:
        wait_pool_ready(d, 1)
        script = tmp_path / "ctx.py"
        script.write_text(
            "import os\nfrom krex.sim.simgpu import SimGPU\ng = SimGPU()\ng.launch(1000)\n"
            "g.sync()\nprint(os.getpid(), os.getppid())\n"
        )
        reports: list[dict[str, Any]] = [{} for _ in range(16)]
        outs = [""] * 16

        def one(i: int) -> None:
            rep = tmp_path / f"r-{i}.json"
            p = subprocess.run(
                [*KREX, "run", "--sim", "--socket", str(d.socket), "--report", str(rep), "--",
                 sys.executable, str(script)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            outs[i] = p.stdout if p.returncode == 0 else p.stderr
            if rep.exists():
                reports[i] = json.loads(rep.read_text())

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.get("pool") for r in reports] == ["warm"] * 16, (reports, outs)
        pids = [o.split() for o in outs]
        assert len({p[0] for p in pids}) == 16 and len({p[1] for p in pids}) == 1, outs
    finally:
        d.stop()


def test_a_warm_sibling_makes_no_progress_while_a_warm_region_is_held(tmp_path: Path) -> None:
    """Workers follow the region protocol like any tenant: the owner's worker holds the GPU,
    the sibling's worker (in the sibling's cgroup) is frozen for the region's life."""
    d = Daemon(tmp_path / "krex.sock", "--pool", "2")
    d.start()
    try:
        wait_pool_ready(d, 2)
        sib = Counter(d)
        try:
            assert_frozen_for_the_region(d, sib, 1.0)
            st = d.status()
            assert st is not None and st["gpus"][0]["pool"]["warm_runs"] == 2, st
        finally:
            sib.stop()
    finally:
        d.stop()


def test_a_warm_command_maps_the_gates_read_only_and_its_tenants_slots(
    pool: Daemon, tmp_path: Path
) -> None:
    """Warm, as cold: the gates' segment read-only; the only writable krex segment is the
    command's own tenant's slot segment (no worker's, no other tenant's)."""
    script = """
        import json
        from krex.sim.simgpu import SimGPU
        g = SimGPU()  # the shim maps its segments at the process's first context
        g.launch(1000)
        g.sync()
        maps = [line.split() for line in open("/proc/self/maps") if "/dev/shm/krex" in line]
        print(json.dumps([[m[1], m[5]] for m in maps]))
    """
    r = krun(pool, tmp_path, script)
    assert r.rc == 0 and r.report["pool"] == "warm", r.err
    perms = {path: perm for perm, path in json.loads(r.out)}
    st = pool.status()
    assert st is not None
    gates = "/dev/shm" + st["segment"]
    assert perms.pop(gates) == "r--s", perms
    writable = [p for p, perm in perms.items() if perm == "rw-s" and not p.endswith("-sim")]
    assert len(writable) == 1 and writable[0].startswith(gates + "-t"), perms


def test_the_signal_freezer_moves_a_worker_between_tenant_and_pool(tmp_path: Path) -> None:
    """Without cgroups a group is a set of process trees: a warm command's child, forked by a
    worker, is placed in its tenant's set and frozen with it in another tenant's region."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('[freezer]\nbackend = "signal"\n')
    d = Daemon(tmp_path / "krex.sock", "--config", str(cfg), "--pool", "2")
    d.start()
    try:
        wait_pool_ready(d, 2)
        sib = Counter(d)
        try:
            for _ in range(2):  # the second time from a worker that has forked before
                assert_frozen_for_the_region(d, sib, 0.5)
        finally:
            sib.stop()
        st = d.status()
        assert (
            st is not None and st["freezer"] == "signal" and st["gpus"][0]["pool"]["warm_runs"] >= 3
        )
    finally:
        d.stop()


def test_a_preload_that_loads_the_driver_is_dropped_and_the_pool_serves(tmp_path: Path) -> None:
    """A worker whose preload module loads the GPU driver starts again without it (a child
    forked after the driver is loaded could not use the GPU), says so, and serves."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "loads_driver.py").write_text("import ctypes\nctypes.CDLL('libcuda.so.1')\n")
    d = preloading_daemon(tmp_path, mods, ["json", "loads_driver"])
    try:
        wait_pool_ready(d, 1)
        r = krun(d, tmp_path, """
            import sys
            from krex.sim.simgpu import SimGPU
            g = SimGPU()
            g.launch(1000)
            g.sync()
            print("json" in sys.modules, "loads_driver" in sys.modules)
        """)  # fmt: skip
        assert r.rc == 0 and r.report["pool"] == "warm", r.err
        assert r.out.split() == ["True", "False"], r.out
        assert "importing loads_driver initialised the GPU driver" in d.log.read_text()
    finally:
        d.stop()


def test_a_client_without_a_lease_gets_no_fork(pool: Daemon, tmp_path: Path) -> None:
    """The worker forks only for a token the daemon gave a leased command: another process
    of ours connecting to its socket with any other token is refused, and nothing runs."""
    import socket as socketlib

    from krex.core import wire

    st = pool.status()
    assert st is not None
    listen = next(pool.socket.parent.glob(pool.socket.name + ".w*"))
    marker = tmp_path / "ran"
    job = {
        "token": "0" * 32,
        "invocation": {"kind": "code", "target": f"open({str(marker)!r}, 'w')", "args": []},
        "cwd": str(tmp_path),
        "env": {},
    }
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(listen))
    try:  # a process with no job is not read from: closed, maybe before it sent (a reset)
        wire.send_frame(s, job, [0, 1, 2])
        msg, _ = wire.recv_frame(s)
    except ConnectionError:
        msg = None
    s.close()
    assert msg is None, "refused: the connection closes with no child's pid"
    time.sleep(0.5)
    assert not marker.exists()
    assert "refused a client: no job for its token" in pool.log.read_text()
    assert krun(pool, tmp_path, "pass\n").report["pool"] == "warm", "the worker serves on"


def test_a_daemon_that_stops_its_workers_does_not_warn_of_it(tmp_path: Path) -> None:
    """`krex daemon stop` ends the pool's workers itself: their ends are logged as stopped,
    not warned of as if they had died (every clean stop on the H200 left such warnings); a
    worker killed while the daemon runs is still warned of."""
    import psutil

    d = Daemon(tmp_path / "krex.sock", "--pool", "2")
    d.start()
    try:
        wait_pool_ready(d, 2)
        assert d.proc is not None
        workers = [
            c for c in psutil.Process(d.proc.pid).children() if "krex.pool.worker" in c.cmdline()
        ]
        assert len(workers) == 2
        workers[0].kill()
        deadline = time.monotonic() + 30
        while "ended (status" not in d.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        wait_pool_ready(d, 2)  # its replacement
    finally:
        d.stop()
    log = d.log.read_text()
    assert log.count("WARNING pool worker") == 1 and "ended (status -9)" in log, log
    assert log.count("stopped (status") == 2, log


def test_workers_still_starting_when_the_daemon_stops_are_not_failures(tmp_path: Path) -> None:
    """A worker still importing its preloads when the daemon stops is ended by the stop, not
    dead before it was ready: no warning, no failure counted."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "slowpreload.py").write_text("import time\ntime.sleep(60)\n")
    d = preloading_daemon(tmp_path, modules, ["slowpreload"])
    try:
        st = d.status()
        assert st is not None and st["gpus"][0]["pool"]["starting"] == 1, st
    finally:
        d.stop()
    log = d.log.read_text()
    assert "WARNING" not in log and "stopped (status" in log, log
