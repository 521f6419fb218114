"""A sibling of one kind, or the owner, for scripts/bench/region_entry.py (region overhead by
sibling kind). On the simulated GPU (`sim`) through krex.sim.simgpu, else with torch on the GPU.

    region_sibling.py KIND sim|gpu GO_FILE [REGIONS]

Kinds:
- idle: a context and nothing else (a command between its steps);
- launching: kernels back to back (1 ms simulated; a 4096^2 fp32 matmul on the GPU), synced
  every two; its count of turns so far and the time in GO_FILE.turns-PID (rewritten every
  TURNS_EVERY_S);
- deep: the same, synced every 16 (KERNELS; a program that queues far ahead of the GPU: a
  model's forward pass, a loop of launches read back at its end);
- compiling: a context, and a pool of WORKERS processes burning CPU that hold no GPU context,
  with as many threads in the main process (torch.compile's Inductor workers and threads, in
  shape); on the GPU, torch.compile of a fresh function over and over, Inductor's subprocess
  pool of WORKERS compiling it;
- memwait: a context, then, once GO_FILE exists (every sibling admitted: a GPU where someone
  waits for memory admits nobody), asks for MEMWAIT_FRACTION of the GPU's memory: the first
  gets it and holds it, every later one waits for memory in the shim (the arbiter's waiters);
- turn: no sibling, natively before the launching (or deep: REGIONS is then the kernels a turn)
  siblings start: one turn of their loop (its kernels, a sync) timed alone TURNS times; prints
  {"turn_ms": median}: the most GPU work such a sibling can have queued as a gate closes (it
  launches no more);
- owner: once GO_FILE exists, REGIONS regions, each a short kernel and a sync in
  `krex.region()`, 50 ms apart (its own record of each is the region record in its `krex run
  --report`).

Each prints "ready" once it has its context (a sibling: and runs its kind, but memwait's ask);
the owner prints one JSON line at the end. Waits for GO_FILE end after GO_WAIT_S.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable

WORKERS = 8
KERNELS = {"launching": 2, "deep": 16}  # kinds that launch turn after turn: kernels a turn
TURNS = 20  # a turn's repeats (after TURNS // 4 to warm up)
LAUNCH_NS = 1_000_000  # a launching sibling's kernel on the simulated GPU
MEMWAIT_FRACTION = 0.6  # of the GPU's memory: one sibling holds it, two never fit at once
GO_WAIT_S = 600.0
TURNS_EVERY_S = 0.05  # a launching sibling's count of turns, written this often


def _go(path: str) -> None:
    """Until `path` exists (at most GO_WAIT_S: then this process ends with status 3)."""
    deadline = time.monotonic() + GO_WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.02)


def _burn(stop_at: float) -> None:
    x = 0
    while time.monotonic() < stop_at:
        x = (x * 1103515245 + 12345) % (1 << 31)


def _turn_ms(turn: Callable[[], object]) -> None:
    """Prints {"turn_ms": the median of TURNS timed turns} (wall clock around a synced turn)."""
    for _ in range(TURNS // 4):
        turn()
    times = []
    for _ in range(TURNS):
        t0 = time.perf_counter()
        turn()
        times.append(1000 * (time.perf_counter() - t0))
    print(json.dumps({"turn_ms": sorted(times)[len(times) // 2], "turns": TURNS}), flush=True)


def _sim(kind: str, go: str, regions: int) -> None:
    from krex.sim.simgpu import SimGPU

    g = SimGPU()
    kernels = _kernels(kind, regions)
    if kind == "turn":
        _turn_ms(lambda: g.turn(LAUNCH_NS, kernels))
        return
    print("ready", flush=True)
    if kind == "owner":

        def work() -> None:
            g.launch(200_000)
            g.sync()

        _owner(go, regions, work)
    if kind == "memwait":
        _go(go)
        g.alloc(int(MEMWAIT_FRACTION * g.total_mem()))  # holds it, or waits until the end
    if kind in KERNELS:
        _count_turns(lambda: g.turn(LAUNCH_NS, kernels), go)
    elif kind == "compiling":
        _compile_shape(3600)
    time.sleep(3600)


def _kernels(kind: str, regions: int) -> int:
    """The kernels of one turn of a launching kind (turn: as many as asked)."""
    return (regions or 2) if kind == "turn" else KERNELS.get(kind, 2)


def _count_turns(turn: Callable[[], object], go: str) -> None:
    """A launching sibling's loop: turn after turn, its count and the time written to
    GO_FILE.turns-PID every TURNS_EVERY_S (what the siblings got done meanwhile)."""
    path, n, last = f"{go}.turns-{os.getpid()}", 0, 0.0
    while True:
        turn()
        n += 1
        now = time.monotonic()
        if now - last >= TURNS_EVERY_S:
            with open(path + ".tmp", "w") as f:
                f.write(f"{n} {now}")
            os.replace(path + ".tmp", path)
            last = now


def _compile_shape(seconds: float) -> None:
    """WORKERS processes and WORKERS threads burning CPU, none touching the GPU."""
    stop_at = time.monotonic() + seconds
    ctx = multiprocessing.get_context("spawn")  # no inherited context, as Inductor's pool
    procs = [ctx.Process(target=_burn, args=(stop_at,), daemon=True) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for _ in range(WORKERS):
        threading.Thread(target=_burn, args=(stop_at,), daemon=True).start()
    for p in procs:
        p.join()


def _gpu(kind: str, go: str, regions: int) -> None:
    if kind == "compiling":  # before torch is imported: Inductor reads it then
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(WORKERS)
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()

    kernels = _kernels(kind, regions)

    def turn() -> None:  # launching's loop, once: its matmuls, the last synced
        for _ in range(kernels - 1):
            a @ a
        (a @ a).sum().item()

    if kind == "turn":
        _turn_ms(turn)
        return
    print("ready", flush=True)
    if kind == "owner":
        small = torch.randn(256, 256, device="cuda")
        _owner(go, regions, lambda: (small @ small).sum().item())
    if kind == "memwait":
        _go(go)
        total = torch.cuda.get_device_properties(0).total_memory
        held = torch.empty(int(MEMWAIT_FRACTION * total), dtype=torch.uint8, device="cuda")
        del held  # (never reached by a sibling that waits: the region's owner is done first)
        time.sleep(3600)
    if kind in KERNELS:
        _count_turns(turn, go)
    elif kind == "compiling":
        import torch._inductor.config as inductor

        inductor.compile_threads = WORKERS  # its subprocess pool (read at import from the env)
        n = 0
        while True:  # a new graph each time: Inductor compiles it again
            n += 1
            f = torch.compile(lambda x, n=n: torch.relu(x * n + 1.0).sum(dim=0), dynamic=False)
            f(torch.randn(64 + n % 512, 128, device="cuda"))
            torch._dynamo.reset()
    time.sleep(3600)


def _owner(go: str, regions: int, work: Callable[[], object]) -> None:
    import krex

    _go(go)
    t0 = time.monotonic()
    for _ in range(regions):
        with krex.region():
            work()
        time.sleep(0.05)
    print(json.dumps({"regions": regions, "wall_s": time.monotonic() - t0}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    kind, where, go_file = sys.argv[1], sys.argv[2], sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    (_sim if where == "sim" else _gpu)(kind, go_file, n)
