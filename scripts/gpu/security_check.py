"""Issue #16 on a real GPU: regions beside work krex cannot gate are reported unclean, with the
reason, and a normal 8-slot run raises no false flag.

1. normal: 7 torch siblings under `krex run` (matmuls outside regions) and an owner taking 20
   regions (do_bench of a matmul): every region must be clean.
2. dlmopen: one sibling (scripts/gpu/dlmopen_sibling.c) that loads libcuda.so.1 with
   dlmopen(LM_ID_NEWLM) and launches kernels through that copy only (the shim counts it) beside
   the owner: its regions must be unclean, naming dlmopen. Before the cases, outside krex and
   without the shim, the same program and a Python one (torch imported, then ctypes' dlmopen)
   are started once each, to record whether this driver runs a dlmopen'd copy at all.
   noshim: one sibling whose GPU process runs without the shim (`env -u LD_PRELOAD`, inside
   its tenant): the owner's regions must be unclean, naming the process with no slot.
3. late foreign: an owner region of 3 s; 1 s into it a process outside krex (torch already
   imported) starts matmuls: the region must be unclean, naming the foreign process at the
   region's end.
4. deepbind, deepbind-nested (issue #49): one sibling (scripts/gpu/deepbind_sibling.c) that takes
   its slot the ordinary way, then loads scripts/gpu/deepbind_lib.c with RTLD_DEEPBIND and
   launches through the library's own binding to libcuda.so.1 (nested: through the library's
   own dlopen of the driver and dlsym on it). Its work must be gated (the sibling's report
   counts its launches, and the owner's clean regions time within 10 % of the normal case's)
   or the regions unclean, naming RTLD_DEEPBIND. Outside krex, the sibling is started once to
   record that it runs on this driver at all.

    python3 scripts/gpu/security_check.py --out DIR --dlmopen-bin BIN --ptx PTX \
        [--deepbind-bin BIN --deepbind-lib LIB] [--cases normal,dlmopen,noshim,late,deepbind]
    (writes DIR/security_check.json; BIN, LIB and PTX as scripts/gpu_check.sh builds them)
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

from krex.bench.runner import not_ready

KREX = [sys.executable, "-m", "krex.cli"]

SIBLING = textwrap.dedent("""
    import ctypes, sys, time, torch
    if sys.argv[1] == "dlmopen":
        print("loading libcuda.so.1 with dlmopen(LM_ID_NEWLM)", file=sys.stderr, flush=True)
        libc = ctypes.CDLL(None)
        libc.dlmopen.restype = ctypes.c_void_p
        libc.dlmopen.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
        libc.dlerror.restype = ctypes.c_char_p
        if not libc.dlmopen(-1, b"libcuda.so.1", 2):
            sys.exit(f"dlmopen(LM_ID_NEWLM, libcuda.so.1) failed: {libc.dlerror()}")
    if sys.argv[-1] == "--on-go":  # imported; the GPU only when told (the late foreign case)
        print("imported", flush=True)
        sys.stdin.readline()
    a = torch.randn(4096, 4096, device="cuda")
    print("ready", flush=True)
    while True:
        (a @ a).sum().item()
        time.sleep(0.01)
""")

OWNER = textwrap.dedent("""
    import json, sys, torch, triton.testing, krex
    a = torch.randn(4096, 4096, device="cuda")
    out = []
    for _ in range(int(sys.argv[1])):
        with krex.region():
            ms = triton.testing.do_bench(lambda: a @ a, return_mode="median")
        out.append({"ms": ms, **{k: krex.last_region()[k] for k in ("clean", "problems")}})
    print(json.dumps(out), flush=True)
""")

HOLD = textwrap.dedent("""
    import json, time, torch, krex
    a = torch.randn(4096, 4096, device="cuda")
    with krex.region():
        print("in region", flush=True)
        t = time.monotonic()
        while time.monotonic() - t < 3:
            (a @ a).sum().item()
    print(json.dumps(krex.last_region()), flush=True)
""")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.pop("LD_PRELOAD", None)
    return env


def _sibling(tmp: Path, kind: str, dl: list[str], deep: list[str]) -> list[str]:
    """A sibling's command; "noshim" starts its GPU process without the shim (its tenant's child
    with LD_PRELOAD unset: no slot); "dlmopen" is `dl` (the C program and its PTX); "deepbind"
    and "deepbind-nested" are `deep` (the C program, its library and the PTX)."""
    if kind == "dlmopen":
        return dl
    if kind.startswith("deepbind"):
        return [*deep, *(["nested"] if kind.endswith("nested") else [])]
    argv = [sys.executable, str(tmp / "sibling.py"), "plain" if kind == "noshim" else kind]
    return ["env", "-u", "LD_PRELOAD", *argv] if kind == "noshim" else argv


def _run(sock: Path, *argv: str, report: Path | None = None) -> subprocess.Popen[str]:
    more = ["--report", str(report)] if report is not None else []
    return subprocess.Popen(
        [*KREX, "run", "--socket", str(sock), "--no-pool", *more, "--", *argv],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _native(argv: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """Starts `argv` outside krex and without the shim; its outcome once it printed "ready" (then
    killed), or exited, or after `timeout`."""
    t0 = time.monotonic()
    pipe = subprocess.PIPE
    p = subprocess.Popen(argv, env=_env(), stdout=pipe, stderr=pipe, text=True)
    assert p.stdout is not None
    line = p.stdout.readline().strip()  # "ready", or "" once it exited
    ready = line == "ready"
    if ready:
        p.kill()
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    return {"ready": ready, "rc": p.returncode, "s": round(time.monotonic() - t0, 2),
            "stderr": err[-800:]}  # fmt: skip


def _finish(doc: dict[str, Any], out: Path, wanted: list[str]) -> int:
    """The verdict of the cases that ran, written with the rest to out/security_check.json."""
    normal = doc.get("normal", {}).get("regions", [])
    dl = doc.get("dlmopen", {}).get("regions", [])
    bare = doc.get("noshim", {}).get("regions", [])
    late = doc.get("late_foreign", {}).get("region", {})
    verdict = {  # case: (name, verdict)
        "normal": ("normal_all_clean", bool(normal) and all(r["clean"] for r in normal)),
        "dlmopen": (
            "dlmopen_all_unclean",
            bool(dl)
            and all(not r["clean"] and any("dlmopen" in p for p in r["problems"]) for r in dl),
        ),
        "noshim": (
            "noshim_all_unclean",
            bool(bare)
            and all(
                not r["clean"] and any("without the krex shim" in p for p in r["problems"])
                for r in bare
            ),
        ),
        "late": (
            "late_foreign_unclean",
            late.get("clean") is False and any("foreign" in p for p in late.get("problems", [])),
        ),
    }
    # A deep-bound library's work is gated (the sibling's launches counted by the shim, and the
    # owner's clean regions time what the normal case's do) or its regions say RTLD_DEEPBIND.
    base = _median([r["ms"] for r in normal if r["clean"]])
    for case in ("deepbind", "deepbind-nested"):
        got = doc.get(case, {})
        regions = got.get("regions", [])
        got["ms_median"] = _median([r["ms"] for r in regions])
        verdict[case] = (
            case.replace("-", "_") + "_gated_or_unclean",
            bool(regions)
            and all(
                (not r["clean"] and any("RTLD_DEEPBIND" in p for p in r["problems"]))
                or (
                    r["clean"]
                    and got.get("sibling_intercepted", 0) > 0
                    and base is not None
                    and r["ms"] <= 1.10 * base
                )
                for r in regions
            ),
        )
    doc["verdict"] = dict(v for case, v in verdict.items() if case in wanted)
    (out / "security_check.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["verdict"]))
    return 0 if all(doc["verdict"].values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dlmopen-bin", required=True)
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--deepbind-bin", help="scripts/gpu/deepbind_sibling.c, built")
    ap.add_argument("--deepbind-lib", help="scripts/gpu/deepbind_lib.c, built")
    ap.add_argument("--cases", default="normal,dlmopen,noshim,late", help="which, in this order")
    args = ap.parse_args()
    wanted = args.cases.split(",")
    dl = [str(Path(args.dlmopen_bin).resolve()), str(Path(args.ptx).resolve())]
    deep = [str(Path(a).resolve()) for a in (args.deepbind_bin or "", args.deepbind_lib or "")]
    deep.append(dl[1])
    if any(c.startswith("deepbind") for c in wanted) and not (
        args.deepbind_bin and args.deepbind_lib
    ):
        ap.error("the deepbind cases need --deepbind-bin and --deepbind-lib")
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="krex-sec-") as d:
        tmp = Path(d)
        (tmp / "sibling.py").write_text(SIBLING)
        (tmp / "owner.py").write_text(OWNER)
        (tmp / "hold.py").write_text(HOLD)
        # Does this driver run through a dlmopen'd copy at all, with no krex and no shim?
        doc["dlmopen_native"] = {
            "c": _native(dl),
            "python_after_torch": _native([sys.executable, str(tmp / "sibling.py"), "dlmopen"]),
        }
        if "deepbind" in wanted:  # and does the deep-bound sibling run at all, outside krex?
            doc["deepbind_native"] = _native(deep)
        print("dlmopen outside krex:", json.dumps(doc["dlmopen_native"]), flush=True)
        sock = tmp / "krex.sock"
        log = open(args.out / "daemon.log", "wb")  # noqa: SIM115
        daemon = subprocess.Popen(
            [*KREX, "daemon", "--socket", str(sock), "--slots", "8", "--pool", "0"],
            stdout=log,
            stderr=log,
        )
        try:
            for _ in range(200):
                if subprocess.run([*KREX, "status", "--socket", str(sock)],
                                  capture_output=True).returncode == 0:  # fmt: skip
                    break
                time.sleep(0.1)
            cases = (
                ("normal", ["plain"] * 7), ("dlmopen", ["dlmopen"]), ("noshim", ["noshim"]),
                ("deepbind", ["deepbind"]), ("deepbind-nested", ["deepbind-nested"]),
            )  # fmt: skip
            for case, kinds in [c for c in cases if c[0] in wanted]:
                deep_case = case.startswith("deepbind")
                rep = args.out / f"{case}-sibling.json"
                sibs = [
                    _run(sock, *_sibling(tmp, k, dl, deep), report=rep if deep_case else None)
                    for k in kinds
                ]
                failed = not_ready(sibs)
                if failed:  # a sibling that cannot start (e.g. this driver refuses dlmopen)
                    for s in sibs:
                        s.kill()
                    err = failed[0].communicate(timeout=60)[1][-1500:]
                    doc[case] = {"sibling_failed": err, "rc": failed[0].returncode}
                    print(f"{case}: a sibling did not start: {doc[case]['sibling_failed']}")
                    continue
                owner = _run(sock, sys.executable, str(tmp / "owner.py"), "20")
                out, err = owner.communicate(timeout=300)
                for s in sibs:
                    if deep_case:  # krex run forwards it and writes the sibling's report
                        s.terminate()
                        s.wait(timeout=60)
                    s.kill()
                    s.wait()
                regions = json.loads(out.strip().splitlines()[-1]) if owner.returncode == 0 else []
                doc[case] = {"rc": owner.returncode, "regions": regions, "stderr": err[-1500:]}
                if deep_case and rep.exists():
                    sib_rep = json.loads(rep.read_text())
                    doc[case]["sibling_intercepted"] = sib_rep.get("intercepted") or 0
                unclean = sum(not r["clean"] for r in regions)
                print(f"{case}: {len(regions)} regions, {unclean} unclean", flush=True)
            if "late" not in wanted:
                return _finish(doc, args.out, wanted)
            # Outside krex, torch imported before the region, GPU work 1 s into it.
            foreign = subprocess.Popen(
                [sys.executable, str(tmp / "sibling.py"), "plain", "--on-go"], env=_env(),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert foreign.stdout is not None and foreign.stdout.readline().strip() == "imported"
            holder = _run(sock, sys.executable, str(tmp / "hold.py"))
            assert holder.stdout is not None and holder.stdout.readline().strip() == "in region"
            time.sleep(1.0)
            assert foreign.stdin is not None and foreign.stdout is not None
            foreign.stdin.write("go\n")
            foreign.stdin.flush()
            doc["late_foreign_ready"] = foreign.stdout.readline().strip()
            out, err = holder.communicate(timeout=120)
            foreign.kill()
            foreign.wait()
            rec = json.loads(out.strip().splitlines()[-1]) if holder.returncode == 0 else {}
            doc["late_foreign"] = {"rc": holder.returncode, "region": rec, "stderr": err[-1500:]}
            print(f"late foreign: clean={rec.get('clean')} problems={rec.get('problems')}")
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
            log.close()
    return _finish(doc, args.out, wanted)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


if __name__ == "__main__":
    sys.exit(main())
