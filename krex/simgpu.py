"""The simulated GPU's driver API through ctypes, for Python tenants (demo, bench suite).

Every attribute access on the library is a dlsym on libcuda's handle, so under krex the shim
sees these calls exactly as it sees a framework's. On the simulated GPU a kernel's run time in
nanoseconds is its first parameter.

Device memory: SimGPU.alloc/free/mem_info/total_mem (cuMemAlloc_v2, cuMemFree_v2,
cuMemGetInfo_v2, cuDeviceTotalMem_v2); an allocation the node's capacity cannot hold raises
SimOutOfMemory. mem_users reads who holds how much on a simulated node (krexsim_mem_users).
"""

from __future__ import annotations

import ctypes
import time
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any

CUDA_ERROR_OUT_OF_MEMORY = 2


class SimOutOfMemory(RuntimeError):
    """An allocation failed with CUDA_ERROR_OUT_OF_MEMORY (the GPU's capacity is short)."""


class SimGPU:
    """The driver API through ctypes (each attribute is a dlsym on libcuda's handle)."""

    def __init__(self) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._ok(self.cu.cuInit(0))
        dev, self.ctx = c_int(), c_void_p()
        self._ok(self.cu.cuDeviceGet(byref(dev), 0))
        self.device = dev.value
        self._ok(self.cu.cuDevicePrimaryCtxRetain(byref(self.ctx), dev))
        self._ok(self.cu.cuCtxSetCurrent(self.ctx))
        mod, self.fn, self.stream = c_void_p(), c_void_p(), c_void_p()
        self._ok(self.cu.cuModuleLoadData(byref(mod), b"krex demo kernel"))
        self._ok(self.cu.cuModuleGetFunction(byref(self.fn), mod, b"spin"))
        self._ok(self.cu.cuStreamCreate(byref(self.stream), 0))
        self.cu.cuLaunchKernel.argtypes = [
            c_void_p,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_void_p,
            c_void_p,
            c_void_p,
        ]

    @staticmethod
    def _ok(rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"driver call failed with CUresult {rc}")

    def launch(self, ns: int) -> None:
        arg = c_uint64(ns)
        params = (c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), c_void_p))
        self._ok(self.cu.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, self.stream, params, None))

    def event(self) -> c_void_p:
        ev = c_void_p()
        self._ok(self.cu.cuEventCreate(byref(ev), 0))
        return ev

    def measure(self, ns: int, reps: int, flush_ns: int = 0) -> list[float]:
        """Event-timed runs of an ns-long kernel. flush_ns > 0 queues a kernel of that length
        before each start event, as do_bench's L2 flush does: the host's launch gap then hides
        behind GPU work, as it does on a real GPU."""
        start, end = self.event(), self.event()
        out = []
        for _ in range(reps):
            if flush_ns:
                self.launch(flush_ns)
            self._ok(self.cu.cuEventRecord(start, self.stream))
            self.launch(ns)
            self._ok(self.cu.cuEventRecord(end, self.stream))
            self._ok(self.cu.cuEventSynchronize(end))
            ms = ctypes.c_float()
            self._ok(self.cu.cuEventElapsedTime(byref(ms), start, end))
            out.append(ms.value)
        return out

    def hammer(self, ns: int, seconds: float) -> None:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            self.launch(ns)
            self.launch(ns)
            self._ok(self.cu.cuStreamSynchronize(self.stream))

    def sync(self) -> None:
        self._ok(self.cu.cuStreamSynchronize(self.stream))

    # ---- Device memory (node-wide on the simulated GPU: see docs/simulator.md). ----

    def alloc(self, nbytes: int) -> int:
        """cuMemAlloc_v2: a device pointer to nbytes; SimOutOfMemory when they do not fit.
        The memory needs no host RAM until touched."""
        ptr = c_uint64()
        rc = self.cu.cuMemAlloc_v2(byref(ptr), c_size_t(nbytes))
        if rc == CUDA_ERROR_OUT_OF_MEMORY:
            raise SimOutOfMemory(f"cuMemAlloc_v2({nbytes}) failed: out of memory")
        self._ok(rc)
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        """cuMemFree_v2."""
        self._ok(self.cu.cuMemFree_v2(c_uint64(ptr)))

    def mem_info(self) -> tuple[int, int]:
        """cuMemGetInfo_v2: (free, total) bytes of this GPU, for the whole node."""
        free, total = c_size_t(), c_size_t()
        self._ok(self.cu.cuMemGetInfo_v2(byref(free), byref(total)))
        return int(free.value), int(total.value)

    def total_mem(self) -> int:
        """cuDeviceTotalMem_v2: the GPU's capacity."""
        total = c_size_t()
        self._ok(self.cu.cuDeviceTotalMem_v2(byref(total), c_int(self.device)))
        return int(total.value)


_mem_lib: Any = None


def mem_users(sim_shm: str, gpu: int, lib_path: str | None = None) -> dict[int, int] | None:
    """Device memory held on simulated GPU `gpu` of node `sim_shm`: {pid: bytes} of the live
    processes holding any (krexsim_mem_users); None when the node cannot be read."""
    global _mem_lib
    try:
        if _mem_lib is None:
            if lib_path is None:
                from krex.paths import sim_library_dir

                lib_path = str(sim_library_dir() / "libcuda.so.1")
            lib = ctypes.CDLL(lib_path)
            lib.krexsim_mem_users.argtypes = [
                ctypes.c_char_p,
                ctypes.c_uint,
                ctypes.POINTER(ctypes.c_int),
                ctypes.POINTER(ctypes.c_ulonglong),
                ctypes.c_int,
            ]
            _mem_lib = lib
        pids = (ctypes.c_int * 512)()
        used = (ctypes.c_ulonglong * 512)()
        n = int(_mem_lib.krexsim_mem_users(sim_shm.encode(), gpu, pids, used, 512))
    except OSError:
        return None
    return {pids[i]: int(used[i]) for i in range(n)} if n >= 0 else None
