"""Worker processes on a private simulated node, for the simulated driver's device-memory tests
(tests/test_sim_mem.py, tests/test_sim_driver_mem.py; imported as `sim_workers`, as conftest
is).

A worker is a Python process of the node (ctypes against the built krex/_lib/sim/libcuda.so.1,
through krex.sim.simgpu.SimGPU) that runs one statement or expression per stdin line and answers
one JSON line. In it: `g`, the SimGPU made at its start (None for a worker started with
open_gpu=False, which has made no driver call yet), `cu` the library, the helpers below, and
the test file's own prelude. The node (a unique KREX_SIM_SHM) is removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from krex.core.paths import sim_library_dir

ROOT = Path(__file__).resolve().parents[1]

_HEAD = r"""
import ctypes, json, sys
from ctypes import byref, c_int, c_size_t, c_uint, c_ubyte, c_ushort, c_uint64, c_void_p
from krex.sim.simgpu import SimDriverError, SimGPU, SimOutOfMemory

g = SimGPU() if sys.argv[1] == "open" else None
cu = g.cu if g else ctypes.CDLL("libcuda.so.1")

def used():
    free, total = g.mem_info()
    return total - free

def try_alloc(n):
    try:
        return g.alloc(n)
    except SimOutOfMemory:
        return "oom"

def oom(stmt):
    # Run a statement: None when it succeeds, the name of the call that ran out of memory.
    try:
        exec(stmt, ns)
    except SimOutOfMemory as e:
        return e.call
    return None

def fails(stmt):
    # Run a statement: None when it succeeds, [exception, call, CUresult] when a call failed.
    try:
        exec(stmt, ns)
    except SimDriverError as e:
        return [type(e).__name__, e.call, e.result]
    return None

def rc_alloc(fn, *args):
    p = c_uint64()
    rc = fn(byref(p), *args)
    return [rc, p.value]

def lookup(name, version=12000, flags=0):
    fn, st = c_void_p(), c_int(-1)
    rc = cu.cuGetProcAddress_v2(name.encode(), byref(fn), c_int(version), c_uint64(flags),
                                byref(st))
    return [rc, st.value, fn.value]

def addr(name):
    return ctypes.cast(getattr(cu, name), c_void_p).value
"""

# Statements run in the script's own globals, so that the helpers see what they assign (a
# worker started without `g` makes it with "g = SimGPU()").
_LOOP = r"""
ns = globals()
print(json.dumps({"ok": "ready"}), flush=True)
for line in sys.stdin:
    try:
        try:
            code = compile(line, "<cmd>", "eval")
        except SyntaxError:
            exec(line, ns)
            v = None
        else:
            v = eval(code, ns)
        print(json.dumps({"ok": v}), flush=True)
    except Exception as e:
        print(json.dumps({"err": f"{type(e).__name__}: {e}"}), flush=True)
"""


class Worker:
    """A process of the simulated node, driven line by line."""

    def __init__(self, env: dict[str, str], prelude: str = "", open_gpu: bool = True) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HEAD + prelude + _LOOP, "open" if open_gpu else "closed"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._read() == "ready"

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            assert self.proc.stderr is not None
            raise AssertionError(f"worker died: {self.proc.stderr.read()[-2000:]}")
        reply = json.loads(line)
        if "err" in reply:
            raise AssertionError(reply["err"])
        return reply["ok"]

    def __call__(self, cmd: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


class SimNode:
    def __init__(self, shm: str, prelude: str = "") -> None:
        self.shm = shm
        self.prelude = prelude
        self.workers: list[Worker] = []

    def env(self, **extra: str) -> dict[str, str]:
        # Nothing of the caller's that changes the driver's behaviour: not even its module
        # loading mode (CI on a GPU machine may set CUDA_MODULE_LOADING).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(
                ("KREX_", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES", "CUDA_MODULE_LOADING")
            )
        }
        env.update(
            LD_LIBRARY_PATH=str(sim_library_dir()),
            KREX_SIM_SHM=self.shm,
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env

    def worker(self, open_gpu: bool = True, **extra: str) -> Worker:
        w = Worker(self.env(**extra), self.prelude, open_gpu)
        self.workers.append(w)
        return w


@contextlib.contextmanager
def sim_node(name: str, prelude: str = "") -> Iterator[SimNode]:
    """A private simulated node; its workers are killed and its segment removed afterwards."""
    n = SimNode(f"/krex-sim-{name}-{os.getpid()}-{uuid.uuid4().hex[:10]}", prelude)
    try:
        yield n
    finally:
        for w in n.workers:
            with contextlib.suppress(Exception):
                w.proc.kill()
            w.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{n.shm[1:]}")
