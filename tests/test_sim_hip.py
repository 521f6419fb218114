"""The simulated HIP runtime (shim/sim_hip/, libamdhip64.so on the simulated libcuda.so.1) on its
own: no interception (no LD_PRELOAD, no LD_AUDIT), tests/c/hip_workload.c against a private
simulated node. Kernel lengths, sharing, every entry point, the lookup paths, and the property
the library exists for: its internal calls go through its exported names (the PLT).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import ROOT, Node
from helpers import Witness

from krex.core.paths import sim_library_dir

HIP_LIB = sim_library_dir() / "libamdhip64.so"
pytestmark = pytest.mark.skipif(
    not HIP_LIB.exists(), reason="the simulated HIP runtime is not built (make build)"
)
KERNEL_NS = 2_000_000


def sim_env(node: Node, **more: str) -> dict[str, str]:
    """A plain HIP process on the node: the simulated libraries on the library path, nothing
    preloaded or audited, no KREX tenant settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KREX_") and k not in ("LD_PRELOAD", "LD_AUDIT")
    }
    env.update(LD_LIBRARY_PATH=str(node.native.sim_dir), KREX_SIM_SHM=node.sim_shm)
    env.update(more)
    return env


def run(node: Node, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node.native.program("hip_workload"), *args],
        env=sim_env(node, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def last_json(out: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def measure(node: Node, reps: int = 5) -> float:
    r = run(node, "measure", str(KERNEL_NS), str(reps))
    assert r.returncode == 0, r.stderr
    return float(last_json(r.stdout)["median_ms"])


def hammer(node: Node, seconds: float) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [node.native.program("hip_workload"), "hammer", str(KERNEL_NS // 2), str(seconds)],
        env=sim_env(node),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "hammering"
    return p


def test_measure_gives_the_kernel_length(node: Node) -> None:
    assert abs(measure(node) - KERNEL_NS / 1e6) / (KERNEL_NS / 1e6) <= 0.01


def test_bench_mode(node: Node) -> None:
    r = run(node, "bench", "0", "0", "3", "1000000", "500000")
    assert r.returncode == 0, r.stderr
    results = last_json(r.stdout)["results"]
    assert [x["kernel_ms"] for x in results] == [1.0, 0.5]
    for x in results:
        assert abs(x["median_ms"] - x["kernel_ms"]) / x["kernel_ms"] <= 0.01


def test_concurrent_processes_share_the_device(node: Node) -> None:
    """Processor sharing across processes: next to two hammering processes a kernel takes about
    three times its length (each of the three progresses at 1/3), and the hammers both ran.
    Polled: on a loaded machine a hammer's host thread may wait for a core while its queue
    runs dry (a CI run read 4.45 ms, two sharers not three), so the kernel is measured again,
    within the hammers' time, until one reading shows all three sharing."""
    hammers = [hammer(node, 3.0), hammer(node, 3.0)]
    try:
        time.sleep(0.05)
        readings = [measure(node)]
        while readings[-1] < 2.5 * KERNEL_NS / 1e6 and len(readings) < 10:
            readings.append(measure(node))
        assert readings[-1] >= 2.5 * KERNEL_NS / 1e6, f"not shared with the two hammers: {readings}"
    finally:
        outs = [h.communicate(timeout=30) for h in hammers]
    for h, (out, err) in zip(hammers, outs, strict=True):
        assert h.returncode == 0, err
        assert last_json(out)["launched"] > 0


@pytest.mark.parametrize(
    "args",
    [
        ("every",),
        ("direct", "5"),
        ("dlsym", "5"),
        ("procaddr", "5"),
        ("spt", "5"),
        ("internal", "5"),
    ],
)
def test_path_modes(node: Node, args: tuple[str, ...]) -> None:
    r = run(node, *args)
    assert r.returncode == 0, r.stderr
    calls = last_json(r.stdout)["calls"]
    assert calls == (64 if args == ("every",) else 5)  # every: 63 entry points and the check


@pytest.mark.parametrize(
    "args, submissions",
    [
        (("direct", "10"), 10),
        (("internal", "7"), 7),  # hipMemcpy: one copy, whatever it calls inside
        (("spt", "3"), 3),
        (("every",), 64),  # one job per entry point, and the copy that checks the bytes
        (("submit", "4", "64"), 4 * 64),
    ],
)
def test_witness_counts_submissions(node: Node, args: tuple[str, ...], submissions: int) -> None:
    witness = Witness()
    try:
        r = run(node, *args, KREX_SIM_WITNESS=str(witness.path))
        assert r.returncode == 0, r.stderr
        assert witness.submissions == submissions
    finally:
        witness.close()


def _disassembly(function: str) -> str:
    r = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(HIP_LIB)],
        capture_output=True,
        text=True,
        check=True,
    )
    m = re.search(rf"^[0-9a-f]+ <{function}>:\n(.*?)(?:\n\n|\Z)", r.stdout, re.M | re.S)
    assert m, f"{function} not in the disassembly"
    return m.group(1)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump is not installed")
@pytest.mark.parametrize(
    "caller, callees",
    [
        ("hipMemcpy", ["hipMemcpyAsync", "hipStreamSynchronize"]),
        ("hipMemset", ["hipMemsetAsync", "hipStreamSynchronize"]),
        ("hipMemcpyHtoD", ["hipMemcpy"]),
        ("hipMemsetD8", ["hipMemset"]),
        ("hipLaunchKernel", ["hipModuleLaunchKernel"]),
        ("hipInit", ["hipGetDeviceCount"]),
        ("hipLaunchKernel_spt", ["hipLaunchKernel"]),
        ("hipMemcpy_spt", ["hipMemcpyAsync", "hipStreamSynchronize"]),
    ],
)
def test_internal_calls_go_through_the_plt(caller: str, callees: list[str]) -> None:
    """HIP's internal calls reach its exported names through the PLT (call or tail jump), so a
    library preloaded in front of it would receive them, as with ROCm's libamdhip64."""
    body = _disassembly(caller)
    for callee in callees:
        assert re.search(rf"\b(call|jmp)\s+[0-9a-f]+ <{callee}@plt>", body), (caller, callee, body)


def test_linked_like_rocm() -> None:
    """Not -Bsymbolic (which would bind the internal calls inside the library), its own
    soname, the simulated libcuda.so.1 found beside it."""
    r = subprocess.run(["readelf", "-d", str(HIP_LIB)], capture_output=True, text=True, check=True)
    assert "SYMBOLIC" not in r.stdout
    assert "Library soname: [libamdhip64.so]" in r.stdout
    assert "Shared library: [libcuda.so.1]" in r.stdout
    assert "$ORIGIN" in r.stdout


def test_exports_are_the_version_script_and_the_header() -> None:
    r = subprocess.run(
        ["nm", "-D", "--defined-only", str(HIP_LIB)], capture_output=True, text=True, check=True
    )
    exported = {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}
    script = (ROOT / "shim" / "sim_hip" / "hipsim.map").read_text()
    listed = set(re.findall(r"^\s+(hip\w+);", script, re.M))
    header = (ROOT / "shim" / "krex_hip.h").read_text()
    declared = set(re.findall(r"^(?:hipError_t |const char \*)(hip\w+)\(", header, re.M))
    # krex_hip.h declares the hooked functions from the hook table.
    table = (ROOT / "shim" / "hip" / "hip_hooks.def").read_text()
    hooked = set(re.findall(r"^KREX_HIP_\w+\((hip\w+),", table, re.M))
    assert len(hooked) > 60 and not hooked & declared
    assert exported == listed == declared | hooked


_PROC_ADDRESS = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
get = lib.hipGetProcAddress
get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_int)]
def addr(name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
for name, flags in (("hipMemcpy", 0), ("hipNoSuchFunction", 0), ("cuLaunchKernel", 0),
                    ("hipLaunchKernel", 2), ("hipStreamCreate", 2)):
    p, status = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = get(name.encode(), ctypes.byref(p), 700, flags, ctypes.byref(status))
    found = [n for n in (name, name + "_spt") if p.value and hasattr(lib, n) and p.value == addr(n)]
    print(name, rc, status.value, *found)
"""


def test_get_proc_address(node: Node) -> None:
    """The exact name's own address; unknown names, and the driver's names below HIP, are not
    found (hipErrorNotFound, HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND); the per-thread flag gives
    the _spt twin where there is one."""
    r = subprocess.run(
        [sys.executable, "-c", _PROC_ADDRESS, str(HIP_LIB)],
        env=sim_env(node),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "hipMemcpy 0 0 hipMemcpy",
        "hipNoSuchFunction 500 1",
        "cuLaunchKernel 500 1",
        "hipLaunchKernel 0 0 hipLaunchKernel_spt",
        "hipStreamCreate 0 0 hipStreamCreate",
    ]


_ERRORS = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.hipGetErrorName.restype = ctypes.c_char_p
lib.hipGetErrorString.restype = ctypes.c_char_p
v = ctypes.c_int(0)
print(lib.hipGetErrorName(600).decode(), lib.hipGetErrorString(1).decode(),
      lib.hipGetErrorName(12345).decode(), lib.hipRuntimeGetVersion(ctypes.byref(v)),
      v.value // 10_000_000, lib.hipDriverGetVersion(None), lib.hipPeekAtLastError(),
      lib.hipGetLastError(), lib.hipGetLastError(), sep=",")
"""


def test_errors_versions_and_the_last_error(node: Node) -> None:
    """Names and texts of errors (unknown codes read as hipErrorUnknown); a HIP 7 version; a
    failed call is the thread's last error until hipGetLastError reads it."""
    r = subprocess.run(
        [sys.executable, "-c", _ERRORS, str(HIP_LIB)],
        env=sim_env(node),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().split(",") == [
        "hipErrorNotReady",
        "invalid argument",
        "hipErrorUnknown",
        "0",
        "7",
        "1",
        "1",
        "1",
        "0",
    ]
