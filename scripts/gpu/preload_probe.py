"""Does importing Inductor's compiler initialise the GPU driver (issue #17's pool preload)?

For each environment (as is; PYTORCH_NVML_BASED_CUDA_CHECK=1, which makes torch's device
count come from NVML), a fresh interpreter imports torch, then torch._inductor.compile_fx, and
asks the driver whether it was initialised: cuDeviceGetCount answers 3
(CUDA_ERROR_NOT_INITIALIZED) before cuInit, 0 after. A fork server may preload only modules
that leave it uninitialised.

    python3 scripts/gpu/preload_probe.py          (one JSON line per environment)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import ctypes, time
t0 = time.monotonic()
import torch
t1 = time.monotonic()
import torch._inductor.compile_fx
t2 = time.monotonic()
n = ctypes.c_int()
rc = ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(n))
print(rc, round(t1 - t0, 2), round(t2 - t1, 2))
"""

for extra in ({}, {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | extra
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    fields = p.stdout.split()
    print(json.dumps({
        "env": extra,
        "rc": p.returncode,
        "cuDeviceGetCount": int(fields[0]) if fields else None,
        "initialised": bool(fields) and fields[0] == "0",
        "import_torch_s": float(fields[1]) if fields else None,
        "import_compile_fx_s": float(fields[2]) if fields else None,
        "stderr": p.stderr[-500:],
    }), flush=True)  # fmt: skip
