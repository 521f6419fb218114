"""krex/worker.py's context hold through cuda-python's driver bindings, against a stand-in
module (cuda-python is not a test dependency; on the GPU machine the real one is used)."""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any

import pytest

from krex import worker


class CUresult(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NO_DEVICE = 100


def fake_driver(fail: str | None = None) -> tuple[Any, list[str]]:
    calls: list[str] = []

    def call(name: str, *values: object) -> Any:
        def fn(*_args: object) -> tuple[object, ...]:
            calls.append(name)
            err = CUresult.CUDA_ERROR_NO_DEVICE if name == fail else CUresult.CUDA_SUCCESS
            return (err, *values)

        return fn

    names = ["cuInit", "cuCtxSetCurrent", "cuMemsetD8", "cuCtxSynchronize", "cuMemFree"]
    module = SimpleNamespace(
        CUresult=CUresult,
        cuDeviceGet=call("cuDeviceGet", 0),
        cuDevicePrimaryCtxRetain=call("cuDevicePrimaryCtxRetain", "ctx"),
        cuMemAlloc=call("cuMemAlloc", 1234),
        **{n: call(n) for n in names},
    )
    return module, calls


def test_the_context_is_retained_made_current_and_a_gated_call_made() -> None:
    cu, calls = fake_driver()
    assert worker._hold_context_cuda_python(cu) == "ctx"
    assert calls == [
        "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
        "cuMemAlloc", "cuMemsetD8", "cuCtxSynchronize", "cuMemFree",
    ]  # fmt: skip


def test_a_failing_call_is_named() -> None:
    cu, calls = fake_driver(fail="cuDevicePrimaryCtxRetain")
    with pytest.raises(RuntimeError, match=r"context.*CUDA_ERROR_NO_DEVICE"):
        worker._hold_context_cuda_python(cu)
    assert calls[-1] == "cuDevicePrimaryCtxRetain"


def test_the_simulated_gpu_takes_the_ctypes_path(monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[str] = []
    monkeypatch.setattr(worker, "_hold_context_ctypes", lambda: used.append("ctypes"))
    monkeypatch.setattr(worker, "_hold_context_cuda_python", lambda cu: used.append("cuda"))
    monkeypatch.setenv("KREX_SIM_SHM", "/krex-test-sim")
    worker._hold_context()
    assert used == ["ctypes"]
