"""Device memory under krex on a real GPU, side by side in one run (docs/memory.md).

Candidates (scripts/bench/memory_candidate.py) with working sets of 1 to 40 GiB, an eager and a
torch.compile variant each, fresh compile caches, do_bench in a region: run one at a time
(exclusive), 8 at once unprotected, and through krex at 8 and 16 slots (each krex mode with a
private daemon of its own). Per mode: commands that succeeded and failed (out-of-memory
counted apart), throughput over successful commands against exclusive, memory-wait p50/p95 from
the reports, and each candidate's median against its exclusive one.

Modes ending in -mps share the GPU through MPS (krex/daemon/mps.py): shared8-mps's commands are
clients of an MPS daemon started for the mode, krex8-mps's and krex16-mps's daemons run their own
(`krex daemon --mps`).

With --gpus 2 (a node of two GPUs, issue #20), every mode runs the mix on each GPU at once, the
mode's concurrency on each (natively: CUDA_VISIBLE_DEVICES; under krex: one daemon over both,
`krex run --gpu`), and the counts are given per GPU as well.

    python3 scripts/bench/memory_check.py --json OUT.json [--modes exclusive,shared8,krex8,krex16]
        [--gpus 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CANDIDATE = ROOT / "scripts" / "bench" / "memory_candidate.py"
SIZES_GIB = (2, 8, 16, 24, 32, 40)
LOGS = Path(tempfile.gettempdir())  # the daemons' logs: beside --json
# mode: (commands at once, krex slots or None for no krex, memory waits on, through MPS)
MODES = {
    "exclusive": (1, None, True, False),
    "shared8": (8, None, True, False),
    "shared8-mps": (8, None, True, True),
    "krex8": (8, 8, True, False),
    "krex8-mps": (8, 8, True, True),
    "krex16": (16, 16, True, False),
    "krex16-mps": (16, 16, True, True),
    # krex without memory arbitration (an allocation waits 1 ms, no rerun after a sharing
    # out-of-memory): the baseline of "timing no worse than without memory arbitration"; its
    # out-of-memory failures are expected.
    "krex8-nowait": (8, 8, False, False),
}


def commands(gpus: int = 1) -> list[tuple[float, str, int]]:
    """The mix, once per GPU: (size in GiB, variant, GPU)."""
    return [(s, m, g) for g in range(gpus) for s in SIZES_GIB for m in ("eager", "compile")]


def command_env(
    cache: Path, native_gpu: int | None = None, extra_env: dict[str, str] | None = None
) -> dict[str, str]:
    """A command's environment: this one without krex's variables, fresh compile caches under
    `cache`; `native_gpu`: the GPU a native command runs on (by CUDA_VISIBLE_DEVICES, in bus
    order); `extra_env`: more variables (an MPS daemon's, for a native command that is its
    client)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.pop("LD_PRELOAD", None)
    env |= extra_env or {}
    env |= {"TRITON_CACHE_DIR": str(cache / "t"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "i")}
    if native_gpu is not None:
        env |= {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(native_gpu)}
    return env


def agent_script(candidate: int, file: str) -> str:
    """Where an agent writes its candidate (sim_memory.py's and kb_memory.py's agents): one
    bench.py rewritten each time ("same": its command line repeats, a family,
    docs/memory.md) or a file each ("new": every command line new)."""
    return "bench.py" if file == "same" else f"cand{candidate}.py"


def krex_argv(
    argv: list[str],
    sock: Path,
    report: Path,
    retry: bool = True,
    gpu: int | None = None,
    auto_regions: bool = False,
    cold: bool = False,
) -> list[str]:
    """argv through `krex run` on the daemon at `sock`, its report to `report` (`cold`: not
    forked from a warm worker, `--no-pool`)."""
    return [sys.executable, "-m", "krex.cli", "run", "--socket", str(sock),
            *(["--auto-regions"] if auto_regions else []), "--report", str(report),
            *(["--no-pool"] if cold else []),
            *([] if retry else ["--no-memory-retry"]),
            *([] if gpu is None else ["--gpu", str(gpu)]), "--", *argv]  # fmt: skip


def report_fields(rep: dict[str, Any]) -> dict[str, Any]:
    """What a command's record keeps of its `krex run --report`."""
    return {
        "memory": rep.get("memory"),
        "pool": rep.get("pool"),
        "regions_clean": all(r.get("clean") for r in rep.get("regions", [])),
        "attempts": len(rep.get("attempts", [])),  # earlier runs (memory retries)
        "intercepted": rep.get("intercepted"),
    }


def run_one(
    size: float,
    mode: str,
    krex_socket: Path | None,
    cache: Path,
    report: Path,
    retry: bool = True,
    gpu: int | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One candidate; `gpu`: the GPU of a node of several it runs on (None: the default);
    `extra_env`: an MPS daemon's variables, for a native command that is its client."""
    env = command_env(cache, gpu if krex_socket is None else None, extra_env)
    argv = [sys.executable, str(CANDIDATE), str(size), mode]
    if krex_socket is not None:
        argv = krex_argv(argv, krex_socket, report, retry, gpu)
    t0 = time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    out: dict[str, Any] = {"size_gib": size, "variant": mode, "rc": p.returncode}
    if gpu is not None:
        out["gpu"] = gpu
    out["wall_s"] = time.monotonic() - t0
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if lines:
        out |= json.loads(lines[-1])
    out["oom"] = bool(out.get("oom")) or "OutOfMemoryError" in p.stderr
    if p.returncode != 0:
        out["stderr_tail"] = p.stderr[-600:]
    if krex_socket is not None and report.exists():
        out |= report_fields(json.loads(report.read_text()))
    return out


@contextlib.contextmanager
def daemon(
    tmp: Path,
    slots: int,
    waits: bool = True,
    mps: bool = False,
    start_s: float = 120,
    stop_s: float = 60,
    sim: bool = False,
    env: dict[str, str] | None = None,
    tag: str = "",
    config: str = "",
) -> Iterator[Path]:
    """A private daemon of `slots` slots (default configuration, or memory waits of 1 ms when
    not `waits`; `config`: more of its configuration file, TOML), its log in LOGS; yields its
    socket once its warm workers are ready, at most `start_s` seconds (RuntimeError then);
    stopped on exit, killed after `stop_s`. `sim`: of the simulated GPU, its node and driver's
    settings in `env` (the daemon's environment). `tag` names a daemon apart from another of
    the same settings: its socket, log and learned peaks (kept beside the socket) are its
    own; the same name again (in one TMP) starts knowing the peaks the last one learned."""
    name = f"{'sim-' if sim else ''}{slots}{'' if waits else '-nowait'}{'-mps' if mps else ''}"
    name += f"-{tag}" if tag else ""
    sock = tmp / f"krex-{name}.sock"
    cfg = tmp / f"krex-{name}.toml"
    cfg.write_text(("" if waits else "[memory]\nwait_s = 0.001\n") + config)
    log_path = LOGS / f"daemon-{name}.log"
    # Appended to: a mode run twice under one name keeps both daemons' logs.
    log = open(log_path, "ab")  # noqa: SIM115
    start = log.tell()
    argv = [sys.executable, "-m", "krex.cli", "daemon", "--socket", str(sock)]
    proc = subprocess.Popen(
        [*argv, "--slots", str(slots), "--config", str(cfg), *(["--mps"] if mps else []),
         *(["--sim"] if sim else [])],
        stdout=log,
        stderr=log,
        env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + start_s
        while True:
            st = subprocess.run(
                [sys.executable, "-m", "krex.cli", "status", "--json", "--socket", str(sock)],
                capture_output=True,
                text=True,
                env=env,
            )
            if st.returncode == 0:
                doc = json.loads(st.stdout)
                pools = [g["pool"] for g in doc["gpus"]]
                if all(p["idle"] >= p["target"] for p in pools):  # the warm workers are ready
                    if mps and not doc.get("mps"):
                        raise RuntimeError("krex daemon --mps runs without MPS: " + st.stdout)
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                with open(log_path, "rb") as f:
                    f.seek(start)
                    mine = f.read().decode(errors="replace")
                raise RuntimeError("daemon did not start: " + mine)
            time.sleep(0.5)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def run_mode(name: str, tmp: Path, gpus: int = 1) -> dict[str, Any]:
    """One mode over the mix; with `gpus` > 1 the mix on each GPU, `concurrency` on each."""
    concurrency, slots, arbitrate, mps = MODES[name]
    cmds = commands(gpus)
    extra: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(daemon(tmp, slots, arbitrate, mps)) if slots else None
        if mps and not slots:  # native clients of an MPS daemon of the mode's own
            from krex.daemon.mps import Mps

            server = Mps.start(tmp / f"mps-{name}")
            stack.callback(server.stop)
            extra = server.env()
        t0 = time.monotonic()
        # One pool per GPU, so that each GPU has `concurrency` commands at once.
        pools = [stack.enter_context(ThreadPoolExecutor(concurrency)) for _ in range(gpus)]
        futs = [
            pools[g].submit(
                run_one,
                s,
                m,
                sock,
                tmp / f"{name}-{i}",
                tmp / f"{name}-{i}.json",
                arbitrate,
                g if gpus > 1 else None,
                extra,
            )
            for i, (s, m, g) in enumerate(cmds)
        ]
        results = [f.result() for f in futs]
        wall = time.monotonic() - t0
    out = {"mode": name, "concurrency": concurrency, **_counts(results, wall)}
    if gpus > 1:
        out["per_gpu"] = {
            str(g): _counts([r for r in results if r.get("gpu") == g], wall) for g in range(gpus)
        }
    return out | {"commands": results}


def _counts(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [r for r in results if r["rc"] == 0]
    waits = sorted(r["memory"]["wait_s"] for r in results if r.get("memory"))
    return {
        "wall_s": wall,
        "succeeded": len(ok),
        "failed": len(results) - len(ok),
        "oom": sum(r["oom"] for r in results),
        "cmds_per_min_ok": 60 * len(ok) / wall,
        "mem_wait_p50_s": _q(waits, 0.5),
        "mem_wait_p95_s": _q(waits, 0.95),
    }


def _q(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def summarise(modes: list[dict[str, Any]]) -> dict[str, Any]:
    base = next(m for m in modes if m["mode"] == "exclusive")

    def key(c: dict[str, Any]) -> tuple[Any, ...]:
        return c["size_gib"], c["variant"], c.get("gpu")

    ref = {key(c): c.get("median_ms") for c in base["commands"]}
    for m in modes:
        m["throughput_vs_exclusive"] = m["cmds_per_min_ok"] / base["cmds_per_min_ok"]
        infl = []
        for c in m["commands"]:
            r = ref.get(key(c))
            if c["rc"] == 0 and r and c.get("median_ms"):
                c["inflation"] = c["median_ms"] / r - 1
                infl.append(abs(c["inflation"]))
        infl.sort()
        m["inflation_p50"] = _q(infl, 0.5)
        m["inflation_p95"] = _q(infl, 0.95)
        m["inflation_max"] = infl[-1] if infl else None
    return {"modes": modes}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--modes", default="exclusive,shared8,krex8,krex16", help=", ".join(MODES))
    ap.add_argument("--gpus", type=int, default=1, help="the mix on each of this many GPUs")
    args = ap.parse_args()
    if args.gpus < 1:
        ap.error(f"--gpus must be 1 or more, not {args.gpus}")
    global LOGS
    LOGS = args.json.resolve().parent
    names = [m for m in args.modes.split(",") if m]
    unknown = [m for m in names if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix="krex-mem-") as d:
        modes = []
        for name in names:
            print(f"== {name}", flush=True)
            modes.append(run_mode(name, Path(d), args.gpus))
            m = modes[-1]
            args.json.write_text(json.dumps({"partial": True, "modes": modes}, indent=1))
            rate = m["cmds_per_min_ok"]
            print(f"   {m['succeeded']} ok, {m['failed']} failed ({m['oom']} OOM), "
                  f"{m['wall_s']:.0f} s, {rate:.1f} ok/min", flush=True)  # fmt: skip
            for g, c in m.get("per_gpu", {}).items():
                print(f"   GPU {g}: {c['succeeded']} ok, {c['failed']} failed ({c['oom']} OOM)")
        doc: dict[str, Any] = summarise(modes) if "exclusive" in names else {"modes": modes}
    doc["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    doc["command"] = "python3 scripts/bench/memory_check.py " + " ".join(sys.argv[1:])
    args.json.write_text(json.dumps(doc, indent=1))
    print(f"{'mode':10} {'ok':>3} {'fail':>4} {'oom':>3} {'wall s':>7} {'x excl':>6} "
          f"{'wait p50':>8} {'wait p95':>8} {'infl p95':>8} {'infl max':>8}")  # fmt: skip
    for m in doc["modes"]:

        def f(v: Any, spec: str = ".3f") -> str:
            return "-" if v is None else format(v, spec)

        print(f"{m['mode']:10} {m['succeeded']:>3} {m['failed']:>4} {m['oom']:>3} "
              f"{m['wall_s']:>7.0f} {f(m.get('throughput_vs_exclusive'), '.2f'):>6} "
              f"{f(m['mem_wait_p50_s']):>8} {f(m['mem_wait_p95_s']):>8} "
              f"{f(m.get('inflation_p95')):>8} {f(m.get('inflation_max')):>8}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
