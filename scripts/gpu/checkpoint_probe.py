"""Can the driver's checkpoint API give a waiting command's device memory back without ending it?

A probe for issue #47 (docs/memory.md, "Preemption costs work"): today a memory deadlock is
broken by killing the youngest waiting command and running it again. CUDA 12.8's driver API
(`cuCheckpointProcessLock`, `...Checkpoint`, `...Restore`, `...Unlock`, read in cuda.h) moves a
process's device memory to host memory and back, the process kept. This probe, on a real GPU:

1. starts a torch process (no krex) holding `--gib` GiB of device memory with a known content,
   plus a cuBLAS handle and a compiled kernel, and a CPU thread that keeps running;
2. from this process: locks it, checkpoints it (timing each step, and the GPU's used memory by
   `nvidia-smi` before and after), restores and unlocks it;
3. has the child check its memory's content, run a matmul and report, its CPU thread's
   progress over the checkpoint too.

Case `sleeping`: the child's main thread sleeps in Python while locked (as a command waiting in
the shim's memory wait does: outside the driver). Case `busy`: the child's main thread is inside
`cudaDeviceSynchronize` behind a long kernel when the lock is asked for (a 2 s lock time-out).

    python3 scripts/gpu/checkpoint_probe.py --json OUT.json [--gib 8]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from typing import Any

CHILD = r"""
import sys, threading, time, torch
gib, case = float(sys.argv[1]), sys.argv[2]
n = int(gib * (1 << 30) // 4)
x = torch.arange(n, device="cuda", dtype=torch.float32).remainder_(1 << 20)
a = torch.randn(4096, 4096, device="cuda")
ref = (a @ a).sum().item()
want = x.sum(dtype=torch.float64).item()
ticks = [0]
def spin():
    while True:
        ticks[0] += 1
        time.sleep(0.001)
threading.Thread(target=spin, daemon=True).start()
torch.cuda.synchronize()
print("ready", flush=True)
if case == "busy":
    sys.stdin.readline()  # go: start a long GPU wait, then the parent asks for the lock
    b = torch.randn(8192, 8192, device="cuda")
    for _ in range(400):
        b = b @ b / 8192
    print("launched", flush=True)
    torch.cuda.synchronize()
t0 = ticks[0]
sys.stdin.readline()  # the parent has restored and unlocked us (or given up)
same = x.sum(dtype=torch.float64).item() == want
again = (a @ a).sum().item()
print(f"done same={same} matmul_same={again == ref} ticks={ticks[0] - t0}", flush=True)
"""


def used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0])


class Args(ctypes.Structure):
    _fields_ = [("a", ctypes.c_uint), ("b", ctypes.c_uint), ("r", ctypes.c_uint64 * 7)]


class Zero(ctypes.Structure):
    _fields_ = [("r", ctypes.c_uint64 * 8)]


def probe(cu: ctypes.CDLL, gib: float, case: str) -> dict[str, Any]:
    out: dict[str, Any] = {"case": case, "gib": gib}
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(gib), case],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        out["child"] = [p.stdout.readline().strip()]
        if case == "busy":
            p.stdin.write("go\n")
            p.stdin.flush()
            out["child"].append(p.stdout.readline().strip())
        state = ctypes.c_int(-1)
        out["state_rc"] = cu.cuCheckpointProcessGetState(p.pid, ctypes.byref(state))
        out["state"] = state.value
        out["used_before_mib"] = used_mib()
        steps: dict[str, Any] = {}
        lock = Args(2000 if case == "busy" else 10000, 0)
        for name, fn, arg in (
            ("lock", cu.cuCheckpointProcessLock, lock),
            ("checkpoint", cu.cuCheckpointProcessCheckpoint, Zero()),
        ):
            t0 = time.monotonic()
            rc = fn(p.pid, ctypes.byref(arg))
            steps[name] = {"rc": rc, "s": round(time.monotonic() - t0, 4)}
            if rc != 0:
                break
        else:
            out["used_checkpointed_mib"] = used_mib()
            time.sleep(1.0)  # the child's CPU thread runs on meanwhile
        if steps.get("checkpoint", {}).get("rc") == 0:
            for name, fn in (
                ("restore", cu.cuCheckpointProcessRestore),
                ("unlock", cu.cuCheckpointProcessUnlock),
            ):
                t0 = time.monotonic()
                rc = fn(p.pid, ctypes.byref(Zero()))
                steps[name] = {"rc": rc, "s": round(time.monotonic() - t0, 4)}
            out["used_restored_mib"] = used_mib()
        elif steps.get("lock", {}).get("rc") == 0:
            t0 = time.monotonic()
            rc = cu.cuCheckpointProcessUnlock(p.pid, ctypes.byref(Zero()))
            steps["unlock"] = {"rc": rc, "s": round(time.monotonic() - t0, 4)}
        out["steps"] = steps
        p.stdin.write("go\n")
        p.stdin.flush()
        out["child"].append(p.stdout.readline().strip())
        out["child_rc"] = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--cases", default="sleeping,busy")
    a = ap.parse_args()
    cu = ctypes.CDLL("libcuda.so.1")
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    res["cuInit"] = cu.cuInit(0)
    ver = ctypes.c_int(0)
    cu.cuDriverGetVersion(ctypes.byref(ver))
    res["driver_version"] = ver.value
    res["cases"] = []
    for case in a.cases.split(","):
        try:
            r = probe(cu, a.gib, case)
        except Exception as e:  # a probe: say what broke, go on to the next case
            r = {"case": case, "error": repr(e)}
        res["cases"].append(r)
        print(json.dumps(r), flush=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
