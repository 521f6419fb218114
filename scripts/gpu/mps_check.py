"""MPS as the controller option (`[mps] enabled = true`): the daemon starts its own MPS control
daemon with private pipe and log directories, tenants run through it, regions still protect.

    python3 scripts/gpu/mps_check.py --out DIR
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

HERE = Path(__file__).resolve().parent
KREX = [sys.executable, "-m", "krex.cli"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="krex-mps-"))
    cfg = tmp / "config.toml"
    cfg.write_text("[mps]\nenabled = true\n")
    sock = tmp / "krex.sock"
    log = open(args.out / "mps_daemon.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen(
        [*KREX, "daemon", "--config", str(cfg), "--socket", str(sock)], stdout=log, stderr=log
    )
    run = [*KREX, "run", "--socket", str(sock)]
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    sibs: list[subprocess.Popen[str]] = []
    try:
        time.sleep(3)
        st = subprocess.run(
            [*KREX, "status", "--json", "--socket", str(sock)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        res["status_mps"] = json.loads(st.stdout)["mps"] if st.returncode == 0 else st.stderr
        owner = [*run, "--", sys.executable, str(HERE / "owner.py"), "2"]
        p = subprocess.run(owner, capture_output=True, text=True, timeout=120)
        res["solo"] = p.stdout.strip().splitlines()[-1:] or p.stderr[-1500:]
        for _ in range(3):
            sibs.append(
                subprocess.Popen(
                    [*run, "--", sys.executable, str(HERE / "sibling.py")],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for s in sibs:
            assert s.stdout is not None
            s.stdout.readline()
        p = subprocess.run(owner, capture_output=True, text=True, timeout=120)
        res["in_region_next_to_3"] = p.stdout.strip().splitlines()[-1:] or p.stderr[-1500:]
        res["mps_server_running"] = subprocess.run(
            ["pgrep", "-f", "nvidia-cuda-mps-server"], capture_output=True, text=True
        ).stdout.split()
    finally:
        for s in sibs:
            s.terminate()
        for s in sibs:
            s.wait(timeout=60)
        daemon.terminate()
        daemon.wait(timeout=60)
        time.sleep(1)
        res["mps_control_after_stop"] = subprocess.run(
            ["pgrep", "-f", "nvidia-cuda-mps"], capture_output=True, text=True
        ).stdout.split()
        (args.out / "mps_check.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
