"""The fork-server pool on a real GPU, a short check (issues #17 and #21): what the workers
preloaded, a compute-bound kernel warm against exclusive, and command walls warm and cold.

1. exclusive, no krex, fresh processes: the 8192^3 bf16 matmul (scripts/bench/bw_candidate.py)
   twice; the softmax eager and torch.compile candidates of the bench suite once each;
2. through `krex run` (8 slots, the default pool): the matmul three times warm and once cold;
   the softmax eager candidate three times warm and once cold; the compiled one once warm.
Each command has fresh compile caches; walls are measured around the whole command.

    python3 scripts/bench/warm_check.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from krex.bench import suite
from krex.bench.runner import run_timed
from krex.client.run import private_daemon, status

ROOT = Path(__file__).resolve().parents[2]
MATMUL = [sys.executable, str(ROOT / "scripts" / "bench" / "bw_candidate.py"), "matmul"]


def task(name: str, variant: str) -> list[str]:
    return [sys.executable, str(suite.TASKS_DIR / f"{name}.py"), variant]


def one(argv: list[str], sock: Path | None, warm: bool, tmp: Path, tag: str) -> dict[str, Any]:
    r = run_timed(argv, tmp, tag, sock=sock, warm=warm, timeout=300)
    row: dict[str, Any] = {"tag": tag, "wall_s": round(r.wall_s, 3), "rc": r.rc}
    if r.result is not None:
        row["median_ms"] = r.result.get("median_ms")
    else:
        row["stderr"] = r.stderr[-1500:]
    if r.report is not None:
        row["pool"] = r.report.get("pool")
        row["pool_reason"] = r.report.get("pool_reason")
        regions = r.report["regions"]
        row["warnings"] = [[w["name"] for w in x.get("warnings", [])] for x in regions]
        row["clean"] = [x.get("clean") for x in regions]
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows += [one(MATMUL, None, False, tmp, f"exclusive-matmul-{i}") for i in range(2)]
        rows.append(one(task("softmax", "eager"), None, False, tmp, "exclusive-eager"))
        rows.append(one(task("softmax", "compiled"), None, False, tmp, "exclusive-compiled"))
        t0 = time.monotonic()
        with private_daemon(tmp / "d", sim=False, slots=8, gpus=1) as sock:
            doc["pool_ready_s"] = round(time.monotonic() - t0, 1)
            doc["pool"] = status(False, str(sock))["gpus"][0]["pool"]
            print("pool", doc["pool_ready_s"], doc["pool"], flush=True)
            rows += [one(MATMUL, sock, True, tmp, f"warm-matmul-{i}") for i in range(3)]
            rows.append(one(MATMUL, sock, False, tmp, "cold-matmul"))
            rows += [
                one(task("softmax", "eager"), sock, True, tmp, f"warm-eager-{i}") for i in range(3)
            ]
            rows.append(one(task("softmax", "eager"), sock, False, tmp, "cold-eager"))
            rows.append(one(task("softmax", "compiled"), sock, True, tmp, "warm-compiled"))
            doc["pool_after"] = status(False, str(sock))["gpus"][0]["pool"]
        log = tmp / "d" / "daemon.log"
        if log.exists():
            Path(args.json).with_suffix(".daemon.log").write_text(log.read_text()[-100_000:])
    doc["runs"] = rows
    ex = [r["median_ms"] for r in rows if r["tag"].startswith("exclusive-matmul")]
    if len(ex) == 2 and all(ex):
        mean = sum(ex) / 2
        doc["matmul"] = {
            "exclusive_ms": ex,
            "spread_pts": abs(ex[0] - ex[1]) / mean * 100,
            "krex_pct": {
                r["tag"]: (r["median_ms"] - mean) / mean * 100
                for r in rows
                if "matmul" in r["tag"] and r["tag"][0] in "wc" and r.get("median_ms")
            },
        }
        print(json.dumps(doc["matmul"]), flush=True)
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
