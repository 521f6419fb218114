"""The controller on the H200 (issue: controller): fidelity next to 7 busy siblings, the same
with auto-regions on an unmodified script, and region grant latency with 8 idle siblings.

    python3 scripts/gpu/controller_check.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KREX = [sys.executable, "-m", "krex.cli"]


def run_json(cmd: list[str], timeout: float = 120) -> dict[str, Any]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sock = Path(tempfile.mkdtemp(prefix="krex-ctl-")) / "krex.sock"
    log = open(args.out / "controller_daemon.log", "w")  # noqa: SIM115
    # 16 slots: 8 idle siblings and the latency probe must fit at once.
    daemon = subprocess.Popen(
        [*KREX, "daemon", "--socket", str(sock), "--slots", "16"], stdout=log, stderr=log
    )
    run = [*KREX, "run", "--socket", str(sock)]
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python3 scripts/gpu/controller_check.py --out $OUT",
    }
    sibs: list[subprocess.Popen[str]] = []

    def start_sibs(script: str, n: int) -> None:
        for _ in range(n):
            p = subprocess.Popen(
                [*run, "--", sys.executable, str(HERE / script)], stdout=subprocess.PIPE, text=True
            )
            sibs.append(p)
        for p in sibs[-n:]:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"

    def stop_sibs() -> None:
        for p in sibs:
            p.kill()
        for p in sibs:
            p.wait()
        sibs.clear()

    try:
        time.sleep(2)
        res["nvml"] = subprocess.run(
            [
                sys.executable,
                "-c",
                "from krex.core.nvml import Nvml; n = Nvml.open(); "
                "print(n.sample(0) if n else 'no NVML')",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        res["status"] = json.loads(
            subprocess.run(
                [*KREX, "status", "--json", "--socket", str(sock)],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
        )
        owner = [
            *run,
            "--report",
            str(args.out / "owner_report.json"),
            "--",
            sys.executable,
            str(HERE / "owner.py"),
            "5",
        ]
        res["solo"] = run_json(owner)
        start_sibs("sibling.py", 7)
        time.sleep(2)
        res["shared_unprotected"] = run_json(
            [*run, "--", sys.executable, str(HERE / "owner.py"), "3", "--no-region"]
        )
        res["shared_in_region"] = run_json(owner)
        res["shared_in_region_report"] = json.loads((args.out / "owner_report.json").read_text())
        res["auto_regions"] = run_json(
            [*run, "--auto-regions", "--", sys.executable, str(HERE / "owner_unmodified.py")]
        )
        stop_sibs()
        res["solo_after"] = run_json(owner)
        start_sibs("idle.py", 8)
        res["grant_latency_8_idle"] = run_json(
            [*run, "--", sys.executable, str(HERE / "grant_latency.py"), "300"]
        )
        stop_sibs()
        solo = statistics.median(res["solo"]["medians_ms"] + res["solo_after"]["medians_ms"])
        res["solo_median_ms"] = solo
        for key in ("shared_unprotected", "shared_in_region", "auto_regions"):
            res[key]["inflation"] = statistics.median(res[key]["medians_ms"]) / solo - 1
        res["target_met"] = all(
            abs(res[k]["inflation"]) <= 0.01 for k in ("shared_in_region", "auto_regions")
        )
    finally:
        stop_sibs()
        daemon.terminate()
        daemon.wait(timeout=60)
        (args.out / "controller_check.json").write_text(json.dumps(res, indent=2))
    print(
        json.dumps(
            {k: v for k, v in res.items() if k not in ("status", "shared_in_region_report")},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
