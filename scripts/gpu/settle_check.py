"""The settle step's trigger on the real GPU, time-sliced and under MPS (`[mps] enabled`).

`krex run --settle 0.3` idles a region 0.3 s after the freeze where the frozen siblings worked on
the GPU lately: NVML's process samples name them, or the shim counted a driver call of theirs
since the daemon's tick a second or more ago (krex/daemon/machinery.py, `SubmitHistory`). Under MPS
NVML may name the server, not its clients; the shim's counts do not depend on it. For each
sharing mode: the owner (scripts/gpu/owner.py, 2 regions) beside 3 busy siblings, then beside
one that worked once and idles; each region's `settle_s` and clean flag, and which pids NVML's
samples of the busy phase named (the siblings', or others: the MPS server, krex's own).

    python3 scripts/gpu/settle_check.py --out DIR
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
SETTLE_S = "0.3"
IDLE = (
    "import time, torch\n"
    "a = torch.randn(4096, 4096, device='cuda'); a @ a; torch.cuda.synchronize()\n"
    "print('ready', flush=True); time.sleep(600)\n"
)


def _started(cmd: list[str]) -> subprocess.Popen[str]:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise RuntimeError(f"{cmd[-1]} did not start")
    return p


def _owner(run: list[str], report: Path) -> list[dict[str, Any]]:
    """Each region's settle_s, clean flag and problems."""
    argv = [*run, "--settle", SETTLE_S, "--report", str(report), "--"]
    p = subprocess.run([*argv, sys.executable, str(HERE / "owner.py"), "2"], timeout=180)
    if p.returncode != 0:
        raise RuntimeError(f"the owner exited {p.returncode}")
    regions = json.loads(report.read_text())["regions"]
    keep = ("settle_s", "clean", "problems")
    return [{k: r[k] for k in keep if k in r} for r in regions]


def phase(sharing: str, out: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"krex-settle-{sharing}-"))
    cfg = tmp / "config.toml"
    cfg.write_text("[mps]\nenabled = true\n" if sharing == "mps" else "")
    sock = tmp / "krex.sock"
    log = open(out / f"settle_daemon_{sharing}.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen(
        [*KREX, "daemon", "--config", str(cfg), "--socket", str(sock)], stdout=log, stderr=log
    )
    # Own processes (no warm pool): so that the siblings' pids are krex run's descendants.
    run = [*KREX, "run", "--socket", str(sock), "--no-pool"]
    res: dict[str, Any] = {"sharing": sharing}
    sibs: list[subprocess.Popen[str]] = []
    try:
        time.sleep(3)
        sibs = [_started([*run, "--", sys.executable, str(HERE / "sibling.py")]) for _ in range(3)]
        time.sleep(2)
        from krex.core.nvml import Nvml

        nvml = Nvml.open()
        if nvml is not None:
            named = nvml.active(0, time.time() - 1.0)
            nvml.close()
            # krex run's pid is its command's (it execs in the child), so compare with
            # the tenants' process trees: what NVML names that is not a sibling's.
            trees = {int(x) for s in sibs for x in _tree(s.pid)}
            res["nvml_named_siblings"] = sorted(named & trees)
            res["nvml_named_others"] = sorted(named - trees)
        res["busy"] = _owner(run, tmp / "busy.json")
        for s in sibs:
            s.kill()
            s.wait(timeout=60)
        sibs = [_started([*run, "--", sys.executable, "-c", IDLE])]
        time.sleep(3)  # past two of the daemon's ticks
        res["idle"] = _owner(run, tmp / "idle.json")
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        for s in sibs:
            s.kill()
            s.wait(timeout=60)
        daemon.terminate()
        daemon.wait(timeout=60)
    return res


def _tree(pid: int) -> list[str]:
    """pid and its descendants (pgrep -P, recursively)."""
    out = [str(pid)]
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    for k in kids.split():
        out += _tree(int(k))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "settle_s": float(SETTLE_S),
        "phases": [phase(s, args.out) for s in ("timeslice", "mps")],
    }
    ok = all(
        "error" not in p
        and p["busy"]
        and p["idle"]
        and all(r["settle_s"] >= float(SETTLE_S) for r in p["busy"])
        and all(r["settle_s"] == 0.0 for r in p["idle"])
        and all(r["clean"] for r in p["busy"] + p["idle"])
        for p in doc["phases"]
    )
    doc["ok"] = ok
    (args.out / "settle_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
