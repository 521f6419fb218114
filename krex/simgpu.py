"""The simulated GPU's driver API through ctypes, for Python tenants (demo, bench suite).

Every attribute access on the library is a dlsym on libcuda's handle, so under krex the shim
sees these calls exactly as it sees a framework's. On the simulated GPU a kernel's run time in
nanoseconds is its first parameter.
"""

from __future__ import annotations

import ctypes
import time
from ctypes import byref, c_int, c_uint, c_uint64, c_void_p


class SimGPU:
    """The driver API through ctypes (each attribute is a dlsym on libcuda's handle)."""

    def __init__(self) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._ok(self.cu.cuInit(0))
        dev, self.ctx = c_int(), c_void_p()
        self._ok(self.cu.cuDeviceGet(byref(dev), 0))
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
