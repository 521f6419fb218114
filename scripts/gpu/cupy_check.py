"""CuPy under the shim: elementwise kernels and a RawKernel."""

from __future__ import annotations

import sys

import cupy as cp
from common import check, finish, window

sync = cp.cuda.Device().synchronize
a = cp.zeros(1 << 20, dtype=cp.float32)
a += 1
window(
    "cupy elementwise += x1000 (loop count)",
    1000,
    lambda: [a.__iadd__(1) for _ in range(1000)],
    sync,
)
check("cupy elementwise result", float(a[0]) == 1001.0)

scale = cp.RawKernel(
    r"""
extern "C" __global__ void scale(float *p, float k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= k;
}""",
    "scale",
)
b = cp.ones(4096, dtype=cp.float32)
scale((4,), (1024,), (b, cp.float32(2.0), cp.int32(4096)))
sync()
window(
    "cupy RawKernel x500 (loop count)",
    500,
    lambda: [scale((4,), (1024,), (b, cp.float32(1.0), cp.int32(4096))) for _ in range(500)],
    sync,
)
check("cupy RawKernel result", float(b[17]) == 2.0)
sys.exit(finish("cupy"))
