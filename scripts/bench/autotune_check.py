"""Autotuners and harness timers next to busy siblings (issue #18), on a real GPU.

One candidate command (AUTOTUNE below) autotunes and times, in order, into fresh caches:
1. triton: the Triton tutorial's matmul with its `@triton.autotune` CUDA configs, fp16 4096^3
   (the bench's autotune task, krex/bench/tasks/autotune.py); winner: `best_config`; softmax:
   the bench suite's Triton softmax kernel (krex/bench/tasks/softmax.py) under
   `@triton.autotune` over its three warp counts (candidates a few per cent apart, as the
   suite's are);
2. cudnn: the bench suite's conv candidate (krex/bench/tasks/conv.py: conv2d 3x3 + bias + ReLU,
   256x128x64x64, fp32) with `torch.backends.cudnn.benchmark = True`; winner: the CUDA kernels
   one call runs (torch.profiler);
3. kernelbench: a KernelBench-style timing call, `kernelbench.timing.
   time_execution_with_cuda_event` (a module of that name and shape, written here: warm-up,
   CUDA events around each trial, L2 cleared before each, first trial discarded) of KernelBench
   level 1 problem 1's matmul (fp32 4096^2), with no krex code in it, called as KernelBench's
   eval calls it (100 trials; `ms` is their mean, what it reports; `median10` the median of the
   first 10, what runs 3-7 of docs/results/h200-autotune/ read); then `kernelbench_gpu`, the
   same kernel back to back under do_bench, and `kernelbench_inductor`, timed by the harness
   itself through Inductor's `benchmarker.benchmark_gpu` (under krex a timing's region, not
   an autotuner's candidate's); kernelbench_more: problems 19 (ReLU), 23
   (softmax), 47 (sum over a dimension) and 63 (conv2d) at their published sizes (inputs of
   1-8 GiB), each under the same timer; events: the same matmul
   timed by a plain per-trial CUDA-event loop in no named harness (krex/tenant/events.py's case;
   `watched` says whether its events were);
4. inductor: `torch.compile(mode="max-autotune-no-cudagraphs")` of an fp16 4096^3 matmul;
   winner: what the generated code runs (aten's mm, or the template's block sizes, stages and
   warps);
5. compiled conv (every mode, after the cudnn part): torch.compile of the conv with
   cudnn.benchmark on, and dynamo's graph-break count (the cuDNN wrappers must not add any);
6. triton8k and inductor8k: the same two autotuners on the bench suite's matmul task at its
   size (krex/bench/tasks/matmul.py: fp16 8192^3, 1.6-1.9 ms kernels): `@triton.autotune` over
   the suite's four Triton configurations, and max-autotune. Kernels of milliseconds are where
   time-slicing can reorder an autotuner's candidates: a 0.2 ms kernel mostly runs whole inside
   one time slice, so do_bench's median reads it uncontended (the control of issue #18);
7. Inductor's other GPU benchmarks: inductor_subproc, inductor8k with `autotune_in_subproc`
   (its Triton choices timed in a child process that Inductor starts; the region records'
   `pids` tell the child's regions, `child_regions`); coordesc, `coordinate_descent_tuning` of
   an RMS norm's kernel (winner: each new CachingAutotuner's config); multikernel,
   `triton.multi_kernel` of a softmax (winner: each new MultiKernelCall's picked kernel). Each
   Inductor part counts its calls of Inductor's benchmarkers' `benchmark_gpu`, how many ran
   their kernels inside a region (krex.tenant.markers.region_depth(), read only where krex
   loaded it) and what each returned, in order (`benchmarks`: the race the tuner saw);
8. inductor_kb9: KernelBench level 2 problem 9 (Linear 8192 -> 8192, subtract, multiply,
   ReLU on fp32 (1024, 8192) inputs), its first GEMM problem, at its published size, compiled
   with max-autotune as an agent's candidate is: Inductor picks between cuBLAS's addmm and its
   Triton templates with the epilogue fused.
--parts picks and orders them (default: all).
Each part's timing is triton.testing.do_bench's median (a region under --auto-regions).

Modes, interleaved (exclusive, unprotected, krex; then again): exclusive: the command alone,
natively; unprotected: natively beside 7 busy siblings (torch matmuls, steady or bursty:
sibling_matmul.py; no krex);
krex: `krex run --auto-regions` beside the same 7 siblings under `krex run` (8 slots). With
--sharing mps the unprotected mode's processes are clients of an MPS daemon (kernels of all of
them on the SMs at once), the other way GPUs are shared without krex;
with --alone, also krex-alone (first repeat; every repeat with --alone-each): `krex run
--auto-regions` with no siblings, which tells krex's own effect from what the siblings leave
behind on the GPU; with --held, also
exclusive-held (every repeat): natively beside 7 processes that hold the siblings' device memory
and do no work, which tells where the owner's buffers land (the records' `memory_placement`)
from the rest; with --frozen, exclusive-frozen: natively beside busy siblings stopped over each
timing (a region's freeze without krex); with --cooled, exclusive-cooled: the same, but the
timing waits COOL_S after the stop, so the GPU cools down from the siblings' work first (heat
and power history apart from their memory); with --settled S, krex-settled: krex beside the
siblings, each final timing in a region (krex.region(), so krex code in the command) that idles
S seconds before it times, as exclusive-frozen's stop waits DRAIN_S; with --region-settle S,
krex-settle: krex beside the siblings with `krex run --settle S` (the daemon idles S seconds
after each region's freeze where NVML saw the siblings work in the last second; no krex code in
the command); with --pinned CPUS, exclusive-pinned: the command alone, natively, its CPU affinity
set to CPUS from its start (the cores a krex region pins its owner to), which tells what the
region's cores do to a timing that reads the host's launch time from krex's other effects.

Each part records its candidates' times where the autotuner exposes them (Triton's
`configs_timings`, Inductor's printed table), so a changed winner can be read against how close
the race was, and the GPU's state over its final timing (SM clock, temperature, power, time
capped; NVML sampled every 50 ms by this script).

    python3 scripts/bench/autotune_check.py --json OUT.json [--repeats 2] [--siblings bursty]
        [--alone]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from krex.bench.runner import fresh_caches, not_ready, slice_config
from krex.client.run import private_daemon
from krex.core.slices import SliceError, format_cpu_list, parse_cpu_list
from krex.core.tenants import _fully_stopped

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch_fit  # a script beside this one
import pooled  # a script beside this one

KREX = [sys.executable, "-m", "krex.cli"]
MODES = (
    "exclusive",
    "unprotected",
    "krex",
    "krex-alone",
    "krex-settled",
    "krex-settle",
    "exclusive-held",
    "exclusive-frozen",
    "exclusive-cooled",
    "exclusive-pinned",
)
STOPPED = ("exclusive-frozen", "exclusive-cooled")  # siblings stopped over each timing
UNDER_KREX = ("krex", "krex-settled", "krex-settle")  # beside 7 siblings under krex run
PARTS = (
    "triton",
    "triton8k",
    "softmax",
    "cudnn",
    "kernelbench",
    "kernelbench_more",
    "events",
    "inductor",
    "inductor8k",
    "inductor_subproc",
    "inductor_kb9",
    "coordesc",
    "multikernel",
)
# Timings that parts record besides their own name's.
MORE = (
    "compiled_conv",
    "kernelbench_gpu",
    "kernelbench_inductor",
    "kb19_relu",
    "kb23_softmax",
    "kb47_sum",
    "kb63_conv2d",
)
WINNERS = (
    "triton",
    "triton8k",
    "softmax",
    "cudnn",
    "inductor",
    "inductor8k",
    "inductor_subproc",
    "inductor_kb9",
    "coordesc",
    "multikernel",
)
# Where each Inductor part's autotuning table starts on stderr (after "AUTOTUNE "): the op
# and its first operand's shape (an addmm's bias may come first, so kb9's is looked for later).
INDUCTOR_TABLES = {
    "inductor": r"mm\(4096x",
    "inductor8k": r"mm\(8192x",
    "inductor_subproc": r"mm\(8192x",
    "inductor_kb9": r"(addmm|mm)\(.*\b1024x8192\b",
}

KERNELBENCH_TIMING = textwrap.dedent('''
    """Stand-in of KernelBench's src/kernelbench/timing.py, its cuda_event timer's shape."""
    import torch


    def clear_l2_cache(device="cuda"):
        dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device=device)
        dummy.fill_(42)
        del dummy


    def time_execution_with_cuda_event(kernel_fn, args, num_warmup=3, num_trials=10,
                                       discard_first=1, verbose=False, device=None):
        if device is None:
            device = torch.cuda.current_device()
        with torch.cuda.device(device):
            for _ in range(num_warmup):
                kernel_fn(*args)
                torch.cuda.synchronize(device=device)
            torch.cuda.empty_cache()
            elapsed = []
            for trial in range(num_trials + discard_first):
                torch.cuda.synchronize(device=device)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                clear_l2_cache(device=device)
                start.record()
                kernel_fn(*args)
                end.record()
                torch.cuda.synchronize(device=device)
                if trial >= discard_first:
                    elapsed.append(start.elapsed_time(end))
        return elapsed
''')

AUTOTUNE = textwrap.dedent("""
    import json, os, re, statistics, sys, time
    import torch, torch.nn.functional as F, triton, triton.testing
    from krex.bench.choices import inductor_winner, kernel_names
    res = {}
    t0 = time.monotonic()
    handoff = os.environ.get("AUTOTUNE_HANDOFF")  # exclusive-frozen: the check's directory
    asked = [0]

    def ask(action):  # the check stops ("stop") or resumes ("go") the siblings, then acks
        if not handoff:
            return
        n, asked[0] = asked[0], asked[0] + 1
        with open(os.path.join(handoff, f"req-{n}.tmp"), "w") as f:
            f.write(action)
        os.rename(os.path.join(handoff, f"req-{n}.tmp"), os.path.join(handoff, f"req-{n}"))
        end = time.monotonic() + 10
        while not os.path.exists(os.path.join(handoff, f"ack-{n}")):
            if time.monotonic() > end:
                raise RuntimeError(f"no ack of {action} from the check")
            time.sleep(0.002)

    class frozen:  # exclusive-frozen's siblings stopped over a timing, as a region's would be
        def __enter__(self):
            ask("stop")

        def __exit__(self, *exc):
            ask("go")

    def done(part, **kv):
        res[part] = {**kv, "at_s": round(time.monotonic() - t0, 1)}
        print(part, json.dumps(res[part]), file=sys.stderr, flush=True)

    settle_s = float(os.environ.get("AUTOTUNE_SETTLE_S") or 0)

    class settled:  # krex-settled: the timing's region first idles settle_s (krex's own API)
        def __enter__(self):
            if settle_s:
                import krex
                self.region = krex.region()
                self.region.__enter__()
                time.sleep(settle_s)

        def __exit__(self, *exc):
            if settle_s:
                self.region.__exit__(*exc)

    # The final timing (do_bench's median, or `timer`'s) and its wall-clock window (for the
    # GPU's telemetry).
    def timed(fn, timer=None):
        with frozen(), settled():
            w0 = time.time()
            ms = timer(fn) if timer else triton.testing.do_bench(fn, return_mode="median")
            return {"ms": ms, "window": [w0, time.time()]}

    def candidates(tuner):  # an autotuner's configs, fastest first: its median per config
        t = getattr(tuner, "configs_timings", None) or {}
        return sorted(([str(c), float(v[0] if isinstance(v, (list, tuple)) else v)]
                       for c, v in t.items()), key=lambda cv: cv[1])

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16, generator=gen)

    def triton_part():
        from krex.bench.tasks import autotune as at
        matmul = at._triton_autotune([a, b])
        torch.testing.assert_close(matmul(), a @ b, atol=0.5, rtol=0.05)
        done("triton", winner=str(at._matmul.best_config), candidates=candidates(at._matmul),
             **timed(matmul))

    def softmax_part():  # the bench suite's Triton softmax, its three warp counts autotuned
        from krex.bench.tasks import softmax as sm
        tuned = triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (8, 16, 32)],
                                key=["n_cols"])(sm._softmax_rows)
        x = torch.randn(sm.M, sm.N, device="cuda", generator=gen)
        out = torch.empty_like(x)
        block = triton.next_power_of_2(sm.N)
        fn = lambda: tuned[(sm.M,)](x, out, sm.N, x.stride(0), BLOCK=block)
        fn()
        torch.testing.assert_close(out, torch.softmax(x, dim=1), atol=1e-6, rtol=1e-4)
        done("softmax", winner=str(tuned.best_config), candidates=candidates(tuned), **timed(fn))

    def cudnn_part():  # the bench suite's conv candidate, cudnn-benchmark variant
        x = torch.randn(256, 128, 64, 64, device="cuda", generator=gen)
        w = torch.randn(128, 128, 3, 3, device="cuda", generator=gen) / (3 * 128**0.5)
        bias = 0.1 * torch.randn(128, device="cuda", generator=gen)
        conv = lambda: F.relu(F.conv2d(x, w, bias, padding=1))
        torch.backends.cudnn.benchmark = True
        try:
            with frozen():  # cuDNN's search
                conv()
                torch.cuda.synchronize()
            try:  # the winner: the kernels one call runs
                acts = [torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=acts) as prof:
                    conv()
                    torch.cuda.synchronize()
                winner = kernel_names(e.name for e in prof.events()
                                      if e.device_type == torch.autograd.DeviceType.CUDA)
            except Exception as e:
                winner = f"unknown (profiler: {e!r:.200})"
            done("cudnn", winner=winner, **timed(conv))
            if "--compiled-conv" in sys.argv:
                from torch._dynamo.utils import counters  # not `import torch...`: a local
                fc = torch.compile(lambda x, w, b: F.relu(F.conv2d(x, w, b, padding=1)))
                fc(x, w, bias)
                torch.cuda.synchronize()
                breaks = sum(counters["graph_break"].values())
                done("compiled_conv", graph_breaks=breaks, **timed(lambda: fc(x, w, bias)))
        finally:
            torch.backends.cudnn.benchmark = False

    def kb_time(name, fn, args):  # as KernelBench's eval times a problem: 100 trials, the mean
        from kernelbench import timing
        # As KernelBench's eval takes it (src/kernelbench/eval.py); the stand-in has no
        # get_timing_function, the real module (--kernelbench-timing) has.
        getter = getattr(timing, "get_timing_function", None)
        time_execution_with_cuda_event = (
            getter("cuda_event") if getter else timing.time_execution_with_cuda_event)
        launch = []

        def launched(*a):  # the CPU time of each launch: the GPU idles after the start event
            c0 = time.perf_counter()  # once it exceeds the L2 flush's (about 70 us)
            out = fn(*a)
            launch.append(round((time.perf_counter() - c0) * 1e6, 1))
            return out

        cpu = {}

        def where():  # the cores this process may use, and the one it is on (a region pins it)
            with open("/proc/self/stat") as f:
                cpu["on"] = int(f.read().rsplit(")", 1)[1].split()[36])
            cpu["allowed"] = sorted(os.sched_getaffinity(0))

        def cpu_lost():  # the hypervisor's steal on every core (ticks), this thread's run-
            with open("/proc/stat") as f:  # queue wait (ns): where a slow launch's time went
                steal = sum(int(x.split()[8]) for x in f if x.startswith("cpu") and x[3] != " ")
            with open("/proc/thread-self/schedstat") as f:
                return steal, int(f.read().split()[1])

        torch.cuda.synchronize()
        with frozen():
            w0, lost0 = time.time(), cpu_lost()
            times = time_execution_with_cuda_event(launched, args, num_trials=100, verbose=False)
            w1, lost1 = time.time(), cpu_lost()
            where()  # within the timer's lingering region
        cpu["steal_ms"] = (lost1[0] - lost0[0]) * 1000 / os.sysconf("SC_CLK_TCK")
        cpu["runq_wait_ms"] = round((lost1[1] - lost0[1]) / 1e6, 3)
        # ms: the mean KernelBench reports; median10: runs 3-7's reading (10 trials, median)
        done(name, ms=statistics.mean(times), median=statistics.median(times),
             median10=statistics.median(times[:10]), trials=[round(t, 4) for t in times],
             launch_us=launch[-100:], cpu=cpu, window=[w0, w1])

    def kernelbench_part():  # KernelBench level 1 problem 1 (fp32 matmul, N = 4096)
        A = torch.randn(4096, 4096, device="cuda", generator=gen)
        B = torch.randn(4096, 4096, device="cuda", generator=gen)
        kb_time("kernelbench", torch.matmul, [A, B])
        # The same kernel back to back (do_bench): the GPU's time for it without the timer's
        # per-trial launch, to tell the GPU's state from the timer's own path.
        done("kernelbench_gpu", **timed(lambda: torch.matmul(A, B)))
        # And through Inductor's benchmarker called by the harness itself, as some harnesses
        # time: under krex a timing's region (its record not `candidate`), not a tuner's.
        from torch._inductor.runtime.benchmarking import benchmarker
        done("kernelbench_inductor",
             **timed(lambda: torch.matmul(A, B), timer=benchmarker.benchmark_gpu))

    def kernelbench_more_part():  # more of KernelBench's level 1, at their published sizes
        x = torch.randn(4096, 393216, device="cuda", generator=gen)  # 6 GiB
        kb_time("kb19_relu", torch.relu, [x])
        kb_time("kb23_softmax", lambda t: torch.softmax(t, dim=1), [x])
        del x
        x = torch.randn(128, 4096, 4095, device="cuda", generator=gen)  # 8 GiB
        kb_time("kb47_sum", lambda t: torch.sum(t, dim=1, keepdim=True), [x])
        del x
        conv = torch.nn.Conv2d(16, 128, 3, bias=False).cuda()
        x = torch.randn(16, 16, 1024, 1024, device="cuda", generator=gen)
        with torch.no_grad():
            kb_time("kb63_conv2d", conv, [x])
        del x, conv
        torch.cuda.empty_cache()

    def events_part():  # a plain CUDA-event loop, per trial, in no named harness
        A = torch.randn(4096, 4096, device="cuda", generator=gen)
        B = torch.randn(4096, 4096, device="cuda", generator=gen)
        for _ in range(3):
            torch.matmul(A, B)
        torch.cuda.synchronize()
        times, launch, watched = [], [], False
        frozen().__enter__()
        w0 = time.time()
        for _ in range(11):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            # krex/tenant/events.py's
            watched = watched or "record" in getattr(start, "__dict__", {})
            start.record()
            c0 = time.perf_counter()
            torch.matmul(A, B)  # the GPU is idle at the start event: this launch is timed too
            launch.append((time.perf_counter() - c0) * 1e6)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        frozen().__exit__()
        done("events", ms=statistics.median(times[1:]), trials=times[1:], watched=watched,
             launch_us=round(statistics.median(launch[1:]), 1), window=[w0, time.time()])

    big = {}

    def inputs8k():  # the suite's matmul task's inputs (krex/bench/tasks/matmul.py: 8192^3)
        if not big:
            from krex.bench.tasks import matmul as mm
            big["a"], big["b"] = mm.make_inputs(gen)
        return big["a"], big["b"]

    def triton8k_part():  # the suite's matmul kernel, its four Triton configs autotuned
        from krex.bench.tasks import autotune as at, matmul as mm
        configs = []
        for name in mm.VARIANTS:  # BM x BN x BK, stages, warps: the autotune task's configs
            m = re.fullmatch(r"triton-(\\d+)x(\\d+)x(\\d+)-s(\\d+)w(\\d+)", name)
            if m:
                configs.append(at._config(*map(int, m.groups())))
        tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(mm._matmul)
        a8, b8 = inputs8k()
        M, K = a8.shape
        N = b8.shape[1]
        c8 = torch.empty(M, N, device="cuda", dtype=a8.dtype)
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)
        fn = lambda: tuned[grid](a8, b8, c8, M, N, K, a8.stride(0), a8.stride(1), b8.stride(0),
                                 b8.stride(1), c8.stride(0), c8.stride(1))
        fn()
        torch.testing.assert_close(c8, a8 @ b8, atol=2e-2, rtol=1e-2)
        done("triton8k", winner=str(tuned.best_config), candidates=candidates(tuned), **timed(fn))

    class counted:  # Inductor's GPU benchmarks over a part: how many, how many in a region
        def __enter__(self):
            from torch._inductor.runtime import benchmarking as bm
            seen, busy, self.saved = {"calls": 0, "in_region": 0, "ms": []}, [False], []
            for name in ("Benchmarker", "TritonBenchmarker", "InductorBenchmarker"):
                cls = getattr(bm, name, None)
                orig = cls.__dict__.get("benchmark_gpu") if cls is not None else None
                if orig is None:
                    continue

                def outer(self_, _callable, *a, _orig=orig, **k):  # outside krex's wrapper
                    if busy[0]:  # a benchmarker calling another: counted once, outermost
                        return _orig(self_, _callable, *a, **k)
                    inside = [False]

                    def probe(*x, **y):  # runs where the benchmark runs the kernel
                        m = sys.modules.get("krex.tenant.markers")
                        inside[0] = inside[0] or (m is not None and m.region_depth() > 0)
                        return _callable(*x, **y)

                    probe.__wrapped__ = _callable  # krex/tenant/precompile.py looks through it
                    busy[0], got = True, None
                    try:
                        got = _orig(self_, probe, *a, **k)
                        return got
                    finally:
                        busy[0] = False
                        seen["calls"] += 1
                        seen["in_region"] += inside[0]
                        seen["ms"].append(round(got, 5) if isinstance(got, float) else None)

                self.saved.append((cls, orig))
                setattr(cls, "benchmark_gpu", outer)
            return seen

        def __exit__(self, *exc):
            for cls, orig in self.saved:
                setattr(cls, "benchmark_gpu", orig)

    def made(kind):  # objects of a class named `kind` alive now (Inductor's runtime tuners)
        import gc
        return [o for o in gc.get_objects() if type(o).__name__ == kind]

    def max_autotuned(name, fn, args, check=None, **config):  # Inductor's pick for fn, timed
        torch._dynamo.reset()
        from torch._inductor.utils import run_and_get_code
        f = torch.compile(fn, mode="max-autotune-no-cudagraphs")
        with torch._inductor.config.patch(config), counted() as seen:
            out, codes = run_and_get_code(f, *args)
        if check is not None:  # before the part is recorded: a wrong result is no winner
            check(out)
        done(name, winner=inductor_winner("\\n".join(codes)), benchmarks=seen, pid=os.getpid(),
             **timed(lambda: f(*args)))

    def inductor_part(name="inductor", x=a, y=b, **config):
        max_autotuned(name, lambda a, b: a @ b, (x, y), **config)

    def inductor8k_part():
        inductor_part("inductor8k", *inputs8k())

    def inductor_subproc_part():  # its Triton choices timed in a child process it starts
        inductor_part("inductor_subproc", *inputs8k(), autotune_in_subproc=True)

    def inductor_kb9_part():  # KernelBench level 2 problem 9 (its first GEMM), as published
        # Linear(8192, 8192) - 2.0, * 1.5, ReLU on fp32 torch.rand(1024, 8192), compiled as an
        # agent's candidate is and timed under no_grad, as KernelBench's eval times it.
        if os.environ.get("AUTOTUNE_POOL_READY"):  # Inductor's compile workers up first:
            from torch._inductor.async_compile import AsyncCompile  # its choices then compile
            end = time.monotonic() + 120  # in them, and the ones the GPU cannot run are
            while not AsyncCompile.use_process_pool():  # compiled again at their benchmark
                if time.monotonic() > end:
                    raise RuntimeError("Inductor's compile pool was not ready in 120 s")
                time.sleep(0.1)
        torch.manual_seed(0)
        lin = torch.nn.Linear(8192, 8192, device="cuda")
        x = torch.rand(1024, 8192, device="cuda", generator=gen)
        model = lambda x: torch.relu((lin(x) - 2.0) * 1.5)
        close = lambda y: torch.testing.assert_close(y, model(x), atol=1e-2, rtol=1e-2)
        with torch.no_grad():
            max_autotuned("inductor_kb9", model, (x,), check=close)

    def coordesc_part():  # Inductor's coordinate descent over an RMS norm's kernel's config
        torch._dynamo.reset()
        x = torch.randn(16384, 4096, device="cuda", generator=gen)
        w = torch.randn(4096, device="cuda", generator=gen)
        f = torch.compile(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
        before = {id(o) for o in made("CachingAutotuner")}
        with torch._inductor.config.patch(coordinate_descent_tuning=True), counted() as seen:
            f(x, w)
            torch.cuda.synchronize()
        tuners = [o for o in made("CachingAutotuner") if id(o) not in before]
        winner = " | ".join(sorted(str(t.launchers[0].config) for t in tuners
                                   if getattr(t, "launchers", None))) or "no tuner found"
        done("coordesc", winner=winner, benchmarks=seen, tuners=len(tuners),
             **timed(lambda: f(x, w)))

    def multikernel_part():  # Inductor's multi-kernel: persistent or looped reduction, timed
        torch._dynamo.reset()
        x = torch.randn(65536, 1024, device="cuda", generator=gen)
        f = torch.compile(lambda x: torch.softmax(x, -1))
        before = {id(o) for o in made("MultiKernelCall")}
        with torch._inductor.config.patch({"triton.multi_kernel": 1}), counted() as seen:
            f(x)
            torch.cuda.synchronize()
        calls = [o for o in made("MultiKernelCall") if id(o) not in before]
        winner = " | ".join(sorted(str(getattr(c, "picked_kernel", None)) for c in calls))
        done("multikernel", winner=winner or "no multi-kernel found", benchmarks=seen,
             **timed(lambda: f(x)))

    every = {"triton": triton_part, "triton8k": triton8k_part, "softmax": softmax_part,
             "cudnn": cudnn_part, "kernelbench": kernelbench_part, "events": events_part,
             "kernelbench_more": kernelbench_more_part,
             "inductor": inductor_part, "inductor8k": inductor8k_part,
             "inductor_subproc": inductor_subproc_part, "inductor_kb9": inductor_kb9_part,
             "coordesc": coordesc_part,
             "multikernel": multikernel_part}
    chosen = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--parts=")),
                  list(every))
    for name in chosen:
        part = every[name]
        try:
            part()
        except Exception as e:  # one part's failure is recorded, the others still run
            import traceback
            traceback.print_exc()
            res[name + "_error"] = repr(e)[:800]
    print(json.dumps(res), flush=True)
""")

# The siblings' program (steady or bursty matmuls), a file of its own that other checks run too.
SIBLING = Path(__file__).resolve().parent / "sibling_matmul.py"


class Telemetry:
    """The GPU's SM clock, temperature, energy and capped time, sampled every PERIOD_S in a
    thread (NVML through krex.core.nvml), so that each part's timing window can be read against
    the GPU's state (the power state moves fp16 matmuls by per cents: docs/results/)."""

    PERIOD_S = 0.05
    TRACED = ("events",)  # parts whose windows keep every sample (short ones)

    def __init__(self, period_s: float = PERIOD_S) -> None:
        from krex.core.nvml import Nvml

        self.period_s = period_s
        self.nvml = Nvml.open()
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Telemetry:
        if self.nvml is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        assert self.nvml is not None
        while not self._stop.wait(self.period_s):
            sample = self.nvml.sample(0)
            if sample is not None:
                self.samples.append({"t": time.time(), **sample})

    def window(self, t0: float, t1: float, trace: bool = False) -> dict[str, Any] | None:
        """The GPU's state over [t0, t1] (wall clock): mean and range of the SM clock, the
        throttle reasons seen (NVML's bits, OR-ed), the GPU's and its memory's temperature at
        both ends, the memory clock's range, mean power and
        ms capped by power or temperature; with `trace`, every sample as [ms after t0, SM
        clock, reasons]; None without samples."""
        inside = [x for x in self.samples if t0 <= x["t"] <= t1]
        if len(inside) < 2:
            return None
        first, last = inside[0], inside[-1]
        clocks = [x["sm_clock_mhz"] for x in inside]
        reasons = 0
        for x in inside:
            reasons |= x.get("throttle_reasons", 0)
        out: dict[str, Any] = {
            "sm_clock_mhz": round(statistics.mean(clocks)),
            "sm_clock_mhz_range": [min(clocks), max(clocks)],
            "throttle_reasons": hex(reasons),
            "samples": len(inside),
        }
        if trace:  # from 0.2 s before: the state the timing began in
            out["trace"] = [
                [round((x["t"] - t0) * 1000), x["sm_clock_mhz"], hex(x.get("throttle_reasons", 0))]
                for x in self.samples
                if t0 - 0.2 <= x["t"] <= t1
            ]
        for key in ("temp_c", "mem_temp_c"):  # the GPU's and its HBM's, at both ends
            if key in first:
                out[key] = [first[key], last.get(key)]
        mem = [x["mem_clock_mhz"] for x in inside if "mem_clock_mhz" in x]
        if mem:
            out["mem_clock_mhz_range"] = [min(mem), max(mem)]
        span = last["t"] - first["t"]
        if "energy_mj" in first and span > 0:
            out["power_w"] = round((last["energy_mj"] - first["energy_mj"]) / 1000 / span)
        for key in ("power_capped_ns", "thermal_capped_ns"):
            if key in first:
                out[key.replace("_ns", "_ms")] = round((last[key] - first[key]) / 1e6, 1)
        return out


# Inductor's autotuning table on stderr: "  mm 0.1773 ms 100.0% ..." under "AUTOTUNE mm(...)".
_CHOICE = re.compile(r"^\s+(\S+) ([0-9.]+) ms ([0-9.]+)%")


def inductor_choices(stderr: str, table: str) -> list[list[Any]]:
    """The choices Inductor printed in its first autotuning table whose header matches `table`
    (a regular expression, after "AUTOTUNE "; see INDUCTOR_TABLES), fastest first: [name, ms]
    (top 5)."""
    out: list[list[Any]] = []
    lines = stderr.splitlines()
    head = re.compile("AUTOTUNE " + table)
    for i, line in enumerate(lines):
        if head.match(line):
            for row in lines[i + 1 :]:
                m = _CHOICE.match(row)
                if m:
                    out.append([m.group(1), float(m.group(2))])
                elif out or not row.startswith(("strides", "dtypes")):
                    break
            break
    return out[:5]


# With --sharing mps: the MPS daemon's variables, given to the unprotected mode's processes
# (siblings and candidate), which then share the GPU's SMs at once instead of in time slices.
UNPROTECTED_ENV: dict[str, str] = {}
LINGER_S: str | None = None  # --linger: KREX_REGION_LINGER_S for the krex modes' command
SETTLE_S = 0.4  # --settled: krex-settled's idle wait inside each timing's region
REGION_SETTLE_S = 0.4  # --region-settle: krex-settle's `krex run --settle` (the daemon's step)
PINNED: set[int] = set()  # --pinned: exclusive-pinned's CPUs


def _env(tmp: Path, tag: str, unprotected: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(UNPROTECTED_ENV if unprotected else {})
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "lib"), env.get("PYTHONPATH", "")])
    return fresh_caches(env, tmp / f"cache-{tag}")


def _siblings(
    tmp: Path, sock: Path | None, n: int, load: str, hold: bool = False
) -> list[subprocess.Popen[str]]:
    pre = [*KREX, "run", "--socket", str(sock), "--no-pool", "--"] if sock else []
    sibs = [
        subprocess.Popen(
            [*pre, sys.executable, str(SIBLING), load, *(["hold"] if hold else [])],
            env=_env(tmp, "sib", unprotected=sock is None),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(n)
    ]
    if late := not_ready(sibs):
        for s in sibs:
            s.kill()
            s.wait()
        raise RuntimeError(f"{len(late)} of {n} siblings did not start")
    return sibs


DRAIN_S = 0.4
"""exclusive-frozen: how long the check waits after stopping the siblings for the GPU work they
had queued to end (each has at most one 8192^2 matmul and a sum in flight: 7 x ~25 ms)."""
COOL_S = 3.0
"""exclusive-cooled: the wait after the stop instead, long enough for the GPU's power and
temperature to fall back from the siblings' work (the region records' temp_c fell by 10-15 C
within a second of the freeze on the H200)."""


def _wait_stopped(pids: list[int], limit_s: float = 10.0) -> None:
    """Wait, at most limit_s, until every thread of each of pids is stopped (or gone): SIGSTOP
    is delivered when a thread is next scheduled, not by kill() itself. Past the limit (a
    machine loaded beyond reason) it says so on stderr: the timing that follows is not one of
    stopped siblings."""
    end = time.monotonic() + limit_s
    while not all(_fully_stopped(pid) for pid in pids):
        if time.monotonic() >= end:
            late = [pid for pid in pids if not _fully_stopped(pid)]
            print(
                f"autotune_check: siblings {late} not stopped after {limit_s:g} s", file=sys.stderr
            )
            return
        time.sleep(0.001)


@contextlib.contextmanager
def _handoff(
    directory: Path, sibs: list[subprocess.Popen[str]], wait_s: float = DRAIN_S
) -> Iterator[None]:
    """exclusive-frozen, natively: stop the siblings (SIGSTOP, then `wait_s`) when the candidate
    asks before a timing, resume them (SIGCONT) after: a region's freeze and drain without
    krex, so that what the siblings leave on the GPU (heat, held memory) can be told from
    krex's own effect. The candidate writes req-N ("stop" or "go"); this thread acks ack-N."""
    directory.mkdir(parents=True, exist_ok=True)
    done = threading.Event()

    def serve() -> None:
        n = 0
        while not done.is_set():
            req = directory / f"req-{n}"
            if not req.exists():
                time.sleep(0.002)
                continue
            stop = req.read_text() == "stop"
            for s in sibs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.pid, signal.SIGSTOP if stop else signal.SIGCONT)
            if stop:
                _wait_stopped([s.pid for s in sibs])
                time.sleep(wait_s)
            (directory / f"ack-{n}").touch()
            n += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
        for s in sibs:  # SIGKILL follows; a stopped sibling must not outlive a lost "go"
            with contextlib.suppress(ProcessLookupError):
                os.kill(s.pid, signal.SIGCONT)


def one(
    tmp: Path, mode: str, sock: Path | None, rep: int, load: str, gpu: Telemetry, parts: str
) -> dict[str, Any]:
    tag = f"{mode}{rep}"
    crowded = mode in ("unprotected", *UNDER_KREX, "exclusive-held", *STOPPED)
    under_krex = mode in UNDER_KREX
    sibs = (
        _siblings(tmp, sock if under_krex else None, 7, load, hold=mode == "exclusive-held")
        if crowded
        else []
    )
    # The compiled conv in every mode, so that the later parts follow the same work in each.
    argv = [sys.executable, str(tmp / "autotune.py"), "--compiled-conv", f"--parts={parts}"]
    report = tmp / f"{tag}.report.json"
    if mode.startswith("krex"):
        settle = ["--settle", str(REGION_SETTLE_S)] if mode == "krex-settle" else []
        argv = [*KREX, "run", "--socket", str(sock), "--no-pool", "--auto-regions", *settle,
                "--report", str(report), "--", *argv]  # fmt: skip
    t0 = time.monotonic()
    handoff = tmp / f"handoff-{tag}"
    try:
        env = _env(tmp, tag, unprotected=mode == "unprotected")
        if mode.startswith("krex") and LINGER_S is not None:
            env["KREX_REGION_LINGER_S"] = LINGER_S  # krex run passes it on to the command
        if mode in STOPPED:
            env["AUTOTUNE_HANDOFF"] = str(handoff)
        if mode == "krex-settled":
            env["AUTOTUNE_SETTLE_S"] = str(SETTLE_S)
        wait_s = COOL_S if mode == "exclusive-cooled" else DRAIN_S
        cpus = PINNED if mode == "exclusive-pinned" else None
        with _handoff(handoff, sibs, wait_s) if mode in STOPPED else contextlib.nullcontext():
            p = run_on(argv, env, cpus, timeout=240)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, str(e.stdout or ""), str(e.stderr or "")
    finally:
        for s in sibs:
            s.kill()
            s.wait()
    row: dict[str, Any] = {"mode": mode, "repeat": rep, "rc": rc, "wall_s": time.monotonic() - t0}
    try:
        got = json.loads(out.strip().splitlines()[-1])
        row["parts"] = {k: v for k, v in got.items() if isinstance(v, dict)}
        row["errors"] = {k: v for k, v in got.items() if not isinstance(v, dict)}
    except (ValueError, IndexError, AttributeError):
        pass
    for name, part in row.get("parts", {}).items():
        window = part.pop("window", None)
        if window:
            w0, w1 = window
            part["gpu"] = gpu.window(w0, w1, trace=name in gpu.TRACED)
    for part, table in INDUCTOR_TABLES.items():
        if part in row.get("parts", {}):
            row["parts"][part]["candidates"] = inductor_choices(err, table)
    row["stderr"] = err[-4000:]
    if report.exists():
        rep_doc = json.loads(report.read_text())
        regions = rep_doc.get("regions", [])
        row["regions"] = len(regions)
        row["regions_clean"] = sum(bool(r.get("clean")) for r in regions)
        row["region_problems"] = sorted({p for r in regions for p in r.get("problems", [])})[:10]
        keep = ("duration_s", "settle_s", "settle_capped", "candidate", "clean", "warnings",
                "power_w_before", "power_capped_ms", "thermal_capped_ms", "temp_c", "mem_temp_c",
                "sm_clock_mhz", "pids", "calls")  # fmt: skip
        row["region_records"] = [{k: r[k] for k in keep if k in r} for r in regions]
        # What held the GPU: each marker's count over the command's regions (the records'
        # `calls`), and the longest region with what held it.
        row["region_calls"] = region_calls(regions)
        # Regions of the candidate's children (Inductor's subprocess autotuning), by the
        # records' pids against the candidate's own.
        own = {p["pid"] for p in row.get("parts", {}).values() if "pid" in p}
        if own:
            row["child_regions"] = sum(bool(set(r.get("pids", ())) - own) for r in regions)
        row["auto_regions_unresolved"] = rep_doc.get("auto_regions_unresolved", [])
    winners = {k: v.get("winner", v.get("graph_breaks")) for k, v in row.get("parts", {}).items()}
    regions = f", regions {row.get('regions')} ({row.get('regions_clean')} clean"
    regions += f", {row['child_regions']} of children)" if "child_regions" in row else ")"
    print(f"{tag}: rc {rc}, {row['wall_s']:.0f} s, {json.dumps(winners)}"
          + (regions if mode.startswith("krex") else ""), flush=True)  # fmt: skip
    if row.get("region_calls"):
        print(f"    regions held by {json.dumps(row['region_calls'])}", flush=True)
    seen = {k: v["benchmarks"] for k, v in row.get("parts", {}).items() if "benchmarks" in v}
    if seen:
        print(f"    Inductor's GPU benchmarks {json.dumps(seen)}", flush=True)
    ms = {k: round(v["ms"], 4) for k, v in row.get("parts", {}).items() if "ms" in v}
    print(f"    ms {json.dumps(ms)}", flush=True)
    state = {k: v.get("gpu") for k, v in row.get("parts", {}).items() if v.get("gpu")}
    print(f"    gpu {json.dumps(state)}", flush=True)
    if row.get("errors") or "parts" not in row:
        print(f"    errors {json.dumps(row.get('errors'))}\n{err[-2500:]}", flush=True)
    return row


def run_on(
    argv: list[str], env: dict[str, str], cpus: set[int] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a candidate to its end, its output captured; with `cpus`, on those CPUs only, from
    before it starts (its threads inherit the affinity)."""
    # The affinity is set in the child between fork and exec: sched_setaffinity takes no lock
    # that another thread of this script could hold.
    pin = functools.partial(os.sched_setaffinity, 0, cpus) if cpus else None
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=pin
    )


def verdict(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per autotuner: the exclusive winners, whether krex kept them in every repeat and whether
    unprotected sharing changed one; per part, timings against the exclusive median."""
    out: dict[str, Any] = {}
    ok = [r for r in runs if "parts" in r]
    for part in WINNERS:
        by = {m: [r["parts"][part]["winner"] for r in ok if r["mode"] == m and part in r["parts"]]
              for m in MODES}  # fmt: skip
        ex = set(by["exclusive"])
        out[part] = {
            "winners": by,
            "exclusive_stable": len(ex) == 1,
            "krex_equals_exclusive": bool(by["krex"]) and all(w in ex for w in by["krex"]),
            "unprotected_changed": any(w not in ex for w in by["unprotected"]),
        }
        # How close the race was alone: the runner-up's time over the winner's, per run.
        gaps = []
        for r in ok:
            cands = r["parts"].get(part, {}).get("candidates") or []
            if r["mode"] == "exclusive" and len(cands) > 1 and cands[0][1] > 0:
                gaps.append(round((cands[1][1] - cands[0][1]) / cands[0][1] * 100, 2))
        if gaps:
            out[part]["exclusive_runner_up_gap_pct"] = gaps
    for part in (*PARTS, *MORE):
        ms = pooled.timings({"runs": ok}, part)  # the modes that timed it, in run order
        if not ms.get("exclusive"):
            continue
        base = statistics.median(ms["exclusive"])
        pct = {m: [round((v - base) / base * 100, 2) for v in vals] for m, vals in ms.items()}
        out.setdefault(part, {})["ms"] = ms
        out[part]["vs_exclusive_pct"] = pct
        spread = round((max(ms["exclusive"]) - min(ms["exclusive"])) / base * 100, 2)
        out[part]["native_repeat_spread_pct"] = spread
        # Issue #18's two timing bars, counted per mode: within the native repeat (no further
        # from the exclusive median than the exclusive runs spread) and within 1 % of it.
        out[part]["within"] = {
            m: {
                "native_spread": f"{sum(abs(x) <= spread for x in xs)} of {len(xs)}",
                "one_pct": f"{sum(abs(x) <= 1.0 for x in xs)} of {len(xs)}",
            }
            for m, xs in pct.items()
            if xs and m != "exclusive"
        }
        # The same on an equal footing (scripts/bench/pooled.py): exclusive's own timings each
        # against the other exclusive runs, every mode against subsets of that size, so that
        # exclusive's score is what a mode that repeats like it would get.
        footing = pooled.one_run(ms)
        if footing is not None:
            out[part]["equal_footing"] = {
                m: {
                    "within_spread": f"{v['within_spread']:.1f} of {v['n']}",
                    "within_one_pct": f"{v['within_one_pct']:.1f} of {v['n']}",
                }
                for m, v in footing.items()
            }
    # The KernelBench timer reads the launch as well as the kernel (runs 7-11 of
    # docs/results/h200-autotune/): each mode's reading once the launch time is fitted out.
    with contextlib.suppress(ValueError):
        fit = launch_fit.fit(launch_fit.points([{"runs": ok}]))
        out.setdefault("kernelbench", {})["launch_fit"] = {
            "correlation": fit["correlation"],
            "residual_mean_pct": {m: v["residual_mean_pct"] for m, v in fit["modes"].items()},
        }
    # The conv timings follow the GPU's temperature at their start (runs 7-13): per mode, the
    # start temperatures (the GPU's, its memory's) beside the timings, and the correlations.
    for part in ("cudnn", "kb63_conv2d"):
        with contextlib.suppress(ValueError):
            state = launch_fit.telemetry([{"runs": ok}], part)
            out.setdefault(part, {})["gpu_state"] = {
                k: v for k, v in state.items() if k not in ("part", "runs")
            }
        if "native_repeat_spread_pct" in out.get(part, {}):
            out[part]["within_by_capping"] = _within_by_capping(ok, part, out[part])
    return out


def _within_by_capping(ok: list[dict[str, Any]], part: str, v: dict[str, Any]) -> dict[str, Any]:
    """Per mode, the timings within the exclusive runs' spread (the verdict's own per cent,
    `v`), counted apart for those during which the power limit held the clocks down
    (launch_fit.CAPPED_MS or more) and the rest; timings without the GPU's samples are left
    out."""
    out: dict[str, Any] = {}
    for mode, xs in v["vs_exclusive_pct"].items():
        mine = [r for r in ok if r["mode"] == mode and pooled.timed(r, part)]  # as `xs` was made
        for r, x in zip(mine, xs, strict=True):
            capped = (r["parts"][part].get("gpu") or {}).get("power_capped_ms")
            if capped is None:
                continue
            key = "capped" if capped >= launch_fit.CAPPED_MS else "uncapped"
            within, n = out.setdefault(mode, {}).get(key, (0, 0))
            out[mode][key] = (within + (abs(x) <= v["native_repeat_spread_pct"]), n + 1)
    return {m: {k: f"{a} of {b}" for k, (a, b) in sorted(c.items())} for m, c in out.items()}


@contextlib.contextmanager
def _mps(directory: Path, on: bool) -> Iterator[None]:
    """An MPS daemon for the unprotected mode while on (UNPROTECTED_ENV), stopped after."""
    if not on:
        yield
        return
    from krex.daemon.mps import Mps

    mps = Mps.start(directory)
    UNPROTECTED_ENV.update(mps.env())
    try:
        yield
    finally:
        UNPROTECTED_ENV.clear()
        mps.stop()


def region_calls(regions: list[dict[str, Any]]) -> dict[str, Any]:
    """Over a command's region records: each marker's count (`calls`, summed), and the
    longest region's duration with the markers that held it; {} when no record names any."""
    total: dict[str, int] = {}
    for r in regions:
        for name, n in (r.get("calls") or {}).items():
            total[name] = total.get(name, 0) + n
    if not total:
        return {}
    longest = max(regions, key=lambda r: r.get("duration_s", 0.0))
    return {
        "counts": dict(sorted(total.items(), key=lambda kv: -kv[1])),
        "longest": {"duration_s": longest.get("duration_s"), "calls": longest.get("calls", {})},
    }


def judge(files: list[Path], out: Path, ap: argparse.ArgumentParser) -> int:
    """--judge: the verdict over the runs of several calls' files, with where each came from."""
    runs: list[dict[str, Any]] = []
    sources = []
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            ap.error(f"--judge: {f}: {e}")
        if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
            ap.error(f"--judge: {f} has no runs (not an autotune_check.py --json file)")
        runs += doc["runs"]
        sources.append({"file": f.name, "date": doc.get("date"), "command": doc.get("command")})
    v = {"sources": sources, "runs": len(runs), "verdict": verdict(runs)}
    out.write_text(json.dumps(v, indent=1) + "\n")
    print(json.dumps(v["verdict"], indent=1), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--first-repeat",
        type=int,
        default=0,
        metavar="N",
        help="number the repeats from N (default 0), so a run split over several calls keeps "
        "--rotate's order: a second call with --first-repeat 1 starts where the first left off",
    )
    ap.add_argument(
        "--judge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="run nothing: the verdict over the runs of these files (a run split over several "
        "calls, --first-repeat), written to --json",
    )
    ap.add_argument("--siblings", choices=("steady", "bursty"), default="steady")
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated, in order, of: {', '.join(PARTS)} (default: all)",
    )
    ap.add_argument(
        "--sharing",
        choices=("timeslice", "mps"),
        default="timeslice",
        help="how the unprotected mode shares the GPU: the driver's time slices (default), or "
        "an MPS daemon of this script's (all its processes' kernels on the SMs at once)",
    )
    ap.add_argument(
        "--linger",
        metavar="S",
        help="KREX_REGION_LINGER_S for the krex modes' command (default: krex's, 0.005)",
    )
    ap.add_argument(
        "--held",
        action="store_true",
        help="also run the candidate natively beside 7 processes that hold the siblings' device "
        "memory and do no work (every repeat): where the owner's buffers land, apart from the "
        "siblings' work and krex",
    )
    ap.add_argument(
        "--frozen",
        action="store_true",
        help="also run the candidate natively beside 7 busy siblings that this script stops "
        "(SIGSTOP, then a drain) over each timing and cuDNN's search and resumes after (every "
        "repeat): a region's freeze without krex",
    )
    ap.add_argument(
        "--cooled",
        action="store_true",
        help=f"also run it as --frozen does, but with each timing {COOL_S:.0f} s after the stop "
        "(every repeat): the GPU cooled down from the siblings' work, their memory still held",
    )
    ap.add_argument(
        "--settled",
        metavar="S",
        type=float,
        help="also run krex-settled (every repeat): krex beside the same siblings, each final "
        "timing in a region (krex.region()) that first idles S seconds, as exclusive-frozen "
        "waits after its stop: whether a region that let the GPU settle would read closer",
    )
    ap.add_argument(
        "--sample-ms",
        type=float,
        default=Telemetry.PERIOD_S * 1000,
        help="NVML's sampling period (default %(default)s); the kernelbench and events parts "
        "keep every sample of their timings",
    )
    ap.add_argument(
        "--slice",
        metavar="REGION/SHARED",
        help="the krex daemon's CPU slice for the GPU, as two CPU lists (e.g. 12-15/0-11; "
        "default: derived from the topology, region cores first): where a region's owner runs",
    )
    ap.add_argument(
        "--region-settle",
        type=float,
        metavar="S",
        help="also run krex-settle (every repeat): krex beside the same siblings with `krex run "
        "--settle S`, each region idling S seconds after the freeze where the siblings worked "
        "in the last second (the daemon's step, no krex code in the command)",
    )
    ap.add_argument(
        "--rotate",
        action="store_true",
        help="rotate the order of the modes by one each repeat (with as many repeats as modes, "
        "each mode runs once in each place): without it exclusive always runs first, after the "
        "GPU has idled",
    )
    ap.add_argument(
        "--no-unprotected",
        action="store_true",
        help="leave out the unprotected mode (the autotuners' control), for runs about timings",
    )
    ap.add_argument(
        "--pool-ready",
        action="store_true",
        help="inductor_kb9: wait until Inductor's compile workers are up before compiling (its "
        "choices are then compiled in them, and those the GPU cannot run fail only at their "
        "benchmark, after a compile in the command itself: krex/tenant/precompile.py)",
    )
    ap.add_argument(
        "--kernelbench-timing",
        metavar="PATH",
        type=Path,
        help="KernelBench's own src/kernelbench/timing.py (its package's other modules left "
        "out: they import LLM clients), taken by get_timing_function('cuda_event') as its eval "
        "does; default: a stand-in of the same shape",
    )
    ap.add_argument(
        "--pinned",
        metavar="CPUS",
        help="also run exclusive-pinned (every repeat): the candidate alone, natively, on CPUS "
        "only (a CPU list such as 0-3, e.g. the region cores krex pins an owner to)",
    )
    ap.add_argument(
        "--alone",
        action="store_true",
        help="also run the candidate under krex with no siblings (first repeat only): krex's "
        "own effect, apart from what the siblings leave behind (the GPU's temperature)",
    )
    ap.add_argument(
        "--alone-each",
        action="store_true",
        help="the same as --alone, in every repeat (enough krex-alone runs to set against the "
        "exclusive runs' spread)",
    )
    args = ap.parse_args()
    if args.judge:
        return judge(args.judge, Path(args.json), ap)
    global LINGER_S, SETTLE_S, REGION_SETTLE_S, PINNED
    LINGER_S = args.linger
    if args.pinned is not None:
        try:
            PINNED = parse_cpu_list(args.pinned)
        except SliceError as e:
            ap.error(f"--pinned: {e}")
        if not PINNED or PINNED - os.sched_getaffinity(0):
            ap.error(
                f"--pinned: {args.pinned!r} names no CPU or one this script may not use "
                f"(it may use {format_cpu_list(os.sched_getaffinity(0))})"
            )
    if args.region_settle is not None:
        if not 0 < args.region_settle <= 5:
            ap.error("--region-settle: between 0 and 5 seconds")
        REGION_SETTLE_S = args.region_settle
    if args.settled is not None:
        if not 0 < args.settled <= 5:
            ap.error("--settled: between 0 and 5 seconds")
        SETTLE_S = args.settled
    if args.repeats < 1 or args.first_repeat < 0:
        ap.error("--repeats must be 1 or more and --first-repeat 0 or more")
    bad = [p for p in args.parts.split(",") if p not in PARTS]
    if bad or not args.parts:
        ap.error(f"--parts: unknown {', '.join(bad) or '(none given)'}; known: {', '.join(PARTS)}")
    if args.pool_ready:
        os.environ["AUTOTUNE_POOL_READY"] = "1"  # every mode's command gets it
    timing_source = KERNELBENCH_TIMING
    if args.kernelbench_timing is not None:
        try:
            timing_source = args.kernelbench_timing.read_text()
        except OSError as e:
            ap.error(f"--kernelbench-timing: {e}")
        if "def time_execution_with_cuda_event(" not in timing_source:
            ap.error(f"--kernelbench-timing: {args.kernelbench_timing} has no cuda_event timer")
    out = Path(args.json)
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if args.slice:
        try:
            config = slice_config(args.slice, out.with_suffix(".config.toml"))
        except ValueError as e:
            ap.error(f"--slice: {e}")
        os.environ["KREX_CONFIG"] = str(config)  # the daemon's; commands' KREX_ are cleared
    doc["command"] = "python3 scripts/bench/autotune_check.py " + " ".join(sys.argv[1:])
    doc["kernelbench_timing"] = (  # which timer the kernelbench parts ran
        "stand-in"
        if args.kernelbench_timing is None
        else f"{args.kernelbench_timing.name} sha256 "
        + hashlib.sha256(timing_source.encode()).hexdigest()[:16]
    )
    doc["runs"] = []
    with tempfile.TemporaryDirectory(prefix="krex-autotune-") as d:
        tmp = Path(d)
        (tmp / "lib" / "kernelbench").mkdir(parents=True)
        (tmp / "lib" / "kernelbench" / "__init__.py").write_text("")
        (tmp / "lib" / "kernelbench" / "timing.py").write_text(timing_source)
        (tmp / "autotune.py").write_text(AUTOTUNE)
        with (
            private_daemon(tmp / "d", sim=False, slots=8, pool=0, gpus=1) as sock,
            Telemetry(args.sample_ms / 1000) as gpu,
            _mps(tmp / "mps", args.sharing == "mps"),
        ):
            for rep in range(args.first_repeat, args.first_repeat + args.repeats):
                modes = ["exclusive", *([] if args.no_unprotected else ["unprotected"]), "krex"]
                if args.alone_each or (args.alone and rep == args.first_repeat):
                    modes.append("krex-alone")
                if args.held:
                    modes.append("exclusive-held")
                if args.settled is not None:
                    modes.append("krex-settled")
                if args.region_settle is not None:
                    modes.append("krex-settle")
                if args.frozen:
                    modes.append("exclusive-frozen")
                if args.cooled:
                    modes.append("exclusive-cooled")
                if args.pinned is not None:
                    modes.append("exclusive-pinned")
                if args.rotate:
                    modes = modes[rep % len(modes) :] + modes[: rep % len(modes)]
                for mode in modes:
                    doc["runs"].append(one(tmp, mode, sock, rep, args.siblings, gpu, args.parts))
                    if (
                        not doc["runs"][-1].get("parts")
                        and rep == args.first_repeat
                        and mode == "exclusive"
                    ):
                        print("the candidate produced nothing alone: stopping", flush=True)
                        out.write_text(json.dumps(doc, indent=1) + "\n")
                        return 1
                    doc["verdict"] = verdict(doc["runs"])
                    out.write_text(json.dumps(doc, indent=1) + "\n")
            log = tmp / "d" / "daemon.log"
            if log.exists():
                out.with_suffix(".daemon.log").write_text(log.read_text()[-100_000:])
    print(json.dumps(doc["verdict"], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
