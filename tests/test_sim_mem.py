"""Device memory on the simulated GPU: capacity, node-wide accounting across processes, the
allocation entry points (plain, pitched, managed, stream-ordered, pools, arrays, VMM) and
their lookup through cuGetProcAddress.

Each test drives worker processes (Python, ctypes against the built krex/_lib/sim/libcuda.so.1
through krex.sim.simgpu.SimGPU: sim_workers.py) on a private simulated node (a unique KREX_SIM_SHM,
removed afterwards). Capacities are tens of GiB, far more than this machine's RAM: untouched
simulated memory must cost no host RAM.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import C_DIR, compile_c
from helpers import until
from sim_workers import SimNode, sim_node

GiB = 1 << 30
MiB = 1 << 20
OOM = 2
INVALID_VALUE = 1

# The workers' own helpers (sim_workers.py has the common ones): the memory structs of cuda.h,
# VMM and copies.
_PRELUDE = r"""
GRAN = 2 << 20

class Loc(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]

class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", c_ubyte), ("gpuDirectRDMACapable", c_ubyte),
                ("usage", c_ushort), ("reserved", c_ubyte * 4)]

class Prop(ctypes.Structure):
    _fields_ = [("type", c_int), ("handles", c_int), ("location", Loc), ("win32", c_void_p),
                ("allocFlags", AllocFlags)]

class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", c_int)]

class PoolProps(ctypes.Structure):
    _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("location", Loc),
                ("win32", c_void_p), ("maxSize", c_size_t), ("usage", c_ushort),
                ("reserved", c_ubyte * 54)]

class ArrayDesc(ctypes.Structure):
    _fields_ = [("Width", c_size_t), ("Height", c_size_t), ("Format", c_int),
                ("NumChannels", c_uint)]

def prop(dev=0):
    p = Prop()
    p.type, p.location.type, p.location.id = 1, 1, dev
    return p

def vmm_create(n, dev=0):
    h = c_uint64()
    rc = cu.cuMemCreate(byref(h), c_size_t(n), byref(prop(dev)), c_uint64(0))
    return [rc, h.value]

def vmm_reserve(n):
    p = c_uint64()
    rc = cu.cuMemAddressReserve(byref(p), c_size_t(n), c_size_t(0), c_uint64(0), c_uint64(0))
    return [rc, p.value]

def vmm_map(ptr, n, h):
    rc = cu.cuMemMap(c_uint64(ptr), c_size_t(n), c_size_t(0), c_uint64(h), c_uint64(0))
    if rc:
        return rc
    a = Access()
    a.location.type, a.location.id, a.flags = 1, 0, 3
    return cu.cuMemSetAccess(c_uint64(ptr), c_size_t(n), byref(a), c_size_t(1))

def roundtrip(ptr, n):
    src = (c_ubyte * n)(*[(i * 7 + 3) & 0xFF for i in range(n)])
    back = (c_ubyte * n)()
    rc1 = cu.cuMemcpyHtoD_v2(c_uint64(ptr), src, c_size_t(n))
    rc2 = cu.cuMemcpyDtoH_v2(back, c_uint64(ptr), c_size_t(n))
    return [rc1, rc2, bytes(src) == bytes(back)]
"""


@pytest.fixture
def node() -> Iterator[SimNode]:
    with sim_node("memtest", _PRELUDE) as n:
        yield n


# ---- Capacity. ----


@pytest.mark.parametrize(
    "value, want",
    [("12884901888", 12 * GiB), ("8G", 8 * GiB), ("512MiB", 512 * MiB), ("2T", 2 << 40)],
)
def test_capacity_from_the_env(node: SimNode, value: str, want: int) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES=value)
    assert w("g.total_mem()") == want
    assert w("g.mem_info()") == [want, want]


def test_capacity_default_and_malformed(node: SimNode) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES="lots")
    assert w("g.total_mem()") == 143771 * MiB  # an H200's
    assert "ignoring KREX_SIM_MEM_BYTES" in w.proc.communicate("", timeout=30)[1]


def test_capacity_is_the_creators(node: SimNode) -> None:
    """The node's capacity is fixed by the process that created it: all processes agree."""
    a = node.worker(KREX_SIM_MEM_BYTES="16G")
    b = node.worker(KREX_SIM_MEM_BYTES="32G")
    assert a("g.total_mem()") == b("g.total_mem()") == 16 * GiB
    _, err = b.proc.communicate("", timeout=30)
    assert "which its creator fixed at" in err and "simulated" in err


# ---- Node-wide accounting. ----


def test_oom_across_processes_and_free_gives_back(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="40G")
    b = node.worker()
    pa = a("g.alloc(30 << 30)")
    assert b("used()") == 30 * GiB  # node-wide: b sees a's memory
    assert b("try_alloc(11 << 30)") == "oom"
    pb = b("g.alloc(10 << 30)")  # exactly the rest
    assert a("g.mem_info()") == [0, 40 * GiB]
    assert a("try_alloc(256)") == "oom"
    a(f"g.free({pa})")
    assert b("g.mem_info()")[0] == 30 * GiB
    assert b("try_alloc(30 << 30)") != "oom"
    b(f"g.free({pb})")


def test_sigkilled_process_memory_comes_back(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="20G")
    b = node.worker()
    a("g.alloc(15 << 30)")
    a("g.alloc(1 << 20)")
    assert b("used()") == 15 * GiB + MiB
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=30)
    # Dead (and waited for): cuMemGetInfo no longer counts it, and its memory can be had.
    assert b("used()") == 0
    assert b("try_alloc(20 << 30)") != "oom"


def test_zombie_memory_comes_back_at_allocation(node: SimNode) -> None:
    """A killed process that nobody has waited for yet holds no device memory either; an
    allocation that would fail drops it first."""
    a = node.worker(KREX_SIM_MEM_BYTES="20G")
    b = node.worker()
    a("g.alloc(15 << 30)")
    os.kill(a.proc.pid, signal.SIGKILL)
    until(lambda: Path(f"/proc/{a.proc.pid}/stat").read_text().split(") ")[1][0] == "Z", 30)
    assert b("try_alloc(10 << 30)") != "oom"
    a.proc.wait(timeout=30)


def test_mem_users(node: SimNode) -> None:
    from krex.sim.simgpu import mem_users

    a = node.worker(KREX_SIM_MEM_BYTES="20G")
    b = node.worker()
    a("g.alloc(3 << 30)")
    p = b("g.alloc(1 << 30)")
    assert mem_users(node.shm, 0) == {a.proc.pid: 3 * GiB, b.proc.pid: GiB}
    b(f"g.free({p})")
    assert mem_users(node.shm, 0) == {a.proc.pid: 3 * GiB}
    assert mem_users(node.shm + "-none", 0) is None


def test_many_gib_untouched_cost_no_ram(node: SimNode) -> None:
    """The whole of an H200 in one process, then in 2 GiB pieces, on a machine with less RAM."""
    w = node.worker()
    p = w("g.alloc(140 << 30)")
    assert w(f"roundtrip({p} + (100 << 30), 4096)") == [0, 0, True]
    w(f"g.free({p})")
    ptrs = w("[g.alloc(2 << 30) for _ in range(70)]")
    assert w("try_alloc(2 << 30)") == "oom"
    w(f"[g.free(p) for p in {ptrs}]")
    assert w("used()") == 0


# ---- Entry points. ----


def test_alloc_pitch(node: SimNode) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES="1G")
    w("pitch = c_size_t()")
    rc, ptr = w("rc_alloc(cu.cuMemAllocPitch_v2, byref(pitch), c_size_t(1000), c_size_t(3), 4)")
    assert rc == 0 and w("pitch.value") == 1024
    assert w("used()") == 3 * 1024
    bad = "rc_alloc(cu.cuMemAllocPitch_v2, byref(pitch), c_size_t(1000), c_size_t(3), 3)"
    assert w(bad)[0] == INVALID_VALUE
    huge = "rc_alloc(cu.cuMemAllocPitch_v2, byref(pitch), c_size_t(1 << 20), c_size_t(2048), 4)"
    assert w(huge)[0] == OOM
    assert w(f"cu.cuMemFree_v2(c_uint64({ptr}))") == 0


def test_alloc_managed(node: SimNode) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES="1G")
    rc, ptr = w("rc_alloc(cu.cuMemAllocManaged, c_size_t(600 << 20), 1)")
    assert rc == 0 and w("used()") == 600 * MiB
    assert w(f"roundtrip({ptr}, 1000)") == [0, 0, True]
    assert w("rc_alloc(cu.cuMemAllocManaged, c_size_t(600 << 20), 1)")[0] == OOM
    assert w("rc_alloc(cu.cuMemAllocManaged, c_size_t(1 << 20), 4)")[0] == INVALID_VALUE
    assert w(f"cu.cuMemFree_v2(c_uint64({ptr}))") == 0
    assert w("used()") == 0


@pytest.mark.parametrize("suffix", ["", "_ptsz"])
def test_alloc_async(node: SimNode, suffix: str) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES="1G")
    rc, ptr = w(f"rc_alloc(cu.cuMemAllocAsync{suffix}, c_size_t(700 << 20), g.stream)")
    assert rc == 0 and w("used()") == 700 * MiB
    assert w(f"rc_alloc(cu.cuMemAllocAsync{suffix}, c_size_t(400 << 20), None)")[0] == OOM
    # Freed at the free: the default pool's release threshold is 0.
    assert w(f"cu.cuMemFreeAsync{suffix}(c_uint64({ptr}), g.stream)") == 0
    assert w("used()") == 0
    assert w(f"cu.cuMemFreeAsync{suffix}(c_uint64({ptr}), g.stream)") == INVALID_VALUE
    assert w(f"rc_alloc(cu.cuMemAllocAsync{suffix}, c_size_t(0), g.stream)")[0] == INVALID_VALUE


def test_pools(node: SimNode) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES="1G")
    w("dflt = c_void_p(); rc = cu.cuDeviceGetDefaultMemPool(byref(dflt), g.device)")
    assert w("rc") == 0 and w("dflt.value") is not None
    w("pp = PoolProps(); pp.allocType = 1; pp.location.type = 1; pp.maxSize = 256 << 20")
    w("pool = c_void_p(); rc = cu.cuMemPoolCreate(byref(pool), byref(pp))")
    assert w("rc") == 0
    rc, ptr = w("rc_alloc(cu.cuMemAllocFromPoolAsync, c_size_t(200 << 20), pool, g.stream)")
    assert rc == 0 and w("used()") == 200 * MiB
    # The pool's maxSize, then the GPU's capacity.
    assert w("rc_alloc(cu.cuMemAllocFromPoolAsync, c_size_t(100 << 20), pool, g.stream)")[0] == OOM
    big = "rc_alloc(cu.cuMemAllocFromPoolAsync_ptsz, c_size_t(900 << 20), dflt, None)"
    assert w(big)[0] == OOM
    assert w("cu.cuMemPoolTrimTo(pool, c_size_t(0))") == 0
    assert w("cu.cuMemPoolDestroy(dflt)") == INVALID_VALUE  # not the default pool
    assert w("cu.cuMemPoolDestroy(pool)") == 0
    assert w("used()") == 200 * MiB  # outstanding allocations outlive their pool
    assert w(f"cu.cuMemFreeAsync(c_uint64({ptr}), g.stream)") == 0
    assert w("used()") == 0
    assert w("cu.cuMemPoolTrimTo(pool, c_size_t(0))") == INVALID_VALUE
    w("pp.allocType = 2")
    assert w("cu.cuMemPoolCreate(byref(pool), byref(pp))") == INVALID_VALUE


def test_arrays(node: SimNode) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES="1G")
    w("d = ArrayDesc(); d.Width, d.Height, d.Format, d.NumChannels = 4096, 4096, 0x20, 4")
    w("arr = c_void_p(); rc = cu.cuArrayCreate_v2(byref(arr), byref(d))")
    assert w("rc") == 0 and w("used()") == 4096 * 4096 * 16
    w("d.Width = 16384; d.Height = 16384")
    assert w("cu.cuArrayCreate_v2(byref(c_void_p()), byref(d))") == OOM
    w("d.NumChannels = 3")
    assert w("cu.cuArrayCreate_v2(byref(c_void_p()), byref(d))") == INVALID_VALUE
    assert w("cu.cuArrayDestroy(arr)") == 0
    assert w("used()") == 0


def test_vmm_map_copy_unmap(node: SimNode) -> None:
    w = node.worker(KREX_SIM_MEM_BYTES="1G")
    w("gran = c_size_t(); rc = cu.cuMemGetAllocationGranularity(byref(gran), byref(prop()), 1)")
    assert w("rc") == 0 and w("gran.value") == 2 * MiB
    rc, va = w("vmm_reserve(64 << 30)")  # address space is not memory
    assert rc == 0 and va % (2 * MiB) == 0 and w("used()") == 0
    rc, h1 = w("vmm_create(256 << 20)")
    assert rc == 0 and w("used()") == 256 * MiB  # physical memory counts at creation
    rc, h2 = w("vmm_create(256 << 20)")
    assert rc == 0
    assert w("vmm_create(1 << 30)") == [OOM, 0]
    assert w("vmm_create(3 << 20)")[0] == INVALID_VALUE  # not a multiple of the granularity
    assert w(f"vmm_map({va}, 256 << 20, {h1})") == 0
    assert w(f"vmm_map({va} + (256 << 20), 256 << 20, {h2})") == 0
    assert w(f"vmm_map({va}, 256 << 20, {h2})") == 208  # CUDA_ERROR_ALREADY_MAPPED
    # Copies across the two mappings' seam.
    assert w(f"roundtrip({va} + (256 << 20) - 5000, 10000)") == [0, 0, True]
    # Released while mapped: still counted until unmapped.
    assert w(f"cu.cuMemRelease(c_uint64({h1}))") == 0
    assert w("used()") == 512 * MiB
    assert w(f"cu.cuMemUnmap(c_uint64({va}), c_size_t(128 << 20))") == INVALID_VALUE  # half
    assert w(f"cu.cuMemUnmap(c_uint64({va}), c_size_t(512 << 20))") == 0  # both mappings
    assert w("used()") == 256 * MiB
    assert w(f"cu.cuMemRelease(c_uint64({h2}))") == 0
    assert w("used()") == 0
    assert w(f"cu.cuMemRelease(c_uint64({h2}))") == INVALID_VALUE
    assert w(f"cu.cuMemAddressFree(c_uint64({va}), c_size_t(64 << 30))") == 0
    assert w(f"cu.cuMemAddressFree(c_uint64({va}), c_size_t(64 << 30))") == INVALID_VALUE


def test_vmm_counts_node_wide(node: SimNode) -> None:
    a = node.worker(KREX_SIM_MEM_BYTES="1G")
    b = node.worker()
    assert a("vmm_create(768 << 20)")[0] == 0
    assert b("try_alloc(512 << 20)") == "oom"
    assert b("used()") == 768 * MiB


# ---- Lookup. ----

_NEW = [
    ("cuMemAllocPitch", "cuMemAllocPitch_v2"),
    ("cuMemAllocManaged", "cuMemAllocManaged"),
    ("cuArrayCreate", "cuArrayCreate_v2"),
    ("cuArrayDestroy", "cuArrayDestroy"),
    ("cuMemAllocAsync", "cuMemAllocAsync"),
    ("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync"),
    ("cuMemFreeAsync", "cuMemFreeAsync"),
    ("cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool"),
    ("cuMemPoolCreate", "cuMemPoolCreate"),
    ("cuMemPoolDestroy", "cuMemPoolDestroy"),
    ("cuMemPoolTrimTo", "cuMemPoolTrimTo"),
    ("cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity"),
    ("cuMemAddressReserve", "cuMemAddressReserve"),
    ("cuMemAddressFree", "cuMemAddressFree"),
    ("cuMemCreate", "cuMemCreate"),
    ("cuMemRelease", "cuMemRelease"),
    ("cuMemMap", "cuMemMap"),
    ("cuMemUnmap", "cuMemUnmap"),
    ("cuMemSetAccess", "cuMemSetAccess"),
]


def test_lookup_through_cugetprocaddress(node: SimNode) -> None:
    w = node.worker()
    for base, exact in _NEW:
        rc, status, fn = w(f"lookup({base!r})")
        assert (rc, status) == (0, 0), base
        assert fn == w(f"addr({exact!r})"), base
    # The per-thread twins, with the per-thread flag.
    for base in ("cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync"):
        assert w(f"lookup({base!r}, 12000, 2)")[2] == w(f"addr({base + '_ptsz'!r})")
    # Too old a version for the stream-ordered allocator; only the v2 ABI of cuMemAllocPitch.
    assert w("lookup('cuMemAllocAsync', 11010)")[:2] == [500, 2]
    assert w("lookup('cuMemAllocPitch', 3010)")[:2] == [500, 2]
    assert w("lookup('cuMemAllocPitch_v2')")[:2] == [500, 1]  # exact names are not found


# ---- Declarations against the real cuda.h. ----

CUDA_H = Path("/usr/local/cuda/include/cuda.h")


@pytest.mark.skipif(not CUDA_H.exists(), reason=f"no real cuda.h at {CUDA_H}")
def test_memory_declarations_match_the_real_cuda_h(tmp_path: Path) -> None:
    """The simulator's memory entry points have cuda.h's prototypes, and krex_cuda.h's memory
    types its sizes, offsets and values."""
    src = C_DIR / "sim_mem_types.c"
    real = compile_c(src, tmp_path / "real", "-DKREX_REAL_CUDA_H", f"-I{CUDA_H.parent}")
    ours = compile_c(src, tmp_path / "ours")
    a = subprocess.run([str(real)], capture_output=True, text=True, check=True).stdout
    b = subprocess.run([str(ours)], capture_output=True, text=True, check=True).stdout
    assert a == b and a
