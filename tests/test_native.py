"""The native pieces: shared layout, hook table against cuda.h and the exports, shim hygiene."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import C_DIR, ROOT, compile_c

from krex._native import ffi

SHIM = ROOT / "shim"
CUDA_H = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda.h"

LAYOUT = {
    "struct krex_header": (
        128,
        {
            "magic": 0,
            "major": 4,
            "minor": 6,
            "header_size": 8,
            "gate_size": 12,
            "slot_size": 16,
            "n_gpus": 20,
            "n_slots": 24,
            "state": 28,
            "total_size": 32,
            "created_ns": 40,
            "creator_pid": 48,
            "overflow": 52,
            "overflow_pids": 56,
            "controller_pid": 88,
            "reserved": 96,
        },
    ),
    "struct krex_gate": (
        64,
        {"word": 0, "wake": 8, "deadline_ns": 16, "regions": 24, "reserved": 32},
    ),
    "struct krex_slot": (
        192,
        {
            "state": 0,
            "pid": 4,
            "start_time": 8,
            "tenant": 16,
            "gpu": 20,
            "in_flight": 24,
            "drain_ack": 28,
            "intercepted": 32,
            "blocked": 40,
            "unmatched": 48,
            "gpus": 56,
            "ungated": 60,
            "drain_req": 64,
            "mem_grant": 68,
            "mem_bytes": 72,
            "mem_peak": 80,
            "mem_want": 88,
            "mem_since_ns": 96,
            "mem_wait_ns": 104,
            "mem_waits": 112,
            "mem_deny": 116,
            "mem_oom_alone": 120,
            "mem_oom_shared": 124,
            "drained_calls": 128,
            "mem_kind": 136,
            "mem_seen": 140,
            "mem_kind_waits": 144,
            "mem_failed": 176,
            "reserved4": 180,
            "reserved3": 184,
        },
    ),
}


def test_c_sizes_and_offsets(tmp_path: Path) -> None:
    """The C compiler lays the segment out exactly as the layout promises."""
    exe = compile_c(C_DIR / "test_layout.c", tmp_path / "test_layout")
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout
    assert p.stdout.strip().endswith(" 0 failed")


@pytest.mark.parametrize("struct", sorted(LAYOUT))
def test_cffi_sees_the_same_layout(struct: str) -> None:
    """The cffi binding's view of each struct matches the header's, field by field."""
    size, fields = LAYOUT[struct]
    assert ffi.sizeof(struct) == size
    for field, offset in fields.items():
        assert ffi.offsetof(struct, field) == offset, field


def hook_names(kind: str) -> set[str]:
    text = (SHIM / "hooks.def").read_text()
    return set(re.findall(rf"^{kind}\((\w+),", text, flags=re.M))


def test_hook_table_is_what_the_library_exports() -> None:
    """One list (hooks.def) generates the wrappers; the library exports exactly it."""
    from krex.core.paths import shim_library

    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(shim_library())],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    kinds = (
        "KREX_GATE", "KREX_GATE_MEM", "KREX_GATE_LAUNCH", "KREX_TRACK", "KREX_MEM", "KREX_DRIVER"
    )  # fmt: skip
    expected = set().union(*map(hook_names, kinds))
    expected |= {
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "dlsym",
        "dlvsym",
        "dlopen",  # routes what an RTLD_DEEPBIND load brings in through the shim
        "dlmopen",  # counted as ungated when it loads a driver apart (docs/security.md)
        "krex_region_begin",
        "krex_region_end",
    }
    assert exported == expected
    gated = hook_names("KREX_GATE_MEM") | hook_names("KREX_GATE_LAUNCH")
    assert len(hook_names("KREX_GATE") | gated) >= 150
    assert len(hook_names("KREX_MEM")) == 15
    # Every way the driver answers out-of-memory for its own memory (docs/memory.md).
    assert {"cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch"} <= gated
    # Every launch on one stream is paced (docs/shim.md, "Pacing"): kernels and graphs.
    assert hook_names("KREX_GATE_LAUNCH") == {
        "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuLaunch",
        "cuLaunchGrid", "cuLaunchGridAsync", "cuGraphLaunch", "cuGraphLaunch_ptsz",
    }  # fmt: skip
    assert {"cuModuleLoadData", "cuModuleGetFunction", "cuLibraryLoadData"} <= hook_names(
        "KREX_DRIVER"
    )


def test_shim_hygiene() -> None:
    """No bare dlsym( calls and no constructors in the shim (docs/shim.md)."""
    for src in sorted((SHIM / "preload").glob("*.c")):
        code = re.sub(r"/\*.*?\*/", "", src.read_text(), flags=re.S)
        code = re.sub(r'"(\\.|[^"\\])*"', '""', code)  # string literals may say anything
        assert not re.search(r"(?<![\w_])dlsym\s*\(", code), f"bare dlsym call in {src.name}"
        assert "constructor" not in code, f"constructor in {src.name}"


@pytest.mark.skipif(not CUDA_H.exists(), reason=f"no real cuda.h at {CUDA_H}")
def test_declarations_match_the_real_cuda_h(tmp_path: Path) -> None:
    """Every hooks.def signature is the real prototype of its exact name, and our own types
    have the real sizes and offsets."""
    real = compile_c(
        C_DIR / "check_cuda_h.c", tmp_path / "real", "-DKREX_REAL_CUDA_H", f"-I{CUDA_H.parent}"
    )
    ours = compile_c(C_DIR / "check_cuda_h.c", tmp_path / "ours")
    a = subprocess.run([str(real)], capture_output=True, text=True, check=True).stdout
    b = subprocess.run([str(ours)], capture_output=True, text=True, check=True).stdout
    assert a == b
