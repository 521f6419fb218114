"""Probes behind docs/pool.md's choice of worker model (issue #17), no krex involved:

1. teardown: a torch.compile command (fresh caches) natively, with time stamps at import, at
   compile, when its work is done, when its first atexit handler runs and when its last one
   has run; the parent notes when the process ended and when the processes it left (its
   session) were gone. The stacks of every thread are dumped every 1.5 s after the last
   handler, so the log says where the teardown spends its time. Twice with Inductor's
   default compile threads, once with TORCHINDUCTOR_COMPILE_THREADS=1.
2. fork: a zygote that imported torch and triton without touching CUDA forks 1, 8 and 16
   children at once; each creates its context and runs a first matmul: the time from fork to
   that result, against 1, 8 and 16 cold `python -c "import torch; ..."` at once, and one
   forked child that compiles with torch.compile (does Inductor work after the fork).

    python3 scripts/bench/pool_probe.py --json OUT.json [--log OUT.log]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

COMPILE_CMD = textwrap.dedent("""
    import atexit, faulthandler, json, sys, time
    T0 = float(sys.argv[1])
    def stamp(ev, **kw):
        print(json.dumps({"ev": ev, "t": round(time.time() - T0, 3), **kw}), flush=True)
    def last():
        stamp("atexit_last")
        faulthandler.dump_traceback_later(1.5, repeat=True, file=sys.stderr)
    atexit.register(last)  # registered first: runs last
    import torch, triton.testing
    stamp("imported")
    def f(x):
        return torch.nn.functional.gelu(x) * 2 + x.sin() - x.cos() * 0.5
    g = torch.compile(f)
    x = torch.randn(1 << 26, device="cuda")
    g(x)
    torch.cuda.synchronize()
    stamp("compiled")
    ms = triton.testing.do_bench(lambda: g(x), return_mode="median")
    import psutil
    kids = psutil.Process().children(recursive=True)
    stamp("work_done", ms=ms, children=len(kids))
    atexit.register(lambda: stamp("atexit_first", handlers=atexit._ncallbacks()))
""")

FIRST_KERNEL = (
    "import time, torch; x = torch.randn(4096, 4096, device='cuda'); (x @ x).sum().item()"
)


def session_left(sid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return out


def teardown(tmp: Path, threads: str | None, tag: str, log: Any) -> dict[str, Any]:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"ind-{tag}")
    env["TRITON_CACHE_DIR"] = str(tmp / f"tri-{tag}")
    if threads:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
    script = tmp / "compile_cmd.py"
    script.write_text(COMPILE_CMD)
    t0 = time.time()
    p = subprocess.Popen(
        [sys.executable, str(script), repr(t0)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = p.communicate(timeout=300)
    ended = time.time() - t0
    left = session_left(p.pid)
    gone = None
    for _ in range(600):
        if not session_left(p.pid):
            gone = time.time() - t0
            break
        time.sleep(0.05)
    events = {}
    for line in out.splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            events[e.pop("ev")] = e
    log.write(f"==== teardown {tag} (compile threads {threads or 'default'})\n{out}\n{err}\n")
    row = {
        "tag": tag,
        "compile_threads": threads or "default",
        "rc": p.returncode,
        "events": events,
        "process_ended_s": round(ended, 3),
        "left_behind": len(left),
        "session_gone_s": None if gone is None else round(gone, 3),
    }
    print(json.dumps(row), flush=True)
    return row


def fork_children(n: int) -> dict[str, Any]:
    import torch

    assert not torch.cuda.is_initialized()
    r, w = os.pipe()
    t0 = time.monotonic()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                x = torch.randn(4096, 4096, device="cuda")
                (x @ x).sum().item()
                os.write(w, f"{time.monotonic() - t0}\n".encode())
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    for pid in pids:
        os.waitpid(pid, 0)
    ts = sorted(float(x) for x in data.split())
    return {"n": n, "ok": len(ts), "median_s": statistics.median(ts), "max_s": max(ts)}


def cold_children(n: int) -> dict[str, Any]:
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_KERNEL]) for _ in range(n)]
    ts = []
    for p in procs:
        p.wait()
        ts.append(time.monotonic() - t0)
    return {"n": n, "ok": sum(p.returncode == 0 for p in procs), "median_s": statistics.median(ts),
            "max_s": max(ts)}  # fmt: skip


def forked_compile(tmp: Path) -> dict[str, Any]:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "ind-fork")
    os.environ["TRITON_CACHE_DIR"] = str(tmp / "tri-fork")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            import torch

            t = time.monotonic()
            g = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + x.sin())
            x = torch.randn(1 << 20, device="cuda")
            ok = torch.allclose(g(x), torch.nn.functional.gelu(x) * 2 + x.sin(), atol=1e-5)
            os.write(w, json.dumps({"ok": bool(ok), "compile_s": time.monotonic() - t}).encode())
        except BaseException as e:
            os.write(w, json.dumps({"ok": False, "error": repr(e)}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--log", type=Path)
    args = ap.parse_args()
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    log = open(args.log or os.devnull, "w")  # noqa: SIM115
    with tempfile.TemporaryDirectory(prefix="krex-poolprobe-") as d:
        tmp = Path(d)
        doc["teardown"] = [
            teardown(tmp, None, "a", log),
            teardown(tmp, None, "b", log),
            teardown(tmp, "1", "c", log),
        ]
        t = time.monotonic()
        import torch  # noqa: F401
        import triton  # noqa: F401

        doc["zygote_import_s"] = time.monotonic() - t
        doc["fork"] = []
        doc["cold"] = []
        for n in (1, 8, 16):
            doc["fork"].append(fork_children(n))
            print(json.dumps({"fork": doc["fork"][-1]}), flush=True)
            doc["cold"].append(cold_children(n))
            print(json.dumps({"cold": doc["cold"][-1]}), flush=True)
        doc["forked_compile"] = forked_compile(tmp)
        print(json.dumps({"forked_compile": doc["forked_compile"]}), flush=True)
    log.close()
    args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
