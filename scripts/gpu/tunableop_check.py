"""PyTorch TunableOp under `krex run --auto-regions` on a real GPU: the one warning where its
tuning is on (krex/tenant/tunableop.py), none where it is off or krex is not there, in a warm pool
worker and in a process of its own; and the daemon's log of the run (pool workers that stop
are logged as stopped, not warned about).

    python3 scripts/gpu/tunableop_check.py --out DIR    (writes DIR/tunableop_check.json)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from krex.client.run import private_daemon
from krex.tenant import tunableop

# A GEMM that TunableOp tunes on its first call, when it tunes.
PROG = (
    "import torch\n"
    "a = torch.randn(512, 512, device='cuda')\n"
    "if 'in-code' in __import__('sys').argv: torch.cuda.tunable.enable(True)\n"
    "print('ok', float((a @ a).sum()))\n"
)
KREX = [sys.executable, "-m", "krex.cli"]


def case(
    name: str, under_krex: list[str] | None, env: dict[str, str], args: list[str], tmp: Path
) -> dict[str, Any]:
    """One command: its status, how many times the warning was printed, its stderr's tail."""
    # TunableOp writes its results into the working directory: tmp. (A PYTORCH_ variable of the
    # command's own would send it cold: a warm worker's torch has read its environment.)
    full = {**os.environ, **env}
    cmd = [sys.executable, "-c", PROG, *args]
    report = tmp / f"{name}.report.json"
    if under_krex is not None:
        cmd = [*under_krex, "--report", str(report), "--", *cmd]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=full, cwd=tmp, capture_output=True, text=True, timeout=180)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, str(e.stdout or ""), str(e.stderr or "") + "\n(timed out)"
    doc = json.loads(report.read_text()) if report.exists() else {}
    return {
        "case": name,
        "pool": doc.get("pool"),  # warm: it ran in a warm worker; cold: a process of its own
        "pool_reason": doc.get("pool_reason"),
        "env": env,
        "args": args,
        "krex": under_krex is not None,
        "rc": rc,
        "ok": "ok " in out,
        "warnings": err.count(tunableop.WARNING),
        "wall_s": round(time.monotonic() - t0, 2),
        "stderr_tail": err[-600:],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="krex-tunableop-"))
    on = {"PYTORCH_TUNABLEOP_ENABLED": "1"}
    # name, in a warm worker (else --no-pool; None: natively), environment, argv, warnings wanted.
    # A PYTORCH_ variable that the worker's torch did not start with runs the command cold (with
    # the variable as its reason, krex/pool/plan.py): the env cases ask for the pool and get none.
    plan: list[tuple[str, bool | None, dict[str, str], list[str], int]] = [
        ("env-warm", True, on, [], 1),
        ("env-cold", False, on, [], 1),
        ("in-code-cold", False, {}, ["in-code"], 1),
        ("in-code-warm", True, {}, ["in-code"], 1),
        ("tuning-off", False, {**on, "PYTORCH_TUNABLEOP_TUNING": "0"}, [], 0),
        ("off", True, {}, [], 0),
        ("native", None, on, [], 0),
    ]
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    cases = []
    with private_daemon(tmp / "d", sim=False, slots=2, pool=2) as sock:
        run = [*KREX, "run", "--socket", str(sock), "--auto-regions"]
        for name, warm, env, argv, want in plan:
            krex = None if warm is None else [*run, *([] if warm else ["--no-pool"])]
            got = case(name, krex, env, argv, tmp)
            got["warnings_wanted"] = want
            got["pass"] = got["rc"] == 0 and got["ok"] and got["warnings"] == want
            # where it ran: in a worker when asked and the environment allows it, else cold
            want_pool = "warm" if warm and not env else "cold" if warm is not None else None
            got["pool_wanted"] = want_pool
            got["pass"] = got["pass"] and got["pool"] == want_pool
            cases.append(got)
            print(name, json.dumps({k: got[k] for k in ("rc", "warnings", "pass", "wall_s")}))
    log = (tmp / "d" / "daemon.log").read_text(errors="replace").splitlines()
    res["cases"] = cases
    res["pass"] = all(c["pass"] for c in cases)
    res["daemon_log"] = {
        "pool_stopped": [ln for ln in log if "pool worker" in ln and "stopped" in ln],
        "warnings": [ln for ln in log if "WARNING" in ln],
    }
    (args.out / "tunableop_check.json").write_text(json.dumps(res, indent=1))
    print("tunableop check:", "pass" if res["pass"] else "FAIL")
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
