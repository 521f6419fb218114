"""cuda-python (cuda.bindings.driver) under the shim: module from PTX, explicit launches, copies."""

# mypy: disable-error-code="func-returns-value"

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import numpy as np
from common import check, finish, window
from cuda.bindings import driver as cu


def ok(ret: tuple[Any, ...]) -> Any:
    err = ret[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return ret[1] if len(ret) == 2 else ret[1:]


ok(cu.cuInit(0))
dev = ok(cu.cuDeviceGet(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
ok(cu.cuCtxSetCurrent(ctx))
ptx = Path(sys.argv[1]).read_bytes() + b"\0"
mod = ok(cu.cuModuleLoadData(ptx))
fn = ok(cu.cuModuleGetFunction(mod, b"add_one"))
n = 4096
host = np.zeros(n, dtype=np.float32)
dptr = ok(cu.cuMemAlloc(host.nbytes))
stream = ok(cu.cuStreamCreate(0))
window(
    "cuda-python cuMemcpyHtoD x1",
    1,
    lambda: ok(cu.cuMemcpyHtoD(dptr, host, host.nbytes)),
    lambda: ok(cu.cuStreamSynchronize(stream)),
)
arg_ptr = np.array([int(dptr)], dtype=np.uint64)
arg_n = np.array([n], dtype=np.int32)
args = np.array([arg_ptr.ctypes.data, arg_n.ctypes.data], dtype=np.uint64)


def launch() -> None:
    ok(cu.cuLaunchKernel(fn, n // 256, 1, 1, 256, 1, 1, 0, stream, args.ctypes.data, 0))


window(
    "cuda-python cuLaunchKernel x1000 (loop count)",
    1000,
    lambda: [launch() for _ in range(1000)],
    lambda: ok(cu.cuStreamSynchronize(stream)),
)
ok(cu.cuMemcpyDtoH(host, dptr, host.nbytes))
check("cuda-python result", bool(np.all(host == 1000.0)), first=float(host[0]))
del ctypes
sys.exit(finish("cuda-python"))
