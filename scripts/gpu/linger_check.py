"""A timing right after an autotuner's candidates, on a real GPU (krex/markers.py): a
`@triton.autotune` kernel's first call times its configurations (candidate regions), then
`do_bench` times the winner at once, within KREX_REGION_LINGER_S. The timing must get a region
of its own, not a candidate's, so that the daemon's settle rules (which leave candidates out)
apply to the number the command reports; two timings back to back still share one region.

    python3 scripts/gpu/linger_check.py --out DIR    (writes DIR/linger_check.json)
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

from krex.client import private_daemon

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
KREX = [sys.executable, "-m", "krex.cli"]
DO_BENCH = "triton.testing.do_bench"


def judge(rc: int | None, out: str, regions: list[dict[str, Any]]) -> dict[str, bool]:
    """The check's verdicts on the command's status, output and report regions."""
    cands = [r for r in regions if r.get("candidate")]
    timings = [r for r in regions if not r.get("candidate")]
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
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="krex-linger-"))
    report = tmp / "report.json"
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with private_daemon(tmp / "d", sim=False, slots=2, pool=0) as sock:
        cmd = [*KREX, "run", "--socket", str(sock), "--auto-regions", "--no-pool"]
        prog = tmp / "autotune_then_time.py"  # triton's @jit reads its source from a file
        prog.write_text(PROG)
        cmd += ["--report", str(report), "--", sys.executable, str(prog)]
        try:
            p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = None, str(e.stdout or ""), str(e.stderr or "") + "\n(timed out)"
    regions = json.loads(report.read_text()).get("regions", []) if report.exists() else []
    kept = ("candidate", "calls", "clean", "duration_s", "settle_s")
    res["regions"] = [{k: r[k] for k in kept if k in r} for r in regions]
    res.update(rc=rc, stdout=out[-400:], stderr_tail=err[-1500:])
    res["checks"] = checks = judge(rc, out, regions)
    res["pass"] = all(checks.values())
    (args.out / "linger_check.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({"checks": checks, "regions": res["regions"]}, indent=1))
    print("linger check:", "pass" if res["pass"] else "FAIL")
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
