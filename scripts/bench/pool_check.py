"""The warm pool on a real GPU (issue #17): a mixed workload of eager and torch.compile
candidates from the bench suite (`krex/bench/tasks/`), every command with fresh compile caches.

In one run:
1. exclusive: each command alone, natively (no krex), one after another: the baseline of
   throughput and of each command's timing;
2. one slot: a daemon with one slot: the commands one at a time through `krex run`, cold
   (`--no-pool`) and warm;
3. 8 and 16 slots: cold, one command per slot, all at once (16: the mix twice); warm, the mix
   repeated to --commands (default 32, the workload of issue #17), as many at once as there are
   slots (a command starts as soon as one ends), so that throughput is measured over several
   waves as an agent's queue runs, not over the slowest command of one.
Per command: its wall time around `krex run` (until `krex run` returns), whether it ran warm,
its timing (median_ms) against its exclusive one. Written to --json; a table at the end.

    python3 scripts/bench/pool_check.py --json OUT.json [--phases exclusive,1,8,16] [--commands 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from krex.bench import suite
from krex.bench.runner import run_timed
from krex.client.run import private_daemon, status

# Eager and compiled candidates of four tasks (kernels from < 0.1 ms to a few ms).
MIX = [
    ("softmax", "eager"),
    ("softmax", "compiled"),
    ("layernorm", "eager"),
    ("layernorm", "compiled"),
    ("reduction", "torch-sum"),
    ("reduction", "compiled"),
    ("elementwise", "eager"),
    ("elementwise", "compiled"),
]
BANDS = ((0.0, 0.1), (0.1, 1.0), (1.0, 10.0), (10.0, float("inf")))


def one(
    sock: Path | None, task: str, variant: str, warm: bool, tmp: Path, tag: str
) -> dict[str, Any]:
    argv = [sys.executable, str(suite.TASKS_DIR / f"{task}.py"), variant]
    r = run_timed(argv, tmp, tag, sock=sock, warm=warm, timeout=400)
    row: dict[str, Any] = {
        "task": task,
        "variant": variant,
        "kind": "compile" if variant == "compiled" else "eager",
        "wall_s": r.wall_s,
        "rc": r.rc,
    }
    if r.rc == 0 and r.result is not None:
        row["median_ms"] = r.result.get("median_ms")
        row["setup_s"] = r.result.get("setup_s")
    else:
        row["stderr"] = r.stderr[-1500:]
    if r.report is not None:
        row["pool"] = r.report.get("pool")
        row["pool_reason"] = r.report.get("pool_reason")
        row["regions"] = [
            {k: x.get(k) for k in ("clean", "duration_s", "warnings", "problems")}
            for x in r.report.get("regions", [])
        ]
    return row


def batch(
    sock: Path | None, cmds: list[tuple[str, str]], warm: bool, tmp: Path, tag: str, at_once: int
) -> dict[str, Any]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=at_once) as ex:
        rows = list(
            ex.map(
                lambda ic: one(sock, ic[1][0], ic[1][1], warm, tmp, f"{tag}-{ic[0]}"),
                enumerate(cmds),
            )
        )
    wall = time.monotonic() - t0
    res: dict[str, Any] = {
        "commands": len(cmds),
        "wall_s": wall,
        "cmds_per_min": 60 * len(cmds) / wall,
    }
    res["failed"] = sum(r["rc"] != 0 for r in rows)
    res["warm"] = sum(r.get("pool") == "warm" for r in rows)
    for kind in ("eager", "compile"):
        walls = sorted(r["wall_s"] for r in rows if r["kind"] == kind)
        if walls:
            res[f"{kind}_wall_s"] = {
                "median": statistics.median(walls),
                "p95": walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))],
            }
    res["runs"] = rows
    print(
        f"{tag:10} {len(cmds)} cmds: {wall:6.1f} s, {res['cmds_per_min']:5.1f}/min, "
        f"warm {res['warm']}, failed {res['failed']}, "
        + ", ".join(
            f"{k} median {res[f'{k}_wall_s']['median']:.2f} s p95 {res[f'{k}_wall_s']['p95']:.2f} s"
            for k in ("eager", "compile")
            if f"{k}_wall_s" in res
        ),
        flush=True,
    )
    return res


def inflation(doc: dict[str, Any]) -> dict[str, Any]:
    """Each krex phase's timings against the exclusive ones, by band of the exclusive time."""
    base = {(r["task"], r["variant"]): r.get("median_ms") for r in doc["exclusive"]["runs"]}
    out: dict[str, Any] = {}
    for phase, res in doc.items():
        if not isinstance(res, dict) or "runs" not in res or phase == "exclusive":
            continue
        bands: dict[str, list[float]] = {}
        for r in res["runs"]:
            ref = base.get((r["task"], r["variant"]))
            if not ref or not r.get("median_ms"):
                continue
            lo, hi = next(b for b in BANDS if b[0] <= ref < b[1])
            infl = (r["median_ms"] - ref) / ref * 100
            bands.setdefault(f"{lo:g}-{hi:g} ms", []).append(infl)
        out[phase] = {
            band: {"n": len(v), "max_abs_pct": max(abs(x) for x in v), "values_pct": v}
            for band, v in sorted(bands.items())
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--phases", default="exclusive,1,8,16")
    ap.add_argument("--commands", type=int, default=32, help="warm commands at 8 and 16 slots")
    args = ap.parse_args()
    phases = args.phases.split(",")
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    doc["command"] = "python3 scripts/bench/pool_check.py " + " ".join(sys.argv[1:])
    out = Path(args.json)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "exclusive" in phases:
            doc["exclusive"] = batch(None, MIX, False, tmp, "exclusive", 1)
        for slots in (int(p) for p in phases if p.isdigit()):
            d = tmp / f"d{slots}"
            t0 = time.monotonic()
            with private_daemon(d, sim=False, slots=slots, gpus=1) as sock:
                doc[f"pool_ready_s_{slots}"] = time.monotonic() - t0
                cmds = MIX if slots == 1 else (MIX * (1 + slots // len(MIX)))[:slots]
                if slots == 1:
                    cmds = MIX[:4]  # two eager, two compiled: the one-slot phase is long
                for warm in (False, True):
                    tag = f"{'warm' if warm else 'cold'}{slots}"
                    if warm and slots > 1:  # several waves (cold: one, for device time)
                        cmds = (MIX * (1 + args.commands // len(MIX)))[: args.commands]
                    doc[tag] = batch(sock, cmds, warm, tmp, tag, slots)
                    out.write_text(json.dumps(doc, indent=1) + "\n")
                doc[f"pool_status_{slots}"] = status(False, str(sock))["gpus"][0]["pool"]
            log = d / "daemon.log"
            if log.exists():
                out.with_suffix(f".daemon{slots}.log").write_text(log.read_text()[-200_000:])
    if "exclusive" in doc:
        doc["inflation"] = inflation(doc)
        ex = doc["exclusive"]
        for tag in [k for k in doc if k.startswith(("warm", "cold")) and k[4:] in ("8", "16")]:
            n = doc[tag]["commands"]
            # Throughput against one command at a time: the same commands' exclusive walls.
            per = ex["wall_s"] / ex["commands"]
            doc[tag]["vs_exclusive"] = n * per / doc[tag]["wall_s"]
            print(f"{tag}: {doc[tag]['vs_exclusive']:.2f}x one at a time", flush=True)
        for phase, bands in doc["inflation"].items():
            print(phase, {b: round(v["max_abs_pct"], 2) for b, v in bands.items()}, flush=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
