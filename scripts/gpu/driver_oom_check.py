"""The driver's own out-of-memory on a real GPU (issue #47, docs/memory.md): a command whose first
CUDA work (its context, its first kernels' modules) comes while another command holds all but a
sliver of the GPU. Natively that command dies of `CUDA error: out of memory`; under krex the
driver's answer waits, as an allocation's does, and the command succeeds once the holder is gone.

Both modes side by side: `native` (the two commands as they are) and `krex` (both through
`krex run` to a private daemon of 2 slots). The holder takes all but SLIVER_MIB of the free
memory, says so in a file, and holds it HOLD_S seconds; the other waits for the file, then does
its first CUDA work. Prints and writes (--json) each command's status and, under krex, its
report's memory (waits per kind of call).

    python3 scripts/gpu/driver_oom_check.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
import memory_check  # noqa: E402  (its private daemons)

SLIVER_MIB = 128  # left free: less than a context and its first modules take
HOLD_S = 8.0

HOLDER = textwrap.dedent("""
    import sys, time, torch
    flag, sliver, hold = sys.argv[1], int(sys.argv[2]) << 20, float(sys.argv[3])
    free, _ = torch.cuda.mem_get_info()
    keep = torch.empty(free - sliver, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("holding", keep.numel() >> 20, "MiB; free now", torch.cuda.mem_get_info()[0] >> 20,
          "MiB", flush=True)
    open(flag, "w").close()
    time.sleep(hold)
""")

OTHER = textwrap.dedent("""
    import os, sys, time
    flag = sys.argv[1]
    import torch
    while not os.path.exists(flag):
        time.sleep(0.05)
    t0 = time.monotonic()
    a = torch.randn(1 << 20, device="cuda")   # the context, the RNG's and the kernels' modules
    b = (a * 2).sum()
    torch.cuda.synchronize()
    print("first CUDA work done after", round(time.monotonic() - t0, 2), "s", flush=True)
""")


def run_pair(krex_sock: Path | None, tmp: Path, tag: str) -> dict[str, Any]:
    flag = tmp / f"{tag}.held"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.pop("LD_PRELOAD", None)

    def argv(code: str, *args: str, report: str) -> list[str]:
        cmd = [sys.executable, "-c", code, *args]
        if krex_sock is None:
            return cmd
        return [sys.executable, "-m", "krex.cli", "run", "--socket", str(krex_sock),
                "--report", str(tmp / report), "--", *cmd]  # fmt: skip

    holder = subprocess.Popen(
        argv(HOLDER, str(flag), str(SLIVER_MIB), str(HOLD_S), report=f"{tag}-holder.json"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    other = subprocess.Popen(
        argv(OTHER, str(flag), report=f"{tag}-other.json"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    h_out, h_err = holder.communicate(timeout=300)
    o_out, o_err = other.communicate(timeout=300)
    out: dict[str, Any] = {
        "holder": {"rc": holder.returncode, "out": h_out.strip(), "err": h_err[-600:]},
        "other": {"rc": other.returncode, "out": o_out.strip(), "err": o_err[-600:]},
        "other_oom": "out of memory" in o_err,
    }
    for who in ("holder", "other"):
        rep = tmp / f"{tag}-{who}.json"
        if rep.exists():
            doc = json.loads(rep.read_text())
            out[who]["memory"] = doc.get("memory")
            out[who]["attempts"] = len(doc.get("attempts", []))
            out[who]["pool"] = doc.get("pool")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    memory_check.LOGS = args.json.resolve().parent  # the daemon's log
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python3 scripts/gpu/driver_oom_check.py " + " ".join(sys.argv[1:]),
    }
    with tempfile.TemporaryDirectory(prefix="krex-drvoom-") as d:
        tmp = Path(d)
        print("== native", flush=True)
        results["native"] = run_pair(None, tmp, "native")
        with memory_check.daemon(tmp, 2) as sock:
            print("== krex", flush=True)
            results["krex"] = run_pair(sock, tmp, "krex")
    args.json.write_text(json.dumps(results, indent=1))
    for mode in ("native", "krex"):
        r = results[mode]
        mem = r["other"].get("memory") or {}
        print(f"{mode:7} holder rc {r['holder']['rc']}, other rc {r['other']['rc']} "
              f"(out of memory: {r['other_oom']}); other's waits {mem.get('waits_by_kind')} "
              f"{mem.get('wait_s', 0):.1f} s; {r['other']['out']}")  # fmt: skip
    ok = results["krex"]["other"]["rc"] == 0 and results["krex"]["holder"]["rc"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
