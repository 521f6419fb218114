"""A timing right after an autotuner's candidates, on a real GPU (krex/tenant/markers.py): a
`@triton.autotune` kernel's first call times its configurations (candidate regions), then
`do_bench` times the winner at once, within KREX_REGION_LINGER_S. The timing must get a region
of its own, not a candidate's, so that the daemon's settle rules (which leave candidates out)
apply to the number the command reports; two timings back to back still share one region.
With --siblings N the kernel is the bench suite's power-limited fp16 8192^3 matmul (its four
Triton configurations) beside N bursty sibling commands under the same daemon, where the
power-capped settle can fire on the timings' region (its `settle_s` is reported, not required:
it needs the GPU to have hit its power limit in an earlier region).

    python3 scripts/gpu/linger_check.py --out DIR [--siblings 7]   (DIR/linger_check.json)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from krex.bench.runner import not_ready
from krex.client.run import private_daemon

PROG = """
import torch, triton, triton.language as tl

@triton.autotune(configs=[triton.Config({"B": b}) for b in (256, 512, 1024, 2048)], key=["n"])
@triton.jit
def add(x, y, o, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(o + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

n = 1 << 26
x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
o = torch.empty_like(x)
grid = lambda meta: (triton.cdiv(n, meta["B"]),)
fn = lambda: add[grid](x, y, o, n)
fn()  # autotunes: each configuration timed through do_bench, a candidate's region
ms = triton.testing.do_bench(fn, return_mode="median")  # the reported timing, at once
ms2 = triton.testing.do_bench(fn, return_mode="median")  # and another, back to back
torch.testing.assert_close(o, x + y)
print("ok", ms, ms2, add.best_config)
"""
# The bench suite's matmul task at its size, its four Triton configurations autotuned (as
# scripts/bench/autotune_check.py's triton8k part), then timed at once.
PROG_MATMUL = r"""
import re, torch, triton
from krex.bench.tasks import autotune as at, matmul as mm
configs = [at._config(*map(int, m.groups())) for m in
           (re.fullmatch(r"triton-(\d+)x(\d+)x(\d+)-s(\d+)w(\d+)", v) for v in mm.VARIANTS) if m]
tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(mm._matmul)
a, b = mm.make_inputs(torch.Generator(device="cuda").manual_seed(0))
M, K = a.shape
N = b.shape[1]
c = torch.empty(M, N, device="cuda", dtype=a.dtype)
grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)
fn = lambda: tuned[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         c.stride(0), c.stride(1))
fn()  # autotunes: each configuration timed through do_bench, a candidate's region
ms = triton.testing.do_bench(fn, return_mode="median")  # the reported timing, at once
ms2 = triton.testing.do_bench(fn, return_mode="median")
print("ok", ms, ms2, len(configs), tuned.best_config)
"""
KREX = [sys.executable, "-m", "krex.cli"]
DO_BENCH = "triton.testing.do_bench"
# The autotune check's sibling program (bursty: 0.05-0.5 s of 8192^2 matmuls, then idle).
SIBLING = Path(__file__).resolve().parents[1] / "bench" / "sibling_matmul.py"


def timing_regions(regions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The regions that were not an autotuner's candidates': the reported timings'."""
    return [r for r in regions if not r.get("candidate")]


def judge(rc: int | None, out: str, regions: list[dict[str, Any]]) -> dict[str, bool]:
    """The check's verdicts on the command's status, output and report regions."""
    cands = [r for r in regions if r.get("candidate")]
    timings = timing_regions(regions)
    return {
        "ran": rc == 0 and "ok " in out,
        "clean": bool(regions) and all(r.get("clean") for r in regions),
        # Triton's Autotuner._bench: each of the four configurations' do_bench, and nothing
        # more, in candidates' regions (before: the timings continued the last of them)
        "candidates": sum(r.get("calls", {}).get(DO_BENCH, 0) for r in cands) == 4,
        # the two reported timings: one region, of its own, that is not a candidate's
        "the timings' own region": len(timings) == 1 and timings[0].get("calls") == {DO_BENCH: 2},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--siblings", type=int, default=0, help="bursty sibling commands (0-15)")
    args = ap.parse_args()
    if not 0 <= args.siblings <= 15:
        ap.error("--siblings must be between 0 and 15")
    tmp = Path(tempfile.mkdtemp(prefix="krex-linger-"))
    report = tmp / "report.json"
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    res["siblings"] = args.siblings
    sibs: list[subprocess.Popen[str]] = []
    with private_daemon(tmp / "d", sim=False, slots=args.siblings + 1, pool=0) as sock:
        run = [*KREX, "run", "--socket", str(sock), "--no-pool"]
        try:
            if args.siblings:
                sibs = [
                    subprocess.Popen(
                        [*run, "--", sys.executable, str(SIBLING), "bursty"],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                    )
                    for _ in range(args.siblings)
                ]
                if late := not_ready(sibs):
                    raise SystemExit(f"{len(late)} of {args.siblings} siblings did not start")
            prog = tmp / "autotune_then_time.py"  # triton's @jit reads its source from a file
            prog.write_text(PROG_MATMUL if args.siblings else PROG)
            cmd = [*run, "--auto-regions", "--report", str(report), "--", sys.executable]
            try:
                p = subprocess.run(
                    [*cmd, str(prog)], cwd=tmp, capture_output=True, text=True, timeout=300
                )
                rc, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                rc, out, err = None, str(e.stdout or ""), str(e.stderr or "") + "\n(timed out)"
        finally:
            for sib in sibs:
                sib.kill()
                sib.wait()
    regions = json.loads(report.read_text()).get("regions", []) if report.exists() else []
    kept = ("candidate", "calls", "clean", "duration_s", "settle_s", "settle_capped", "warnings")
    res["regions"] = [{k: r[k] for k in kept if k in r} for r in regions]
    for r in res["regions"]:  # the warnings' names (their details are in the report)
        r["warnings"] = [w.get("name") for w in r.get("warnings", [])]
    res["timings_settle_s"] = [r.get("settle_s") for r in timing_regions(res["regions"])]
    res.update(rc=rc, stdout=out[-400:], stderr_tail=err[-1500:])
    res["checks"] = checks = judge(rc, out, regions)
    res["pass"] = all(checks.values())
    (args.out / "linger_check.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({"checks": checks, "regions": res["regions"]}, indent=1))
    print("linger check:", "pass" if res["pass"] else "FAIL")
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
