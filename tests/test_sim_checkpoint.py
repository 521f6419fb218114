"""The driver's checkpoint API on the simulated GPU (shim/sim/sim_ckpt.c, docs/simulator.md):
lock, checkpoint, restore and unlock of one process of a node by another, through
krexsim_checkpoint (krex.sim.simgpu.checkpoint, what the daemon uses) and through the
cuCheckpointProcess* entry points of cuda.h.

Workers are processes of a private simulated node (sim_workers.py). The modelled checkpoint and
restore times are made small here; nothing is asserted about how soon anything happens, only
that what must wait does (lower bounds) and that what must happen does (polled, with time-outs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import until
from sim_workers import ROOT, SimNode, Worker, sim_node

from krex.sim import simgpu
from krex.sim.simgpu import (
    CU_PROCESS_STATE_CHECKPOINTED,
    CU_PROCESS_STATE_LOCKED,
    CU_PROCESS_STATE_RUNNING,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_OUT_OF_MEMORY,
)

GiB = 1 << 30
MiB = 1 << 20
NOT_SUPPORTED = 801
RUNNING, LOCKED, CHECKPOINTED = (
    CU_PROCESS_STATE_RUNNING,
    CU_PROCESS_STATE_LOCKED,
    CU_PROCESS_STATE_CHECKPOINTED,
)
FAST = {"KREX_SIM_CHECKPOINT_S_PER_GIB": "0.002", "KREX_SIM_RESTORE_S_PER_GIB": "0.002"}

# The workers' helpers: cuda.h's checkpoint structs and calls, content checks, a driver call in
# a thread of its own (to see it wait while its process is locked).
_PRELUDE = r"""
import threading

class LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", c_uint), ("reserved0", c_uint), ("reserved1", c_uint64 * 7)]

class RestoreArgs(ctypes.Structure):
    _fields_ = [("gpuPairs", c_void_p), ("gpuPairsCount", c_uint), ("reserved", c_ubyte * 44),
                ("reserved1", c_uint64)]

def ck_state(pid):
    st = c_int(-1)
    rc = cu.cuCheckpointProcessGetState(c_int(pid), byref(st))
    return [rc, st.value]

def ck_lock(pid, timeout_ms=None):
    if timeout_ms is None:
        return cu.cuCheckpointProcessLock(c_int(pid), None)
    args = LockArgs()
    args.timeoutMs = timeout_ms
    return cu.cuCheckpointProcessLock(c_int(pid), byref(args))

def ck(name, pid):
    return getattr(cu, "cuCheckpointProcess" + name)(c_int(pid), None)

PATTERN = bytes((i * 7 + 3) & 0xFF for i in range(4096))

def put(ptr):
    src = (c_ubyte * len(PATTERN)).from_buffer_copy(PATTERN)
    return cu.cuMemcpyHtoD_v2(c_uint64(ptr), src, c_size_t(len(PATTERN)))

def same(ptr):
    back = (c_ubyte * len(PATTERN))()
    rc = cu.cuMemcpyDtoH_v2(back, c_uint64(ptr), c_size_t(len(PATTERN)))
    return rc == 0 and bytes(back) == PATTERN

bg = {}

def in_thread(stmt):
    # Run a statement in a thread of its own; bg says when it started and how it ended.
    def run():
        cu.cuCtxSetCurrent(g.ctx)  # contexts are current per thread
        bg["started"] = True
        try:
            exec(stmt, ns)
            bg["done"] = "ok"
        except Exception as e:
            bg["done"] = repr(e)
    bg.clear()
    threading.Thread(target=run, daemon=True).start()
"""


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimNode]:
    for k, v in FAST.items():  # krexsim_checkpoint reads them from this process
        monkeypatch.setenv(k, v)
    with sim_node("ckpt", _PRELUDE) as n:
        yield n


def ckpt(n: SimNode, op: str, w: Worker | int, timeout_ms: int = 0) -> tuple[int, int]:
    pid = w if isinstance(w, int) else w.proc.pid
    return simgpu.checkpoint(n.shm, op, pid, timeout_ms)


def users(n: SimNode) -> dict[int, int]:
    got = simgpu.mem_users(n.shm, 0)
    assert got is not None
    return got


def test_checkpoint_frees_the_gpu_and_restore_needs_room(node: SimNode) -> None:
    """The daemon's use: a checkpointed process's memory is off the GPU (gone from the
    per-process list, free for others); its restore waits for room; content survives."""
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    b = node.worker()
    pa = a("g.alloc(5 << 30)")
    assert a(f"put({pa})") == 0
    assert b("try_alloc((3 << 30) + 1)") == "oom"
    assert ckpt(node, "state", a) == (0, RUNNING)
    assert ckpt(node, "lock", a) == (0, LOCKED)
    assert ckpt(node, "checkpoint", a) == (0, CHECKPOINTED)
    assert a.proc.pid not in users(node)
    assert b("used()") == 0
    pb = b("g.alloc(4 << 30)")  # what a held is free now
    # No room for a's 5 GiB while b holds 4 of 8: a stays checkpointed, nothing charged.
    assert ckpt(node, "restore", a) == (CUDA_ERROR_OUT_OF_MEMORY, CHECKPOINTED)
    assert users(node) == {b.proc.pid: 4 * GiB}
    b(f"g.free({pb})")
    assert ckpt(node, "restore", a) == (0, LOCKED)
    assert users(node) == {a.proc.pid: 5 * GiB}
    assert b("try_alloc((3 << 30) + 1)") == "oom"  # charged again, node-wide
    assert ckpt(node, "unlock", a) == (0, RUNNING)
    assert a(f"same({pa})")
    a(f"g.free({pa})")
    assert users(node) == {}


def test_checkpoint_and_restore_take_the_modelled_time(
    node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KREX_SIM_CHECKPOINT_S_PER_GIB", "0.4")
    monkeypatch.setenv("KREX_SIM_RESTORE_S_PER_GIB", "0.2")
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    a("g.alloc(1 << 30)")
    assert ckpt(node, "lock", a) == (0, LOCKED)
    t0 = time.monotonic()
    assert ckpt(node, "checkpoint", a) == (0, CHECKPOINTED)
    t1 = time.monotonic()
    assert ckpt(node, "restore", a) == (0, LOCKED)
    t2 = time.monotonic()
    assert t1 - t0 >= 0.4 and t2 - t1 >= 0.2
    assert ckpt(node, "unlock", a) == (0, RUNNING)


def test_a_locked_process_s_calls_wait_for_the_unlock(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    a("p = g.alloc(1 << 30)")
    assert ckpt(node, "lock", a) == (0, LOCKED)
    a("in_thread('p2 = g.alloc(1 << 20)')")
    until(lambda: a("bg.get('started')"), what="the thread's start")
    time.sleep(0.3)
    assert a("bg.get('done')") is None  # still inside cuMemAlloc_v2
    # Calls that touch nothing shared go on (docs/simulator.md), and so do the checkpoint
    # calls, even of the locked process itself.
    assert a("cu.cuDeviceGetCount(byref(c_int()))") == 0
    assert a(f"ck_state({a.proc.pid})") == [0, LOCKED]
    assert ckpt(node, "checkpoint", a) == (0, CHECKPOINTED)
    assert ckpt(node, "restore", a) == (0, LOCKED)
    assert a("bg.get('done')") is None
    assert ckpt(node, "unlock", a) == (0, RUNNING)
    until(lambda: a("bg.get('done')"), what="the allocation after the unlock")
    assert a("bg['done']") == "ok"
    assert users(node) == {a.proc.pid: GiB + MiB}


def test_lock_waits_for_the_process_s_work(node: SimNode) -> None:
    """A process with a job queued or running is inside the driver: a lock with a timeout
    gives up (NOT_READY, still RUNNING), one without waits until the work is done."""
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    a("g.alloc(1 << 20)")
    a("g.launch(3_600_000_000_000)")  # an hour
    assert ckpt(node, "lock", a, timeout_ms=100) == (CUDA_ERROR_NOT_READY, RUNNING)
    assert ckpt(node, "state", a) == (0, RUNNING)
    b = node.worker(KREX_SIM_MEM_BYTES="8G")
    b("g.alloc(1 << 20)")
    t0 = time.monotonic()
    b("g.launch(1_000_000_000)")  # 1 s, queued after t0
    assert ckpt(node, "lock", b) == (0, LOCKED)
    assert time.monotonic() - t0 >= 1.0  # not before the kernel's end
    b("in_thread('g.sync()')")  # nothing left to wait for, but the call itself waits
    until(lambda: b("bg.get('started')"), what="the thread's start")
    time.sleep(0.2)
    assert b("bg.get('done')") is None
    assert ckpt(node, "unlock", b) == (0, RUNNING)
    until(lambda: b("bg.get('done')") == "ok", what="the sync after the unlock")
    # Through cuda.h's entry point too, from another process of the node.
    assert b(f"ck_lock({a.proc.pid}, 100)") == CUDA_ERROR_NOT_READY
    assert b(f"ck_state({a.proc.pid})") == [0, RUNNING]


def test_illegal_transitions(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    a("g.alloc(1 << 20)")
    for op in ("checkpoint", "restore", "unlock"):
        assert ckpt(node, op, a) == (CUDA_ERROR_ILLEGAL_STATE, RUNNING), op
    assert ckpt(node, "lock", a) == (0, LOCKED)
    for op in ("lock", "restore"):
        assert ckpt(node, op, a) == (CUDA_ERROR_ILLEGAL_STATE, LOCKED), op
    assert ckpt(node, "checkpoint", a) == (0, CHECKPOINTED)
    for op in ("lock", "checkpoint", "unlock"):
        assert ckpt(node, op, a) == (CUDA_ERROR_ILLEGAL_STATE, CHECKPOINTED), op
    assert ckpt(node, "restore", a) == (0, LOCKED)
    assert ckpt(node, "unlock", a) == (0, RUNNING)
    # A live process holding no device memory: RUNNING, and nothing to lock.
    idle = node.worker()
    assert ckpt(node, "state", idle) == (0, RUNNING)
    assert ckpt(node, "lock", idle) == (CUDA_ERROR_INVALID_VALUE, -1)
    assert ckpt(node, "state", 0) == (CUDA_ERROR_INVALID_VALUE, -1)
    assert simgpu.checkpoint("/krex-sim-no-such-node", "state", os.getpid()) == (
        CUDA_ERROR_NOT_INITIALIZED,
        -1,
    )


def test_a_killed_checkpointed_process_is_dropped(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    b = node.worker()
    a("g.alloc(6 << 30)")
    assert ckpt(node, "lock", a) == (0, LOCKED)
    assert ckpt(node, "checkpoint", a) == (0, CHECKPOINTED)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=30)
    for op in ("state", "restore", "unlock"):
        assert ckpt(node, op, a) == (CUDA_ERROR_INVALID_VALUE, -1), op
    assert b("g.alloc(8 << 30)")  # the whole GPU: nothing of a's is left
    assert users(node) == {b.proc.pid: 8 * GiB}


def test_the_daemon_s_calls_leave_nothing_mapped(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    a("g.alloc(1 << 20)")
    for _ in range(200):
        assert ckpt(node, "state", a) == (0, RUNNING)
    maps = Path("/proc/self/maps").read_text()
    assert node.shm[1:] not in maps


def test_the_cuda_h_entry_points(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="8G")
    b = node.worker(
        KREX_SIM_CHECKPOINT_S_PER_GIB=FAST["KREX_SIM_CHECKPOINT_S_PER_GIB"],
        KREX_SIM_RESTORE_S_PER_GIB=FAST["KREX_SIM_RESTORE_S_PER_GIB"],
    )
    pa = a("g.alloc(2 << 30)")
    assert a(f"put({pa})") == 0
    pid = a.proc.pid
    names = ("GetState", "Lock", "Checkpoint", "Restore", "Unlock", "GetRestoreThreadId")
    for name in names:
        full = "cuCheckpointProcess" + name
        assert b(f"lookup('{full}', 12080)") == [0, 0, b(f"addr('{full}')")], name
        assert b(f"lookup('{full}', 12060)")[:2] == [500, 2], name
    assert b(f"ck_state({pid})") == [0, RUNNING]
    assert b(f"ck_lock({pid})") == 0
    assert b(f"ck('Checkpoint', {pid})") == 0
    assert b(f"ck_state({pid})") == [0, CHECKPOINTED]
    assert pid not in users(node)
    b("ra = RestoreArgs(); ra.gpuPairs = 1; ra.gpuPairsCount = 1")
    assert b(f"cu.cuCheckpointProcessRestore(c_int({pid}), byref(ra))") == NOT_SUPPORTED
    assert b(f"ck('Restore', {pid})") == 0
    assert b(f"ck('Lock', {pid})") == CUDA_ERROR_ILLEGAL_STATE
    assert b(f"ck('Unlock', {pid})") == 0
    assert b(f"cu.cuCheckpointProcessGetRestoreThreadId(c_int({pid}), byref(c_int()))") == (
        NOT_SUPPORTED
    )
    assert b(f"ck_state({os.getpid() + 10_000_000})") == [CUDA_ERROR_INVALID_VALUE, -1]
    assert a(f"same({pa})")


CUDA_H = Path("/usr/local/cuda/include/cuda.h")


@pytest.mark.skipif(not CUDA_H.exists(), reason=f"no real cuda.h at {CUDA_H}")
def test_the_entry_points_have_cuda_h_s_prototypes() -> None:
    """Compiled against the real cuda.h, each exported alias must have the real prototype
    (SIM_EXPORT declares it with the implementation's type: a mismatch is an error)."""
    subprocess.run(
        [
            os.environ.get("CC", "cc"),
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-DKREX_REAL_CUDA_H",
            f"-I{CUDA_H.parent}",
            "-Ishim",
            "shim/sim/sim_ckpt.c",
        ],
        cwd=ROOT,
        check=True,
    )
