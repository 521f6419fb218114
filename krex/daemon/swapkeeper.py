"""The swap keeper: takes a waiting command's device memory off the GPU and puts it back, with
the driver's checkpoint API (docs/memory.md, "Deadlocks end by a swap where the driver can").

Run by the daemon as `python -m krex.daemon.swapkeeper [--sim-shm NAME] PID...`, one keeper
per command taken off, so that the daemon never loads the CUDA driver itself, and so that a
command is never left locked by a daemon that died: the keeper outlives it and puts the
command back as soon as its memory fits (else, after `--orphan-s`, kills it: a locked process
could never go on).

It locks every process (at most `--lock-timeout-ms` each: a process inside a driver call
cannot be locked until the call returns, and then nothing is taken), checkpoints each (its
device memory goes to host memory, the GPU's is freed), and says so on stdout, one JSON line
per event:
  {"event": "out", "s": seconds}                  off the GPU
  {"event": "refused", "why": ..., "rc": CUresult} nothing taken: every process left running
  {"event": "failed", "why": ..., "rc": CUresult}  taken part-way and not put back
Then it reads stdin lines: `restore` puts every process back (restored, unlocked):
  {"event": "in", "s": seconds}                   back on the GPU and running; the keeper ends
  {"event": "short", "rc": CUresult}              the GPU had no room: still off, ask again
`drop` ends the keeper and leaves the processes as they are (the daemon killed them).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Callable

SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
NOT_SUPPORTED = 801
NOT_FOUND = 500
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3
_ARGS = 64  # every checkpoint call's optional argument struct is 64 bytes (cuda.h)

# (op, pid, timeout_ms) -> (CUresult, the process's state after; -1 where not known)
Op = Callable[[str, int, int], tuple[int, int]]


def driver_ops() -> Op:
    """The real driver's cuCheckpointProcess* (CUDA 12.8+; NOT_FOUND where this driver has
    none)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuInit(0)  # restore needs cuInit (or persistence mode) in the caller
    if rc != SUCCESS:
        raise OSError(f"cuInit failed with CUresult {rc}")
    names = {
        "lock": "cuCheckpointProcessLock",
        "checkpoint": "cuCheckpointProcessCheckpoint",
        "restore": "cuCheckpointProcessRestore",
        "unlock": "cuCheckpointProcessUnlock",
        "state": "cuCheckpointProcessGetState",
    }
    fns = {op: getattr(cuda, name, None) for op, name in names.items()}

    def call(op: str, pid: int, timeout_ms: int) -> tuple[int, int]:
        fn, get = fns[op], fns["state"]
        if fn is None or get is None:
            return NOT_FOUND, -1
        rc = SUCCESS
        if op != "state":
            args = (ctypes.c_ubyte * _ARGS)()
            if op == "lock":
                ctypes.c_uint.from_buffer(args).value = timeout_ms
            rc = int(fn(ctypes.c_int(pid), args))
        st = ctypes.c_int(-1)
        got = int(get(ctypes.c_int(pid), ctypes.byref(st)))
        return (got if op == "state" else rc), (st.value if got == SUCCESS else -1)

    return call


def sim_ops(shm: str) -> Op:
    """The simulated driver's model of the same calls (shim/sim, docs/simulator.md)."""
    from krex.sim import simgpu

    def call(op: str, pid: int, timeout_ms: int) -> tuple[int, int]:
        return simgpu.checkpoint(shm, op, pid, timeout_ms)

    return call


def _state(ops: Op, pid: int) -> int:
    return ops("state", pid, 0)[1]


def _say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take_off(ops: Op, pids: list[int], lock_timeout_ms: int) -> tuple[int, str]:
    """Lock every process, then checkpoint each. (SUCCESS, "") when all are off the GPU; else
    the CUresult and why, having put back what it could (locked ones unlocked)."""
    locked: list[int] = []
    for pid in pids:
        rc = ops("lock", pid, lock_timeout_ms)[0]
        if rc != SUCCESS:
            for p in locked:
                ops("unlock", p, 0)
            return rc, f"process {pid} could not be locked (CUresult {rc})"
        locked.append(pid)
    done: list[int] = []
    for pid in pids:
        rc = ops("checkpoint", pid, 0)[0]
        if rc != SUCCESS:
            back = [p for p in done if ops("restore", p, 0)[0] == SUCCESS]
            for p in [*back, *[p for p in pids if p not in done]]:
                ops("unlock", p, 0)
            return rc, f"process {pid} could not be checkpointed (CUresult {rc})"
        done.append(pid)
    return SUCCESS, ""


def put_back(ops: Op, pids: list[int]) -> int:
    """Restore and unlock every process. OUT_OF_MEMORY (every process left off the GPU, as
    before) when the GPU has no room; a dead process counts as put back."""
    restored: list[int] = []
    for pid in pids:
        if not _alive(pid):
            continue
        rc = ops("restore", pid, 0)[0] if _state(ops, pid) == CHECKPOINTED else SUCCESS
        if rc != SUCCESS and _alive(pid):
            for p in restored:  # all or none: a half-restored command is no better than none
                ops("checkpoint", p, 0)
            return rc
        restored.append(pid)
    for pid in pids:
        if _alive(pid) and _state(ops, pid) == LOCKED:
            ops("unlock", pid, 0)
    return SUCCESS


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _nap() -> None:
    time.sleep(1.0)


def _orphaned(ops: Op, pids: list[int], orphan_s: float) -> int:
    """The daemon is gone: put the command back as soon as its memory fits; after orphan_s,
    kill it (locked, it could never go on)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < orphan_s:
        if put_back(ops, pids) == SUCCESS:
            return 0
        _nap()
    for pid in pids:
        if _alive(pid):
            _kill(pid)
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m krex.daemon.swapkeeper")
    ap.add_argument("pids", type=int, nargs="+")
    ap.add_argument("--sim-shm", default="", help="the simulated node's segment")
    ap.add_argument("--lock-timeout-ms", type=int, default=500)
    ap.add_argument("--orphan-s", type=float, default=600.0)
    a = ap.parse_args(argv)
    try:
        ops = sim_ops(a.sim_shm) if a.sim_shm else driver_ops()
    except OSError as e:
        _say(event="refused", why=f"no CUDA driver to checkpoint with: {e}", rc=NOT_FOUND)
        return 3
    t0 = time.monotonic()
    rc, why = take_off(ops, a.pids, a.lock_timeout_ms)
    if rc != SUCCESS:
        gone = any(_state(ops, p) in (CHECKPOINTED, FAILED) for p in a.pids if _alive(p))
        _say(event="failed" if gone else "refused", why=why, rc=rc)
        return 4 if gone else 3
    _say(event="out", s=round(time.monotonic() - t0, 4))
    for line in sys.stdin:
        word = line.strip()
        if word == "drop":
            return 0
        if word != "restore":
            continue
        t1 = time.monotonic()
        rc = put_back(ops, a.pids)
        if rc == SUCCESS:
            _say(event="in", s=round(time.monotonic() - t1, 4))
            return 0
        if rc != OUT_OF_MEMORY:
            _say(event="failed", why=f"the restore failed (CUresult {rc})", rc=rc)
            return 4
        _say(event="short", rc=rc)
    return _orphaned(ops, a.pids, a.orphan_s)


if __name__ == "__main__":
    sys.exit(main())
