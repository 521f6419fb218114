"""Device memory the simulated driver takes for itself, as the real one does: contexts
(KREX_SIM_CTX_BYTES), loaded modules and libraries (KREX_SIM_MODULE_BYTES, eager or
CUDA_MODULE_LOADING=LAZY), kernels' local memory at launch ("@local=<size>" names,
KREX_SIM_LOCAL_BYTES) and instantiated graphs (KREX_SIM_GRAPH_BYTES); and SimGPU.workspace_op,
a library call that falls back to a slower kernel when its workspace does not fit.

Each charge is node-wide: another process's cuMemGetInfo and mem_users see it, it fails with
out of memory when the node is full (and succeeds once another process frees), and it goes with
its process. Workers as in tests/test_sim_mem.py (sim_workers.py); nothing here times anything
but simulated device time, and that only as a lower bound.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from sim_workers import SimNode, sim_node

from krex.sim.simgpu import mem_users

GiB = 1 << 30
MiB = 1 << 20
OOM = 2
NOT_FOUND = 500

_PRELUDE = r"""
class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
                ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
                ("sharedMemBytes", c_uint), ("hStream", c_void_p), ("attrs", c_void_p),
                ("numAttrs", c_uint)]

def launch_rc(variant, fn, ns):
    # One launch of fn, ns long, in g's stream through entry point `variant`: its CUresult.
    arg = c_uint64(ns)
    params = (c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), c_void_p))
    f, one = getattr(cu, variant), [c_uint(1)] * 6
    if variant.startswith("cuLaunchKernelEx"):
        cfg = LaunchConfig(1, 1, 1, 1, 1, 1, 0, g.stream.value, None, 0)
        return f(byref(cfg), c_void_p(fn), params, None)
    if variant.startswith("cuLaunchCooperativeKernel"):
        return f(c_void_p(fn), *one, c_uint(0), g.stream, params)
    return f(c_void_p(fn), *one, c_uint(0), g.stream, params, None)

def idle():
    # g's stream has nothing queued (cuStreamQuery: CUDA_SUCCESS, not CUDA_ERROR_NOT_READY).
    return cu.cuStreamQuery(g.stream) == 0

def elapsed_ms(stmt):
    # Simulated device time between events recorded around what `stmt` queues.
    start, end, ms = g.event(), g.event(), ctypes.c_float()
    cu.cuEventRecord(start, g.stream)
    exec(stmt, ns)
    cu.cuEventRecord(end, g.stream)
    cu.cuEventSynchronize(end)
    assert cu.cuEventElapsedTime(byref(ms), start, end) == 0
    return ms.value
"""


@pytest.fixture
def node() -> Iterator[SimNode]:
    with sim_node("drvmemtest", _PRELUDE) as n:
        yield n


def _users(node: SimNode) -> dict[int, int] | None:
    return mem_users(node.shm, 0)


# ---- Contexts. ----


def test_context_memory_is_charged_and_given_back(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="8G", KREX_SIM_CTX_BYTES="1G")
    b = node.worker()  # the variables are per process: b's contexts take nothing
    assert b("used()") == GiB  # a's primary context, activated by SimGPU()
    assert _users(node) == {a.proc.pid: GiB}
    ctx = a("g.create_context()")
    assert b("used()") == 2 * GiB
    # Another reference to an active primary context creates nothing.
    assert a("cu.cuDevicePrimaryCtxRetain(byref(c_void_p()), g.device)") == 0
    a("g.release_primary()")
    assert b("used()") == 2 * GiB
    a(f"g.destroy_context({ctx})")
    assert b("used()") == GiB
    a("g.release_primary()")  # the last reference: the primary context goes
    assert b("used()") == 0 and _users(node) == {}
    a("g.retain_primary()")
    assert b("used()") == GiB


def test_context_out_of_memory_and_retry(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="4G")
    p = a("g.alloc(3 << 30)")
    b = node.worker(open_gpu=False, KREX_SIM_CTX_BYTES="1536M")
    assert b("oom('g = SimGPU()')") == "cuDevicePrimaryCtxRetain"
    # No context came into being: the primary context is inactive, nothing is held.
    b("flags, active = c_uint(), c_int(-1)")
    assert b("cu.cuDevicePrimaryCtxGetState(0, byref(flags), byref(active))") == 0
    assert b("active.value") == 0
    assert a("used()") == 3 * GiB and _users(node) == {a.proc.pid: 3 * GiB}
    a(f"g.free({p})")
    assert b("oom('g = SimGPU()')") is None  # the retry
    assert a("used()") == 1536 * MiB
    # cuCtxCreate the same way.
    p = a("g.alloc(2 << 30)")
    assert b("oom('g.create_context()')") == "cuCtxCreate_v2"
    assert b("g.mem_info()")[0] == 512 * MiB
    a(f"g.free({p})")
    b("g.create_context()")
    assert a("used()") == 3 * GiB


# ---- Modules and libraries. ----


def test_module_eager_loading(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="2G", KREX_SIM_MODULE_BYTES="512M")
    b = node.worker()
    assert b("used()") == 512 * MiB  # SimGPU()'s own module
    m = a("g.load_module()")
    assert b("used()") == GiB
    a(f"g.function({m}, 'f')")
    assert b("used()") == GiB  # loaded already
    p = b("g.alloc(768 << 20)")
    assert a("oom('g.load_module()')") == "cuModuleLoadData"
    assert b("used()") == GiB + 768 * MiB
    b(f"g.free({p})")
    m2 = a("g.load_module()")
    assert b("used()") == 1536 * MiB
    # cuModuleLoadDataEx takes the same.
    a("mx = c_void_p()")
    assert a("cu.cuModuleLoadDataEx(byref(mx), b'image', 0, None, None)") == 0
    assert b("used()") == 2 * GiB
    for mod in (m, m2, "mx.value"):
        a(f"g.unload_module({mod})")
    assert b("used()") == 512 * MiB and _users(node) == {a.proc.pid: 512 * MiB}


def test_module_lazy_loading(node: SimNode) -> None:
    a = node.worker(
        KREX_SIM_MEM_BYTES="2G", KREX_SIM_MODULE_BYTES="512M", CUDA_MODULE_LOADING="LAZY"
    )
    b = node.worker()
    assert b("used()") == 512 * MiB  # SimGPU()'s module, loaded by its first function
    m = a("g.load_module()")
    assert b("used()") == 512 * MiB  # nothing at load
    p = b("g.alloc(1280 << 20)")
    assert a(f"oom('g.function({m}, \"f\")')") == "cuModuleGetFunction"
    assert b("used()") == 1792 * MiB
    b(f"g.free({p})")
    a(f"g.function({m}, 'f')")  # the retry
    assert b("used()") == GiB
    a(f"g.function({m}, 'h')")
    assert b("used()") == GiB  # once per module
    a(f"g.unload_module({m})")
    assert b("used()") == 512 * MiB
    m = a("g.load_module()")  # never used: nothing to give back either
    a(f"g.unload_module({m})")
    assert b("used()") == 512 * MiB


@pytest.mark.parametrize(
    "value, lazy", [("LAZY", True), ("EAGER", False), ("lazy", False), ("", False)]
)
def test_module_loading_mode(node: SimNode, value: str, lazy: bool) -> None:
    """Only LAZY turns lazy loading on; the simulator's default is eager (the real driver's has
    been lazy since CUDA 12.2)."""
    a = node.worker(KREX_SIM_MODULE_BYTES="256M", CUDA_MODULE_LOADING=value)
    a("m = g.load_module()")
    assert a("used()") == (256 if lazy else 512) * MiB


@pytest.mark.parametrize("lazy", [False, True])
def test_library(node: SimNode, lazy: bool) -> None:
    mode = "LAZY" if lazy else "EAGER"
    a = node.worker(KREX_SIM_MEM_BYTES="4G", KREX_SIM_MODULE_BYTES="512M", CUDA_MODULE_LOADING=mode)
    b = node.worker()
    lib = a("g.library_load()")
    assert b("used()") == (512 if lazy else 1024) * MiB
    k = a(f"g.library_kernel({lib}, 'k')")
    assert b("used()") == GiB  # lazy: loaded by its first kernel
    big = a(f"g.library_kernel({lib}, 'big@local=1G')")
    fn = a(f"g.kernel_function({big})")
    assert b("used()") == GiB
    # A CUkernel launches as a CUfunction does; a kernel's local memory counts at its launch.
    a(f"g.launch_fn({k}, 1000)")
    a(f"g.launch_fn({fn}, 1000)")
    a("g.sync()")
    assert b("used()") == 2 * GiB
    a(f"g.library_unload({lib})")
    assert b("used()") == 1536 * MiB  # the context keeps its local-memory reservation


@pytest.mark.parametrize("lazy, call", [(False, "cuLibraryLoadData"), (True, "cuLibraryGetKernel")])
def test_library_out_of_memory_and_retry(node: SimNode, lazy: bool, call: str) -> None:
    mode = "LAZY" if lazy else "EAGER"
    a = node.worker(KREX_SIM_MEM_BYTES="2G", KREX_SIM_MODULE_BYTES="512M", CUDA_MODULE_LOADING=mode)
    b = node.worker()
    p = b("g.alloc(1280 << 20)")  # and a's SimGPU() module: 256 MiB left
    a("lib = g.library_load()" if lazy else "lib = None")
    stmt = "k = g.library_kernel(lib, 'k')" if lazy else "lib = g.library_load()"
    assert a(f"oom({stmt!r})") == call
    assert b("used()") == 1792 * MiB
    b(f"g.free({p})")
    assert a(f"oom({stmt!r})") is None
    assert b("used()") == GiB
    a("g.library_unload(lib)")
    assert b("used()") == 512 * MiB


def test_library_loaded_without_a_context(node: SimNode) -> None:
    """A library loaded with no context current is loaded into the first one its kernels are
    used in: here, at its kernel's launch."""
    a = node.worker(open_gpu=False, KREX_SIM_MEM_BYTES="2G", KREX_SIM_MODULE_BYTES="512M")
    assert a("cu.cuInit(0)") == 0
    a("lib, k = c_void_p(), c_void_p()")
    assert a("cu.cuLibraryLoadData(byref(lib), b'code', None, None, 0, None, None, 0)") == 0
    assert a("cu.cuLibraryGetKernel(byref(k), lib, b'k')") == 0
    assert _users(node) == {}
    a("g = SimGPU()")
    assert a("used()") == 512 * MiB  # SimGPU()'s module
    a("g.launch_fn(k.value, 1000)")
    assert a("used()") == GiB
    a("g.library_unload(lib.value)")
    assert a("used()") == 512 * MiB


# ---- Local memory at launch. ----


def test_launch_local_memory(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="4G")
    b = node.worker()
    m = a("g.load_module()")
    f1 = a(f"g.function({m}, 'spin@local=1G')")
    assert b("used()") == 0  # nothing until it launches
    a(f"g.launch_fn({f1}, 1000)")
    assert b("used()") == GiB and _users(node) == {a.proc.pid: GiB}
    a(f"g.launch_fn({f1}, 1000)")
    a(f"g.launch_fn(g.function({m}, 'small@local=512M'), 1000)")
    assert b("used()") == GiB  # the reservation is the largest need so far
    a(f"g.launch_fn(g.function({m}, 'more@local=1536M'), 1000)")
    assert b("used()") == 1536 * MiB  # grown by the difference
    f4 = a(f"g.function({m}, 'huge@local=3G')")
    p = b("g.alloc(2 << 30)")
    assert a(f"oom('g.launch_fn({f4}, 10**10)')") == "cuLaunchKernel"
    assert a("idle()")  # nothing queued (a 10 s kernel would still run)
    assert b("used()") == 3584 * MiB
    b(f"g.free({p})")
    a(f"g.launch_fn({f4}, 1000)")  # the retry
    assert b("used()") == 3 * GiB
    a("g.sync()")
    a("g.release_primary()")  # the reservation goes with its context
    assert b("used()") == 0 and _users(node) == {}


def test_local_memory_of_a_created_context(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="4G")
    ctx = a("g.create_context()")
    a(f"cu.cuCtxPushCurrent_v2(c_void_p({ctx}))")
    a("m = g.load_module(); s = c_void_p(); cu.cuStreamCreate(byref(s), 0)")
    a("f = g.function(m, 'k@local=1G')")
    assert a("launch_rc('cuLaunchKernel', f, 1000)") == 0  # g's stream: the primary context
    assert a("used()") == GiB
    a("arg = c_uint64(1000); params = (c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), c_void_p))")
    launch = "cu.cuLaunchKernel(c_void_p(f), 1, 1, 1, 1, 1, 1, 0, s, params, None)"
    assert a(launch) == 0
    assert a("used()") == 2 * GiB  # one reservation per context
    a(f"cu.cuCtxPopCurrent_v2(None); g.destroy_context({ctx})")
    assert a("used()") == GiB


def test_default_local_need(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="4G", KREX_SIM_LOCAL_BYTES="256M")
    assert a("used()") == 0
    a("g.launch(1000)")  # SimGPU()'s "spin": no @local=, so KREX_SIM_LOCAL_BYTES
    assert a("used()") == 256 * MiB
    a("m = g.load_module()")
    a("g.launch_fn(g.function(m, 'none@local=0'), 1000)")
    assert a("used()") == 256 * MiB
    # A suffix that is not a size names no function.
    assert a("fails('g.function(m, \"k@local=lots\")')") == [
        "SimDriverError",
        "cuModuleGetFunction",
        NOT_FOUND,
    ]


@pytest.mark.parametrize(
    "variant",
    [
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz",
    ],
)
def test_every_launch_reserves_local_memory(node: SimNode, variant: str) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="2G")
    b = node.worker()
    f = a("g.function(g.load_module(), 'k@local=1G')")
    p = b("g.alloc(1536 << 20)")
    assert a(f"launch_rc({variant!r}, {f}, 10**10)") == OOM
    assert a("idle()")
    b(f"g.free({p})")
    assert a(f"launch_rc({variant!r}, {f}, 1000)") == 0
    assert b("used()") == GiB


# ---- Graphs. ----


def test_graph_memory(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="2G", KREX_SIM_GRAPH_BYTES="768M")
    b = node.worker()
    graph = a("g.graph_create()")
    assert b("used()") == 0
    e1 = a(f"g.graph_instantiate({graph})")
    assert b("used()") == 768 * MiB and _users(node) == {a.proc.pid: 768 * MiB}
    p = b("g.alloc(1 << 30)")
    assert a(f"oom('g.graph_instantiate({graph})')") == "cuGraphInstantiateWithFlags"
    assert b("used()") == 1792 * MiB
    b(f"g.free({p})")
    e2 = a(f"g.graph_instantiate({graph})")
    assert b("used()") == 1536 * MiB
    a(f"g.graph_launch({e1})")
    a("g.sync()")
    a(f"g.graph_destroy({graph})")
    assert b("used()") == 1536 * MiB  # executable graphs outlive their graph
    a(f"g.graph_exec_destroy({e1})")
    a(f"g.graph_exec_destroy({e2})")
    assert b("used()") == 0


# ---- Processes that die. ----


def test_driver_memory_comes_back_at_death(node: SimNode) -> None:
    a = node.worker(
        KREX_SIM_MEM_BYTES="8G",
        KREX_SIM_CTX_BYTES="1G",
        KREX_SIM_MODULE_BYTES="256M",
        KREX_SIM_LOCAL_BYTES="128M",
        KREX_SIM_GRAPH_BYTES="512M",
    )
    a("g.launch(1000)")
    a("e = g.graph_instantiate(g.graph_create())")
    a("c = g.create_context()")
    b = node.worker()
    held = 2 * GiB + 256 * MiB + 128 * MiB + 512 * MiB
    assert b("used()") == held and _users(node) == {a.proc.pid: held}
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=30)
    assert b("used()") == 0 and _users(node) == {}


# ---- A library that falls back when its workspace does not fit. ----


def test_workspace_fallback(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="2G")
    b = node.worker()
    assert a("g.workspace_op(1000, 1 << 30)") is False
    assert a("used()") == 0  # the workspace is freed
    p = b("g.alloc(1536 << 20)")
    ms = a("elapsed_ms('took = g.workspace_op(20_000_000, 1 << 30, slow_factor=4)')")
    assert a("took") is True
    assert ms >= 79.9  # the slow kernel, 4 x 20 ms (a lower bound: the host's gaps add)
    assert b("used()") == 1536 * MiB
    b(f"g.free({p})")
    assert a("g.workspace_op(1000, 1 << 30)") is False


# ---- Configuration and lookup. ----


def test_malformed_size_is_ignored(node: SimNode) -> None:
    w = node.worker(KREX_SIM_CTX_BYTES="lots")
    assert w("used()") == 0
    _, err = w.proc.communicate("", timeout=30)
    assert "ignoring KREX_SIM_CTX_BYTES" in err and "simulated" in err


_NEW = [
    "cuModuleLoadDataEx",
    "cuLibraryLoadData",
    "cuLibraryGetKernel",
    "cuKernelGetFunction",
    "cuLibraryUnload",
    "cuGraphCreate",
    "cuGraphInstantiateWithFlags",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
]


def test_lookup_through_cugetprocaddress(node: SimNode) -> None:
    w = node.worker()
    for name in _NEW:
        rc, status, fn = w(f"lookup({name!r})")
        assert (rc, status) == (0, 0), name
        assert fn == w(f"addr({name!r})"), name
    assert w("lookup('cuLibraryLoadData', 11080)")[:2] == [500, 2]
    assert w("lookup('cuGraphInstantiateWithFlags', 11030)")[:2] == [500, 2]
