"""What NVML's process utilisation samples look like on this GPU (issue #49): how often they
come, whether one query returns several samples of one process, and how long after a process's
work stops a sample with work is still timestamped. krex confirms a frozen sibling's drain on a
real GPU by these samples (krex/daemon/machinery.py, `late`): a sample timestamped later than the
grant plus one sampling period plus a margin (NVML_MARGIN_S, an allowance) shows work after the
grant; this measures the period and how late a sample with work can come. Not yet run on a GPU.

A child process spins the GPU in 20 ms kernels for BUSY_S seconds, then idles; this process
reads the samples (nvmlDeviceGetProcessUtilization) every 50 ms until IDLE_S after the work
stopped. Prints one JSON document: each distinct sample of the child (timestamp relative to the
moment its work stopped, SM and memory utilisation), the gaps between consecutive ones, and the
latest timestamp of a sample with work. Needs only the driver (libcuda, libnvidia-ml).

    python3 scripts/gpu/nvml_sample_probe.py
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import sys
import time
from ctypes import byref, c_int, c_uint, c_ulonglong, c_void_p

BUSY_S, IDLE_S = 3.0, 2.5
PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 cycles)
{
    .reg .u64 %rd<4>;
    .reg .pred %p;
    ld.param.u64 %rd1, [cycles];
    mov.u64 %rd2, %clock64;
LOOP:
    mov.u64 %rd3, %clock64;
    sub.u64 %rd3, %rd3, %rd2;
    setp.lt.u64 %p, %rd3, %rd1;
    @%p bra LOOP;
    ret;
}
"""


def spin(stop_w: int) -> None:
    """The child: spin kernels for BUSY_S, write the wall-clock time the work stopped (us)."""
    cu = ctypes.CDLL("libcuda.so.1")

    def call(name: str, *args: object) -> None:
        rc = getattr(cu, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name}: {rc}")

    dev, ctx, mod, fn = c_int(), c_void_p(), c_void_p(), c_void_p()
    call("cuInit", 0)
    call("cuDeviceGet", byref(dev), 0)
    call("cuCtxCreate_v2", byref(ctx), 0, dev)
    call("cuModuleLoadData", byref(mod), PTX)
    call("cuModuleGetFunction", byref(fn), mod, b"spin")
    cycles = c_ulonglong(2_000_000 * 20)  # about 20 ms at 2 GHz
    params = (c_void_p * 1)(ctypes.cast(ctypes.pointer(cycles), c_void_p))
    cu.cuLaunchKernel.argtypes = [c_void_p] + [c_uint] * 7 + [c_void_p] * 3
    t_end = time.monotonic() + BUSY_S
    while time.monotonic() < t_end:
        call("cuLaunchKernel", fn, 1, 1, 1, 32, 1, 1, 0, None, params, None)
        call("cuCtxSynchronize")
    os.write(stop_w, f"{time.time() * 1e6:.0f}\n".encode())
    time.sleep(IDLE_S + 1)


class Sample(ctypes.Structure):
    _fields_ = [
        ("pid", c_uint),
        ("timeStamp", c_ulonglong),
        ("smUtil", c_uint),
        ("memUtil", c_uint),
        ("encUtil", c_uint),
        ("decUtil", c_uint),
    ]


def main() -> int:
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        spin(w)
        os._exit(0)
    os.close(w)
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    h = c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, byref(h)) == 0
    seen: dict[int, tuple[int, int]] = {}
    per_query: list[int] = []
    stop_us = None
    t0 = time.time()
    os.set_blocking(r, False)
    while True:
        if stop_us is None:
            try:
                data = os.read(r, 64)
                if data:
                    stop_us = int(data.split()[0])
            except BlockingIOError:
                pass
        elif time.time() * 1e6 > stop_us + IDLE_S * 1e6:
            break
        if time.time() - t0 > BUSY_S + IDLE_S + 30:
            break
        since = c_ulonglong(int((time.time() - 3.0) * 1e6))
        n = c_uint(0)
        nvml.nvmlDeviceGetProcessUtilization(h, None, byref(n), since)
        if n.value:
            buf = (Sample * (n.value + 8))()
            n = c_uint(n.value + 8)
            if nvml.nvmlDeviceGetProcessUtilization(h, buf, byref(n), since) == 0:
                mine = [buf[i] for i in range(n.value) if buf[i].pid == child]
                per_query.append(len(mine))
                for s in mine:
                    seen[int(s.timeStamp)] = (int(s.smUtil), int(s.memUtil))
        time.sleep(0.05)
    os.kill(child, 9)
    os.waitpid(child, 0)
    stamps = sorted(seen)
    base = stop_us or 0
    busy = [t for t in stamps if seen[t][0] > 0 or seen[t][1] > 0]
    out = {
        "samples": [[round((t - base) / 1e6, 3), *seen[t]] for t in stamps],
        "gaps_s": [round((b - a) / 1e6, 3) for a, b in itertools.pairwise(stamps)],
        "child_samples_per_query": sorted(set(per_query)),
        "last_busy_after_stop_s": round((busy[-1] - base) / 1e6, 3) if busy else None,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
