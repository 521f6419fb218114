"""Issue #48 on a real GPU: the warm-vs-native probe catalogue (tests/warm_probes.py, the torch
probes among them) against a daemon of this GPU with two warm workers, each probe natively,
cold and warm (tests/test_warm_native.py's table). The daemon is started as the CI test starts
its own (teardown bound KREX_PROBE_TEARDOWN_S, default 3 s, instead of krex's 120 s, so that the
late-grandchild probe does not wait two minutes).

    python3 scripts/gpu/warm_native_check.py --out DIR

Writes DIR/warm_native.json (every probe's views), DIR/warm_native.txt (the table, a line per
probe as it ends, the torch probes first) and
DIR/warm_native.daemon.log; exits 1 when a probe differs that is not a documented difference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_warm_native as twn  # noqa: E402
from warm_probes import CATALOGUE  # noqa: E402

from krex.client.run import ClientError, status  # noqa: E402


class Tee(io.TextIOBase):
    """stdout, and a file, line by line as the table is printed (a run cut short keeps it)."""

    def __init__(self, f: TextIO) -> None:
        self.f = f
        self.out = sys.stdout

    def write(self, text: str) -> int:
        self.out.write(text)
        self.f.write(text)
        self.f.flush()
        return len(text)


def as_installed(tmp: Path) -> str | None:
    """Where krex is not installed beside this interpreter (the GPU box: PYTHONPATH only), a
    `krex` console script of our own, as pip would write one: the probes that set their own
    PYTHONPATH or a minimal environment then still reach krex, and `python -m krex.cli` does
    not put a probe's cwd (its json.py) first on krex run's own path. None where it is."""
    if (Path(sys.executable).parent / "krex").exists():
        return None
    # krex's own dependencies too (cffi and posix_ipc are carried to the GPU box on this
    # harness's PYTHONPATH): a probe that sets its own PYTHONPATH must not take them from krex.
    own = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(":") if p)]
    script = tmp / "krex"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path[1:1] = {list(dict.fromkeys(own))!r}\n"
        "from krex.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return str(script)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma-separated probe names")
    ap.add_argument("--sim", action="store_true", help="the simulated GPU (a check of this script)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # The locale of the CI machine, where the catalogue is checked: the warm workers and the
    # probes' caller must share one (a locale is read at an interpreter's start, so a command
    # of another runs cold, by design), and the probes that set their own expect this one.
    for name in [k for k in os.environ if k.startswith("LC_")]:
        del os.environ[name]
    os.environ["LANG"] = "C.UTF-8"
    bound = float(os.environ.get(twn.TEARDOWN_VAR, "3"))
    bin_dir = Path(tempfile.mkdtemp(prefix="krex-bin-"))
    sock = Path(f"/tmp/krex-probes-{os.getpid()}.sock")
    log = args.out / "warm_native.daemon.log"
    cmd = [sys.executable, "-c", twn._BOOT, str(bound), "daemon", "--socket", str(sock),
           "--pool", str(twn.WORKERS), *(["--sim"] if args.sim else [])]  # fmt: skip
    with open(log, "wb") as f:
        daemon = subprocess.Popen(
            cmd, env=twn.daemon_env(), cwd="/", stdout=f, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(ClientError, OSError):
                status(args.sim, str(sock))
                break
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(log.read_text()[-3000:])
                return 2
            time.sleep(0.2)
        twn.pool_ready(sock, args.sim, within_s=180)
        argv = ["--socket", str(sock), "--teardown-s", str(bound),
                "--json", str(args.out / "warm_native.json")]  # fmt: skip
        argv += [] if args.sim else ["--no-sim"]
        script = as_installed(bin_dir)
        argv += ["--krex", script] if script else []
        # The torch probes first: what only a GPU shows, before a time limit can cut the run.
        names = args.only.split(",") if args.only else [p.name for p in CATALOGUE]
        names.sort(key=lambda n: not n.startswith("torch"))
        argv += ["--only", ",".join(names)]
        txt = args.out / "warm_native.txt"
        with open(txt, "w") as table, contextlib.redirect_stdout(Tee(table)):
            rc = twn.main(argv)
        rows = [ln for ln in txt.read_text().splitlines() if ln and not ln.startswith(" ")]
        bad = [ln for ln in rows if "ERROR" in ln or ("DIFFERS" in ln and "expected" not in ln)]
        same = sum(" same" in ln for ln in rows)
        skipped = sum("skipped" in ln for ln in rows)
        print(f"{len(rows)} probes: {same} the same, {skipped} skipped, {len(bad)} differ/error")
        return 1 if bad or rc else 0
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()


if __name__ == "__main__":
    sys.exit(main())
