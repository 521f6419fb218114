"""The simulated GPU's driver API through ctypes, for Python tenants (demo, bench suite).

Every attribute access on the library is a dlsym on libcuda's handle, so under krex the shim
sees these calls exactly as it sees a framework's. On the simulated GPU a kernel's run time in
nanoseconds is its first parameter.

Device memory: SimGPU.alloc/free/mem_info/total_mem (cuMemAlloc_v2, cuMemFree_v2,
cuMemGetInfo_v2, cuDeviceTotalMem_v2); an allocation the node's capacity cannot hold raises
SimOutOfMemory. mem_users reads who holds how much on a simulated node (krexsim_mem_users);
checkpoint locks, checkpoints, restores and unlocks a process of one, as the driver's
cuCheckpointProcess* calls do (krexsim_checkpoint).

The memory the driver takes for itself (docs/simulator.md, "Device memory"; KREX_SIM_CTX_BYTES,
KREX_SIM_MODULE_BYTES, KREX_SIM_LOCAL_BYTES, KREX_SIM_GRAPH_BYTES, CUDA_MODULE_LOADING): contexts
(create_context, release_primary, retain_primary), modules (load_module, function,
unload_module), libraries (library_load, library_kernel, kernel_function, library_unload),
launches of a chosen function or kernel (launch_fn; a name with "@local=<size>" needs that much
local memory) and graphs (graph_create, graph_instantiate, graph_launch, graph_exec_destroy,
graph_destroy). Any of them failing for memory raises SimOutOfMemory, whose `call` names the
entry point that failed. workspace_op is a library call that falls back to a slower kernel when
its workspace does not fit, as cuDNN and cuBLAS do.
"""

from __future__ import annotations

import ctypes
import time
from ctypes import byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any

from krex.core.errors import KrexError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_READY = 600

# CUprocessState (cuda.h), as checkpoint reports it; -1: the process has none (it is gone).
CU_PROCESS_STATE_RUNNING = 0
CU_PROCESS_STATE_LOCKED = 1
CU_PROCESS_STATE_CHECKPOINTED = 2
CU_PROCESS_STATE_FAILED = 3


class SimDriverError(KrexError, RuntimeError):
    """A driver call failed: `call` is the entry point's name, `result` its CUresult."""

    def __init__(self, call: str, result: int, message: str | None = None) -> None:
        super().__init__(message or f"{call} failed with CUresult {result}")
        self.call = call
        self.result = result


class SimOutOfMemory(SimDriverError):
    """A call failed with CUDA_ERROR_OUT_OF_MEMORY (the GPU's capacity is short): an allocation
    (cuMemAlloc_v2), or memory the driver takes for itself: a context (cuDevicePrimaryCtxRetain,
    cuCtxCreate_v2), a module or library (cuModuleLoadData, cuLibraryLoadData; under lazy loading
    cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction), a launch's local memory
    (cuLaunchKernel), a graph (cuGraphInstantiateWithFlags). `call` says which."""

    def __init__(self, call: str, message: str | None = None) -> None:
        super().__init__(call, CUDA_ERROR_OUT_OF_MEMORY, message or f"{call} failed: out of memory")


def _check(call: str, rc: int) -> None:
    if rc == CUDA_ERROR_OUT_OF_MEMORY:
        raise SimOutOfMemory(call)
    if rc != 0:
        raise SimDriverError(call, rc)


class SimDriver:
    """The driver API through ctypes (each attribute is a dlsym on libcuda's handle): a
    context, its memory, contexts of its own and code (modules, libraries)."""

    def __init__(self) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._call("cuInit", 0)
        dev, self.ctx = c_int(), c_void_p()
        self._call("cuDeviceGet", byref(dev), 0)
        self.device = dev.value
        self._call("cuDevicePrimaryCtxRetain", byref(self.ctx), dev)
        self._call("cuCtxSetCurrent", self.ctx)
        mod, self.fn, self.stream = c_void_p(), c_void_p(), c_void_p()
        self._call("cuModuleLoadData", byref(mod), b"krex demo kernel")
        self._call("cuModuleGetFunction", byref(self.fn), mod, b"spin")
        self._call("cuStreamCreate", byref(self.stream), 0)
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

    def _call(self, name: str, *args: Any) -> None:
        """Driver entry point `name`: SimOutOfMemory or SimDriverError when it fails."""
        _check(name, int(getattr(self.cu, name)(*args)))

    def event(self) -> c_void_p:
        ev = c_void_p()
        self._call("cuEventCreate", byref(ev), 0)
        return ev

    def sync(self) -> None:
        self._call("cuStreamSynchronize", self.stream)

    # ---- Device memory (node-wide on the simulated GPU: see docs/simulator.md). ----

    def alloc(self, nbytes: int) -> int:
        """cuMemAlloc_v2: a device pointer to nbytes; SimOutOfMemory when they do not fit.
        The memory needs no host RAM until touched."""
        ptr = c_uint64()
        rc = self.cu.cuMemAlloc_v2(byref(ptr), c_size_t(nbytes))
        if rc == CUDA_ERROR_OUT_OF_MEMORY:
            raise SimOutOfMemory("cuMemAlloc_v2", f"cuMemAlloc_v2({nbytes}) failed: out of memory")
        _check("cuMemAlloc_v2", rc)
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        """cuMemFree_v2."""
        self._call("cuMemFree_v2", c_uint64(ptr))

    def mem_info(self) -> tuple[int, int]:
        """cuMemGetInfo_v2: (free, total) bytes of this GPU, for the whole node."""
        free, total = c_size_t(), c_size_t()
        self._call("cuMemGetInfo_v2", byref(free), byref(total))
        return int(free.value), int(total.value)

    def total_mem(self) -> int:
        """cuDeviceTotalMem_v2: the GPU's capacity."""
        total = c_size_t()
        self._call("cuDeviceTotalMem_v2", byref(total), c_int(self.device))
        return int(total.value)

    def create_context(self, flags: int = 0) -> int:
        """cuCtxCreate_v2 on this GPU's device: a new context (it takes KREX_SIM_CTX_BYTES).
        The calling thread's current context stays this SimGPU's."""
        ctx, popped = c_void_p(), c_void_p()
        self._call("cuCtxCreate_v2", byref(ctx), c_uint(flags), c_int(self.device))
        self._call("cuCtxPopCurrent_v2", byref(popped))  # cuCtxCreate pushed it
        return int(ctx.value or 0)

    def destroy_context(self, ctx: int) -> None:
        """cuCtxDestroy_v2: gives back the context's memory and its local-memory reservation."""
        self._call("cuCtxDestroy_v2", c_void_p(ctx))

    def release_primary(self) -> None:
        """cuDevicePrimaryCtxRelease_v2: the constructor's reference to the primary context;
        the last one deactivates it (and gives back its memory), and this SimGPU's stream goes
        with it until retain_primary."""
        self._call("cuDevicePrimaryCtxRelease_v2", c_int(self.device))

    def retain_primary(self) -> None:
        """cuDevicePrimaryCtxRetain (activating the primary context if it is not), made current
        again, with a new stream."""
        self._call("cuDevicePrimaryCtxRetain", byref(self.ctx), c_int(self.device))
        self._call("cuCtxSetCurrent", self.ctx)
        self._call("cuStreamCreate", byref(self.stream), 0)

    def load_module(self, image: bytes = b"krex module") -> int:
        """cuModuleLoadData: eager loading takes KREX_SIM_MODULE_BYTES now; lazy loading
        (CUDA_MODULE_LOADING=LAZY in the environment) at the module's first function."""
        mod = c_void_p()
        self._call("cuModuleLoadData", byref(mod), image)
        return int(mod.value or 0)

    def function(self, module: int, name: str) -> int:
        """cuModuleGetFunction: name may end in "@local=<size>" (its local memory)."""
        fn = c_void_p()
        self._call("cuModuleGetFunction", byref(fn), c_void_p(module), name.encode())
        return int(fn.value or 0)

    def unload_module(self, module: int) -> None:
        """cuModuleUnload: gives back the module's memory."""
        self._call("cuModuleUnload", c_void_p(module))

    def library_load(self, code: bytes = b"krex library") -> int:
        """cuLibraryLoadData, without options: as load_module, for a library."""
        lib = c_void_p()
        self._call(
            "cuLibraryLoadData",
            byref(lib),
            c_char_p(code),
            c_void_p(),
            c_void_p(),
            c_uint(0),
            c_void_p(),
            c_void_p(),
            c_uint(0),
        )
        return int(lib.value or 0)

    def library_kernel(self, library: int, name: str) -> int:
        """cuLibraryGetKernel: a CUkernel (launch_fn launches it; "@local=<size>" as in
        function)."""
        kernel = c_void_p()
        self._call("cuLibraryGetKernel", byref(kernel), c_void_p(library), name.encode())
        return int(kernel.value or 0)

    def kernel_function(self, kernel: int) -> int:
        """cuKernelGetFunction: the kernel's function in the current context."""
        fn = c_void_p()
        self._call("cuKernelGetFunction", byref(fn), c_void_p(kernel))
        return int(fn.value or 0)

    def library_unload(self, library: int) -> None:
        """cuLibraryUnload: gives back the library's memory."""
        self._call("cuLibraryUnload", c_void_p(library))


class SimGPU(SimDriver):
    """The simulated GPU as tests and the demo use it: launches, timed runs, a library's
    workspace fallback, graphs."""

    def launch(self, ns: int) -> None:
        self.launch_fn(self.fn, ns)

    def launch_fn(self, fn: int | c_void_p | None, ns: int) -> None:
        """cuLaunchKernel of function `fn` (or of a CUkernel, as the driver allows) for ns, in
        this GPU's stream. SimOutOfMemory when its local memory does not fit in the context."""
        arg = c_uint64(ns)
        params = (c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), c_void_p))
        f = fn if isinstance(fn, c_void_p) else c_void_p(fn)
        self._call("cuLaunchKernel", f, 1, 1, 1, 1, 1, 1, 0, self.stream, params, None)

    def measure(self, ns: int, reps: int, flush_ns: int = 0) -> list[float]:
        """Event-timed runs of an ns-long kernel. flush_ns > 0 queues a kernel of that length
        before each start event, as do_bench's L2 flush does: the host's launch gap then hides
        behind GPU work, as it does on a real GPU."""
        start, end = self.event(), self.event()
        out = []
        for _ in range(reps):
            if flush_ns:
                self.launch(flush_ns)
            self._call("cuEventRecord", start, self.stream)
            self.launch(ns)
            self._call("cuEventRecord", end, self.stream)
            self._call("cuEventSynchronize", end)
            ms = ctypes.c_float()
            self._call("cuEventElapsedTime", byref(ms), start, end)
            out.append(ms.value)
        return out

    def turn(self, ns: int, kernels: int = 2) -> None:
        """`kernels` ns kernels and a sync: one turn of hammer's loop (two)."""
        for _ in range(kernels):
            self.launch(ns)
        self.sync()

    def hammer(self, ns: int, seconds: float) -> None:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            self.turn(ns)

    def workspace_op(self, ns: int, workspace_bytes: int, slow_factor: float = 4.0) -> bool:
        """One operation of a library that wants a workspace, as cuDNN's and cuBLAS's do: it
        allocates workspace_bytes (cuMemAlloc_v2) and runs its ns kernel; when the allocation
        fails for memory it runs without one, a kernel slow_factor times as long. The workspace
        is freed once the kernel is queued. Returns whether it took the fallback."""
        if workspace_bytes <= 0:
            self.launch(ns)
            return False
        try:
            workspace = self.alloc(workspace_bytes)
        except SimOutOfMemory:
            self.launch(round(ns * slow_factor))
            return True
        try:
            self.launch(ns)
        finally:
            self.free(workspace)
        return False

    # ---- What the driver allocates for itself (see docs/simulator.md, "Device memory"). ----

    def graph_create(self) -> int:
        """cuGraphCreate: an empty graph (it takes no device memory)."""
        graph = c_void_p()
        self._call("cuGraphCreate", byref(graph), c_uint(0))
        return int(graph.value or 0)

    def graph_instantiate(self, graph: int, flags: int = 0) -> int:
        """cuGraphInstantiateWithFlags: an executable graph (it takes KREX_SIM_GRAPH_BYTES)."""
        graph_exec = c_void_p()
        self._call(
            "cuGraphInstantiateWithFlags", byref(graph_exec), c_void_p(graph), c_uint64(flags)
        )
        return int(graph_exec.value or 0)

    def graph_launch(self, graph_exec: int) -> None:
        """cuGraphLaunch in this GPU's stream (a zero-length job on the simulated GPU)."""
        self._call("cuGraphLaunch", c_void_p(graph_exec), self.stream)

    def graph_exec_destroy(self, graph_exec: int) -> None:
        """cuGraphExecDestroy: gives back the executable graph's memory."""
        self._call("cuGraphExecDestroy", c_void_p(graph_exec))

    def graph_destroy(self, graph: int) -> None:
        """cuGraphDestroy."""
        self._call("cuGraphDestroy", c_void_p(graph))


_lib: Any = None


def _krexsim(lib_path: str | None) -> Any:
    """The simulated driver's library with its krexsim_* calls typed, loaded once (OSError
    where it cannot be)."""
    global _lib
    if _lib is None:
        if lib_path is None:
            from krex.core.paths import sim_library_dir

            lib_path = str(sim_library_dir() / "libcuda.so.1")
        lib = ctypes.CDLL(lib_path)
        lib.krexsim_mem_users.argtypes = [
            ctypes.c_char_p,
            ctypes.c_uint,
            ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(ctypes.c_ulonglong),
            ctypes.c_int,
        ]
        lib.krexsim_checkpoint.argtypes = [
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(ctypes.c_int),
        ]
        lib.krexsim_checkpoint.restype = ctypes.c_int
        _lib = lib
    return _lib


def mem_users(sim_shm: str, gpu: int, lib_path: str | None = None) -> dict[int, int] | None:
    """Device memory held on simulated GPU `gpu` of node `sim_shm`: {pid: bytes} of the live
    processes holding any (krexsim_mem_users); None when the node cannot be read."""
    try:
        pids = (ctypes.c_int * 512)()
        used = (ctypes.c_ulonglong * 512)()
        n = int(_krexsim(lib_path).krexsim_mem_users(sim_shm.encode(), gpu, pids, used, 512))
    except OSError:
        return None
    return {pids[i]: int(used[i]) for i in range(n)} if n >= 0 else None


_CHECKPOINT_OPS = {"state": 0, "lock": 1, "checkpoint": 2, "restore": 3, "unlock": 4}


def checkpoint(
    sim_shm: str, op: str, pid: int, timeout_ms: int = 0, lib_path: str | None = None
) -> tuple[int, int]:
    """The driver's checkpoint API on process `pid` of node `sim_shm`, from outside the node
    (krexsim_checkpoint): op is "state", "lock" (timeout_ms: 0 waits for as long as it takes),
    "checkpoint", "restore" or "unlock". Returns (CUresult, CU_PROCESS_STATE_* after the call,
    or -1 when the process has none). Lock, checkpoint and restore take time (the modelled
    times: KREX_SIM_CHECKPOINT_S_PER_GIB and KREX_SIM_RESTORE_S_PER_GIB of this process)."""
    if op not in _CHECKPOINT_OPS:
        raise ValueError(f"unknown checkpoint op {op!r} (one of {', '.join(_CHECKPOINT_OPS)})")
    lib = _krexsim(lib_path)
    state = c_int(-1)
    rc = int(
        lib.krexsim_checkpoint(sim_shm.encode(), _CHECKPOINT_OPS[op], pid, timeout_ms, byref(state))
    )
    return rc, int(state.value)
