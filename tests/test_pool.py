"""The warm worker pool on the simulated GPU: a command run warm behaves as if it ran alone.

Each test has its own daemon with a pool (`krex daemon --pool N`); commands are Python scripts
run with this interpreter, so they can run warm; `--report` says whether they did.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import KREX, Counter, Daemon, assert_frozen_for_the_region

from krex.pool import plan


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "krex.sock", "--pool", "1")
    d.start()
    wait_idle(d, 1)
    try:
        yield d
    finally:
        d.stop()


def wait_idle(d: Daemon, n: int, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = d.status()
        assert st is not None
        p = st["gpus"][0]["pool"]
        if p["idle"] >= n:
            return dict(p)
        time.sleep(0.05)
    raise AssertionError(f"no {n} idle worker(s): {d.status()}\n{d.log.read_text()[-3000:]}")


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
                      "leftover": leftover, "pid": os.getpid(),
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
    assert len({o["pid"] for o in outs}) == 1, "one worker ran all three"
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
    """Each command's regions are its own tenant's (krex.markers reads the tenant once per
    process: a worker runs many). A region in a process that measured for an earlier command
    carries the process_history warning (docs/results/h200-fidelity/), in the report too; a
    command's own second region does not."""
    script = """
        import os, krex
        names = []
        for _ in range(2):
            with krex.region():
                pass
            names.append(",".join(w["name"] for w in krex.last_region()["warnings"]) or "-")
        print(os.getpid(), os.environ["KREX_TENANT"], krex.last_region()["clean"], *names)
    """
    outs = []
    for _ in range(3):
        r = krun(pool, tmp_path, script)
        assert r.rc == 0 and r.report["pool"] == "warm", r.err
        assert len(r.report["regions"]) == 2, r.report
        outs.append(r.out.split())
        reported = [[w["name"] for w in g["warnings"]] for g in r.report["regions"]]
        assert reported == [[] if len(outs) == 1 else ["process_history"]] * 2, reported
    assert len({o[0] for o in outs}) == 1 and len({o[1] for o in outs}) == 3
    assert all(o[2] == "True" for o in outs)
    assert [o[3:] for o in outs] == [["-", "-"]] + [["process_history"] * 2] * 2


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
    [("import os\nos._exit(7)\n", 7), ("import ctypes\nctypes.string_at(0)\n", 128 + 11)],
    ids=["os._exit", "segfault"],
)
def test_a_dying_command_gives_its_status_and_the_worker_is_replaced(
    pool: Daemon, tmp_path: Path, script: str, status: int
) -> None:
    first = krun(pool, tmp_path, "import os\nprint(os.getpid())\n")
    r = krun(pool, tmp_path, script)
    assert (r.rc, r.report["pool"], r.report["exit_code"]) == (status, "warm", status), r.err
    wait_idle(pool, 1)
    after = krun(pool, tmp_path, "import os\nprint(os.getpid())\n")
    assert after.report["pool"] == "warm" and after.out != first.out, "a new worker"
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
    # The worker survived both: the next command runs warm in it.
    assert krun(pool, tmp_path, "pass\n").report["pool"] == "warm"


def test_hygiene_between_commands(pool: Daemon, tmp_path: Path) -> None:
    """Signal handlers, environment, cwd and sys.path are restored; a command that leaves a
    thread running retires its worker."""
    r = krun(
        pool,
        tmp_path,
        """
        import os, signal, sys
        signal.signal(signal.SIGUSR1, lambda *a: None)
        os.environ["LEAK"] = "1"
        sys.path.insert(0, "/leak")
        os.chdir("/")
        print(os.getpid())
        """,
    )
    assert r.rc == 0 and r.report["pool"] == "warm"
    r2 = krun(
        pool,
        tmp_path,
        """
        import os, signal, sys
        print(os.getpid())
        print(signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL, "LEAK" in os.environ,
              "/leak" in sys.path, os.getcwd())
        """,
    )
    assert r2.out.splitlines() == [r.out.strip(), f"True False False {tmp_path}"], r2.err
    r3 = krun(
        pool,
        tmp_path,
        """
        import os, threading, time
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        print(os.getpid())
        """,
    )
    assert r3.rc == 0 and r3.out == r.out, "same worker, which then retires"
    wait_idle(pool, 1)
    r4 = krun(pool, tmp_path, "import os\nprint(os.getpid())\n")
    assert r4.report["pool"] == "warm" and r4.out != r.out, "a new worker replaced it"


EXTENSION_C = """
#include <Python.h>
static PyObject *launch(PyObject *self, PyObject *args) { Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"launch", launch, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&def); }
"""

LOAD_EXTENSION = """
import importlib.util, os, sys
name, path = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location(name, path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules[name] = module
module.launch()
print(os.getpid())
"""


def extension(tmp: Path, name: str, tag: str) -> Path:
    """A native extension module `name`, built into a directory of its own (as Triton builds a
    launcher per kernel into the command's cache)."""
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


def test_triton_launchers_keep_the_worker_other_native_code_retires_it(
    pool: Daemon, tmp_path: Path
) -> None:
    """A command that loads Triton's per-kernel launcher extension (`__triton_launcher`) leaves
    its worker warm for the next; one that loads any other native module retires it."""
    pids = []
    for i, name in enumerate(["__triton_launcher", "__triton_launcher", "other_native"]):
        so = extension(tmp_path, name, str(i))
        r = krun(pool, tmp_path, LOAD_EXTENSION, name, str(so))
        assert r.rc == 0 and r.report["pool"] == "warm", (r.err, r.report)
        pids.append(r.out.strip())
    assert pids[0] == pids[1] == pids[2], "the launchers did not retire the worker"
    wait_idle(pool, 1)
    r = krun(pool, tmp_path, "import os\nprint(os.getpid())\n")
    assert r.report["pool"] == "warm" and r.out.strip() != pids[0], "other native code retires it"


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
    assert r.report["pool"] == "cold" and "--auto-regions" in r.report["pool_reason"]


def test_plan_reasons() -> None:
    py = sys.executable
    env = dict(os.environ)
    ok = plan([py, "b.py", "x"], env, py, {})
    assert ok.warm and ok.invocation is not None and ok.invocation.args == ["x"]
    assert not plan([py, "-X", "dev", "b.py"], env, py, {}).warm
    assert "interactive" in plan([py], env, py, {}).reason
    assert "-m without" in plan([py, "-m"], env, py, {}).reason
    w = plan([py, "-W", "error", "-uB", "b.py"], env, py, {})
    assert w.warm and w.invocation is not None
    assert (w.invocation.warnings, w.invocation.unbuffered, w.invocation.dont_write_bytecode) == (
        ["error"],
        True,
        True,
    )
    assert "another interpreter" in plan(["/bin/sh", "b.py"], env, py, {}).reason or (
        plan(["/bin/sh", "b.py"], env, py, {}).reason == "not a Python command"
    )
    other = plan([py, "b.py"], {**env, "CUDA_LAUNCH_BLOCKING": "1"}, py, {})
    assert not other.warm and "CUDA_LAUNCH_BLOCKING" in other.reason
    unset = plan([py, "b.py"], {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}, py,
                 {"OMP_NUM_THREADS": "4"})  # fmt: skip
    assert not unset.warm and "OMP_NUM_THREADS" in unset.reason
    assert plan([py, "b.py"], {**env, "CUDA_VISIBLE_DEVICES": "3"}, py, {}).warm  # ours


@pytest.mark.slow
def test_warm_latency_does_not_grow_with_concurrency(tmp_path: Path) -> None:
    """With the simulated node-wide context lock at 100 ms, 16 cold commands at once queue on
    it; warm ones already hold their context."""
    env = {**os.environ, "KREX_SIM_CTX_CREATE_MS": "100"}
    old = os.environ.copy()
    os.environ.update(env)
    try:
        d = Daemon(tmp_path / "krex.sock", "--pool", "16", "--slots", "16")
        d.start()
    finally:
        os.environ.clear()
        os.environ.update(old)
    try:
        wait_idle(d, 16, timeout_s=120)
        script = tmp_path / "ctx.py"
        script.write_text(
            "from krex.simgpu import SimGPU\ng = SimGPU()\ng.launch(1000)\ng.sync()\n"
        )

        def batch(n: int, no_pool: bool) -> list[float]:
            walls: list[float] = [0.0] * n

            def one(i: int) -> None:
                rep = tmp_path / f"r-{no_pool}-{n}-{i}.json"
                p = subprocess.run(
                    [*KREX, "run", "--sim", "--socket", str(d.socket), "--report", str(rep),
                     *(["--no-pool"] if no_pool else []), "--", sys.executable, str(script)],
                    env=env, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert p.returncode == 0, p.stderr
                r = json.loads(rep.read_text())
                assert r["pool"] == ("cold" if no_pool else "warm"), r
                walls[i] = r["wall_s"]

            errors: list[BaseException] = []

            def guarded(i: int) -> None:
                try:
                    one(i)
                except BaseException as e:  # re-raised in the test's thread
                    errors.append(e)

            threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            wait_idle(d, 16, timeout_s=120)
            return walls

        warm1 = statistics.median(batch(1, False) + batch(1, False) + batch(1, False))
        warm16 = statistics.median(batch(16, False))
        cold1 = statistics.median(batch(1, True) + batch(1, True) + batch(1, True))
        cold16 = statistics.median(batch(16, True))
        print(
            f"warm 1: {warm1:.3f} s, warm 16: {warm16:.3f} s; cold 1: {cold1:.3f}, 16: {cold16:.3f}"
        )
        # 16 contexts one after another take 1.6 s: cold commands wait for them.
        assert cold16 > cold1 + 0.5
        # Warm commands create none: what they wait for is this 2-core machine, not the lock.
        assert warm16 < cold16 - 0.5
        assert warm16 < warm1 + 0.5 * (cold16 - cold1)
    finally:
        d.stop()


def test_a_warm_sibling_makes_no_progress_while_a_warm_region_is_held(tmp_path: Path) -> None:
    """Workers follow the region protocol like any tenant: the owner's worker holds the GPU,
    the sibling's worker (in the sibling's cgroup) is frozen for the region's life."""
    d = Daemon(tmp_path / "krex.sock", "--pool", "2")
    d.start()
    try:
        wait_idle(d, 2)
        sib = Counter(d)
        try:
            assert_frozen_for_the_region(d, sib, 1.0)
            st = d.status()
            assert st is not None and st["gpus"][0]["pool"]["warm_runs"] == 2, st
        finally:
            sib.stop()
    finally:
        d.stop()


def test_a_warm_command_maps_the_gates_read_only_and_its_workers_slots(
    pool: Daemon, tmp_path: Path
) -> None:
    """Warm, as cold: the gates' segment read-only; the only writable krex segment is the
    worker's own slot segment (no other worker's, no other tenant's)."""
    script = """
        import json
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
    """Without cgroups a group is a set of process trees: a leased worker leaves the pool's set
    (else a region of its own command would stop it with the pool) and comes back after."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('[freezer]\nbackend = "signal"\n')
    d = Daemon(tmp_path / "krex.sock", "--config", str(cfg), "--pool", "2")
    d.start()
    try:
        wait_idle(d, 2)
        sib = Counter(d)
        try:
            for _ in range(2):  # the second time in a worker that has been through a lease
                assert_frozen_for_the_region(d, sib, 0.5)
        finally:
            sib.stop()
        st = d.status()
        assert (
            st is not None and st["freezer"] == "signal" and st["gpus"][0]["pool"]["warm_runs"] >= 3
        )
    finally:
        d.stop()
