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
Case `krex-wait`: under krex (a private daemon, no warm pool), a holder command takes most of
the GPU and a waiter command, having filled `--first-mib` with a pattern, asks for
`--more-mib` that fits alone but not beside the holder, so it waits in the shim; the waiter is
locked, checkpointed (its memory given back while it waits), restored and unlocked; then the
holder ends, the waiter gets its memory and checks its pattern (driver API through ctypes, so
it runs on the simulated GPU too, where there is no checkpoint API: `--sim`).
Case `krex-deadlock`: krex's own swap (krex/daemon/swap.py) on a memory deadlock. Under a
private daemon (no warm pool, swaps on), command A takes the GPU less 24 GiB and command B
`--first-mib`, each filled with a pattern; told to, A asks for `--more-mib` at once and B 15 s
later: neither fits, every holder waits. krex should take B (the youngest, its 15 s of work
worth more than its swap: krex/daemon/swap.py's swap_cost_s) off the GPU, let A have its
memory and end, put B back and let it have its own: both exit 0 with their patterns intact,
nobody run again, B's report counting one swap. Case `krex-deadlock2`: the same with B a
command of two processes, each holding half of `--first-mib` and asking for `--more-mib`
(neither fits beside A): krex should swap both, put B back once its holdings and both asks fit
(docs/memory.md, "Swaps"), and both of B's processes end with their patterns intact.

    python3 scripts/gpu/checkpoint_probe.py --json OUT.json [--gib 8] [--cases ...]
        [--holder-mib N --first-mib N --more-mib N] [--sim]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
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


# A krex command of the `krex-wait` case: a context, FIRST MiB filled with a pattern; the holder
# then waits for a release file, the waiter asks for MORE MiB (a wait in the shim) and checks
# its pattern once it has it.
KREX_CHILD = r"""
import ctypes, json, os, sys, time
from ctypes import byref, c_int, c_uint64, c_void_p
role, first, more, release = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, p1, p2 = c_int(), c_void_p(), c_uint64(), c_uint64()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(byref(dev), 0) == 0
assert cu.cuCtxCreate_v2(byref(ctx), 0, dev) == 0
assert cu.cuMemAlloc_v2(byref(p1), ctypes.c_size_t(first << 20)) == 0
assert cu.cuMemsetD32_v2(p1, ctypes.c_uint(0xA5A5A5A5), ctypes.c_size_t((first << 20) // 4)) == 0
print(json.dumps({"pid": os.getpid(), "role": role, "held_mib": first}), flush=True)
if role in ("holder", "late"):  # a late one asks for more once told to, and delay later
    while not os.path.exists(release):
        time.sleep(0.05)
    if role == "holder":
        sys.exit(0)
    time.sleep(delay)
t0 = time.monotonic()
rc = cu.cuMemAlloc_v2(byref(p2), ctypes.c_size_t(more << 20))
waited = time.monotonic() - t0
buf = (ctypes.c_uint * 1024)()
same = True
for off in (0, (first << 20) // 2, (first << 20) - 4096):
    assert cu.cuMemcpyDtoH_v2(buf, c_uint64(p1.value + off), ctypes.c_size_t(4096)) == 0
    same = same and all(v == 0xA5A5A5A5 for v in buf)
print(json.dumps({"alloc_rc": rc, "waited_s": round(waited, 3), "same": same}), flush=True)
"""


def smi_mib(field: str) -> int:
    """GPU 0's `memory.used` or `memory.total` in MiB, as nvidia-smi reads it."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
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
        _cycle(cu, p.pid, 2000 if case == "busy" else 10000, out, used=True)
        p.stdin.write("go\n")
        p.stdin.flush()
        out["child"].append(p.stdout.readline().strip())
        out["child_rc"] = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return out


def _end(proc: subprocess.Popen[str], release: Any) -> None:
    """Let a krex-wait command go (the holder waits for the release file), then end it."""
    with contextlib.suppress(OSError):
        release.touch()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _step(steps: dict[str, Any], name: str, fn: Any, pid: int, arg: Any) -> int:
    t0 = time.monotonic()
    rc = int(fn(pid, ctypes.byref(arg)))
    steps[name] = {"rc": rc, "s": round(time.monotonic() - t0, 4)}
    return rc


def _cycle(cu: ctypes.CDLL, pid: int, lock_ms: int, out: dict[str, Any], used: bool) -> None:
    """Lock pid (at most lock_ms), checkpoint it, restore it a second later, unlock it: each
    step's rc and seconds in out["steps"], the GPU's used memory around them where `used`."""

    def mib() -> int | None:
        return smi_mib("memory.used") if used else None

    steps: dict[str, Any] = {}
    out["used_before_mib"], out["steps"] = mib(), steps
    if _step(steps, "lock", cu.cuCheckpointProcessLock, pid, Args(lock_ms, 0)) != 0:
        return
    if _step(steps, "checkpoint", cu.cuCheckpointProcessCheckpoint, pid, Zero()) == 0:
        out["used_checkpointed_mib"] = mib()
        time.sleep(1.0)  # the process's CPU threads run on meanwhile
        _step(steps, "restore", cu.cuCheckpointProcessRestore, pid, Zero())
        out["used_restored_mib"] = mib()
    _step(steps, "unlock", cu.cuCheckpointProcessUnlock, pid, Zero())


@contextlib.contextmanager
def _krex_node(a: argparse.Namespace, tag: str) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """A private krex daemon of 2 slots and no warm pool (memory_check.py's), on the simulated
    GPU with --sim: (a scratch folder, its socket, the environment its commands run in)."""
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root), str(root / "scripts" / "bench")]
    import memory_check

    # Keep the caller's PYTHONPATH: on the GPU box it names the carried cffi and posix_ipc.
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p),
    )
    with contextlib.ExitStack() as ctx:
        tmp = Path(ctx.enter_context(tempfile.TemporaryDirectory(prefix="krex-ckpt-")))
        if a.sim:
            import sim_memory

            env = ctx.enter_context(sim_memory.node(a.sim_capacity_mib << 20))
        memory_check.LOGS = Path(a.json).resolve().parent
        sock = ctx.enter_context(
            memory_check.daemon(tmp, 2, sim=a.sim, env=env, tag=tag, config="[pool]\nworkers = 0\n")
        )
        yield tmp, sock, env


# A command of two KREX_CHILD processes with the same arguments: fails if either does.
TWO = 'p=$1; c=$2; shift 2; "$p" -c "$c" "$@" & x=$!; "$p" -c "$c" "$@" & y=$!; ' \
      'wait $x; r=$?; wait $y; s=$?; exit $((r | s))'  # fmt: skip


def _command(
    ctx: contextlib.ExitStack, a: argparse.Namespace, node: tuple[Path, Path, dict[str, str]],
    name: str, child: list[str], release: Path, procs: int = 1,
) -> subprocess.Popen[str]:  # fmt: skip
    """`krex run` of KREX_CHILD with `child`'s arguments (`procs` 2: two of them, one command),
    its report <name>.json; ended (its release file touched) whatever happens in ctx."""
    tmp, sock, env = node
    run = (["sh", "-c", TWO, "sh"] if procs == 2 else []) + [sys.executable]
    argv = [sys.executable, "-m", "krex.cli", "run", *(["--sim"] if a.sim else []),
            "--socket", str(sock), "--no-pool", "--report", str(tmp / f"{name}.json"), "--",
            *run, *([] if procs == 2 else ["-c"]), KREX_CHILD, *child]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    ctx.callback(_end, proc, release)
    return proc


def _report(node: tuple[Path, Path, dict[str, str]], name: str) -> dict[str, Any] | None:
    rep = node[0] / f"{name}.json"
    if not rep.exists():
        return None
    doc = json.loads(rep.read_text())
    return {k: doc.get(k) for k in ("exit_code", "memory", "attempts")}


def _status(node: tuple[Path, Path, dict[str, str]]) -> dict[str, Any] | None:
    """GPU 0's memory as `krex status --json` shows it."""
    st = subprocess.run([sys.executable, "-m", "krex.cli", "status", "--json", "--socket",
                         str(node[1])], capture_output=True, text=True, env=node[2])  # fmt: skip
    return json.loads(st.stdout)["gpus"][0].get("memory") if st.returncode == 0 else None


def krex_wait(cu: ctypes.CDLL | None, a: argparse.Namespace) -> dict[str, Any]:
    """The `krex-wait` case: a waiter in krex's memory wait checkpointed and restored."""
    out: dict[str, Any] = {"case": "krex-wait", "holder_mib": a.holder_mib,
                           "first_mib": a.first_mib, "more_mib": a.more_mib}  # fmt: skip
    with _krex_node(a, "ckpt") as node, contextlib.ExitStack() as ctx:
        release = node[0] / "release"

        def start(role: str, first: int, more: int) -> subprocess.Popen[str]:
            return _command(ctx, a, node, role, [role, str(first), str(more), str(release)],
                            release)  # fmt: skip

        holder = start("holder", a.holder_mib, 0)
        assert holder.stdout is not None
        out["holder"] = holder.stdout.readline().strip()
        waiter = start("waiter", a.first_mib, a.more_mib)
        assert waiter.stdout is not None
        line = waiter.stdout.readline().strip()
        out["waiter"] = [line]
        pid = json.loads(line)["pid"]
        time.sleep(2.0)  # into its wait for the memory beside the holder
        out["status"] = _status(node)
        if cu is None or not hasattr(cu, "cuCheckpointProcessLock"):
            out["checkpoint"], out["steps"] = "no checkpoint API in this driver", {}
        else:
            _cycle(cu, pid, 5000, out, used=not a.sim)
        time.sleep(1.0)
        release.touch()  # the holder ends: the waiter gets its memory
        out["waiter"].append(waiter.stdout.readline().strip())
        out["holder_rc"], out["waiter_rc"] = holder.wait(timeout=60), waiter.wait(timeout=60)
        out["waiter_report"] = _report(node, "waiter")
    return out


def krex_deadlock(a: argparse.Namespace, b_procs: int = 1) -> dict[str, Any]:
    """The `krex-deadlock` case (`krex-deadlock2`: B of `b_procs` 2 processes): a deadlock krex
    breaks by a swap (see the docstring)."""
    case = "krex-deadlock" + ("2" if b_procs == 2 else "")
    out: dict[str, Any] = {"case": case, "a_mib": a.holder_mib, "b_mib": a.first_mib,
                           "b_procs": b_procs, "more_mib": a.more_mib}  # fmt: skip
    with _krex_node(a, "swap") as node, contextlib.ExitStack() as ctx:
        go = node[0] / "go"
        procs = {}
        for name, first, n, delay in (("a", a.holder_mib, 1, 0.0),
                                      ("b", a.first_mib // b_procs, b_procs, 15.0)):  # fmt: skip
            child = ["late", str(first), str(a.more_mib), str(go), str(delay)]
            proc = _command(ctx, a, node, name, child, go, procs=n)
            assert proc.stdout is not None
            out[name] = [proc.stdout.readline().strip() for _ in range(n)]  # hold their part
            procs[name] = (proc, n)
        t0 = time.monotonic()
        go.touch()
        for name, (proc, n) in procs.items():
            assert proc.stdout is not None
            out[name] += [proc.stdout.readline().strip() for _ in range(n)]
            out[f"{name}_rc"] = proc.wait(timeout=240)
            out[f"{name}_done_s"] = round(time.monotonic() - t0, 2)
            out[f"{name}_report"] = _report(node, name)
        out["status"] = _status(node)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--cases", default="sleeping,busy")
    ap.add_argument(
        "--holder-mib", type=int, default=0, help="default: the GPU less 24 GiB (--sim: 5/8 of it)"
    )
    ap.add_argument("--first-mib", type=int, default=8 << 10)
    ap.add_argument("--more-mib", type=int, default=20 << 10)
    ap.add_argument("--sim", action="store_true", help="krex-wait on the simulated GPU")
    ap.add_argument("--sim-capacity-mib", type=int, default=4096)
    a = ap.parse_args()
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    cu: ctypes.CDLL | None = None
    if not a.sim:
        cu = ctypes.CDLL("libcuda.so.1")
        res["cuInit"] = cu.cuInit(0)
        ver = ctypes.c_int(0)
        cu.cuDriverGetVersion(ctypes.byref(ver))
        res["driver_version"] = ver.value
    if not a.holder_mib:  # room beside the holder for the waiter's first part, not its second
        a.holder_mib = (
            a.sim_capacity_mib * 5 // 8 if a.sim else smi_mib("memory.total") - (24 << 10)
        )
    res["cases"] = []
    for case in a.cases.split(","):
        try:
            if case == "krex-wait":
                r = krex_wait(cu, a)
            elif case in ("krex-deadlock", "krex-deadlock2"):
                r = krex_deadlock(a, 2 if case.endswith("2") else 1)
            else:
                assert cu is not None, "--sim runs the krex- cases only"
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
