"""Issue #48, "a warm command is the command": every probe of tests/warm_probes.py run natively
(no krex), cold (`krex run --no-pool`) and warm (`krex run`, forked by a fork server) on the
simulated GPU, with the same caller; what each observed must be the same, except where krex
differs by design (DELIBERATE, below, and docs/pool.md).

One daemon for the module, with two warm workers. It runs with PYTHONDONTWRITEBYTECODE=1 and
PYTHONUNBUFFERED=1 (as the dev machine's shell has them) and the probes without, so that a
worker's start-up state shows through where it leaks. Its teardown bound for what a warm
command leaves running is KREX_PROBE_TEARDOWN_S seconds (default 3; krex's own is 120 s,
krex/daemon/workers.py's TEARDOWN_S, which has no option: the test daemon is started with it set).

On a real GPU: KREX_PROBE_SOCKET=<its daemon's socket> KREX_PROBE_SIM=0 pytest
tests/test_warm_native.py (the torch probes then run where torch is installed), or
`python tests/test_warm_native.py --socket PATH --no-sim` for a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Daemon
from warm_native import (
    MODES,
    Difference,
    HarnessError,
    Krex,
    Outcome,
    Probe,
    compare,
    krex_command,
    prepare,
    run_catalogue,
    run_probe,
    unmet,
    views,
)
from warm_probes import BY_NAME, CATALOGUE

from krex.client.run import ClientError
from krex.client.run import status as daemon_status

# Where krex differs from a native run by design: the probe's comparison ("krex": cold and
# warm must agree, natively it differs; "none": recorded, not compared; "expect": each way
# against the probe's own expectation) and why. One line each in docs/pool.md.
DELIBERATE: dict[str, tuple[str, str]] = {
    "affinity": (
        "krex",
        "krex pins every command to its GPU's shared cores (docs/controller.md); natively it "
        "has the caller's affinity",
    ),
    "torch_threads": (
        "krex",
        "torch's intra-op threads follow the CPU affinity: the GPU's shared cores under krex "
        "(as affinity), cold and warm alike",
    ),
    "cgroup": (
        "krex",
        "every command runs in its tenant's groups (freezer, cpuset), which regions freeze",
    ),
    "kill_parent": (
        "krex",
        "the parent is the caller natively (here a stand-in parent that forwards signals as "
        "krex run does), krex run cold, the fork server warm: a signal to it must do what it "
        "does cold",
    ),
    "rusage": (
        "none",
        "a warm child is a fork of the server: ru_maxrss counts the server's pages (its "
        "preloaded modules) and its CPU time starts at 0 (no start-up to pay); cold counts "
        "the shim's",
    ),
    "modules_count": (
        "none",
        "the preload modules (torch, triton) are imported in a warm command by design; which "
        "of the worker's own imports show is modules_visible's",
    ),
    "proc_cmdline": (
        "none",
        "/proc/self/cmdline (ps, psutil) is the fork server's: the kernel keeps the exec'd "
        "arguments, rewriting them needs CAP_SYS_RESOURCE (docs/pool.md); sys.argv and "
        "sys.orig_argv are compared",
    ),
    "proc_environ": (
        "none",
        "/proc/self/environ is the environment the fork server was exec'd with (the kernel's "
        "copy; replacing it needs CAP_SYS_RESOURCE): it shows the server's variables, "
        "KREX_WORKER_SECRET among them; os.environ and the C library's environ are compared",
    ),
    "stack": (
        "none",
        "a warm command's __main__ runs in a function of the fork server's (krex/pool/worker.py): "
        "a few frames lie below it, which inspect.stack() lists and which take a few levels "
        "of the recursion limit; tracebacks leave them out",
    ),
    "faulthandler_dump": (
        "none",
        "as stack: faulthandler's dump lists the fork server's frames below the command's",
    ),
    "flags": (
        "none",
        "sys.flags is the worker's start-up (read-only): dont_write_bytecode follows the "
        "worker's PYTHONDONTWRITEBYTECODE; the command's is emulated through "
        "sys.dont_write_bytecode, which is compared (other start-up variables and options run "
        "cold)",
    ),
    "modules_visible": (
        "none",
        "the fork server's own imports (krex.pool.worker's: socket, json, runpy, threading, ...) "
        "are in sys.modules; taking them out would split a module with state (logging) between "
        "the preloaded framework and the command",
    ),
    "warnings": (
        "none",
        "a warm command starts with the warning filters its preloaded modules (torch, numpy) "
        "added at their import; natively they appear when it imports them "
        "(warnings_imported compares the filters once it has)",
    ),
    "late_grandchild": (
        "expect",
        "what a warm command leaves running is ended within the pool's teardown bound "
        "(docs/pool.md); natively and cold nobody ends a process that left its session",
    ),
}

# Probes that fail on today's code, for the reason given (strict: a probe that passes while
# listed fails). The 48 found on 2026-12-04 (main 498791a) are fixed or in DELIBERATE.
XFAIL: dict[str, str] = {}
# Where a probe fails only under some conditions (else it is not expected to fail).
XFAIL_IF: dict[str, bool] = {
    "ids": os.geteuid() == 0,  # the caller's groups are set only by root
}

TEARDOWN_VAR = "KREX_PROBE_TEARDOWN_S"
WORKERS = 2
# The daemon, with krex.daemon.workers' TEARDOWN_S set first (it has no option for it).
_BOOT = (
    "import sys, krex.daemon.workers as w; w.TEARDOWN_S = float(sys.argv.pop(1)); "
    "from krex.cli import main; main(prog_name='krex')"
)


def scope(name: str) -> str:
    """How the probe's runs are compared (warm_native.compare)."""
    how = DELIBERATE[name][0] if name in DELIBERATE else "all"
    return "all" if how == "expect" else how


def teardown_bound() -> float | None:
    """The bound a warm command's leftovers are held to here (None: the daemon has none that
    the harness can set)."""
    import krex.daemon.workers

    if not hasattr(krex.daemon.workers, "TEARDOWN_S"):
        return None
    return float(os.environ.get(TEARDOWN_VAR, "3"))


class ProbeDaemon(Daemon):
    """helpers.Daemon, started in / with the given environment and teardown bound."""

    def __init__(self, socket: Path, env: dict[str, str], bound: float | None) -> None:
        super().__init__(socket, "--pool", str(WORKERS))
        self.env, self.bound = env, bound

    def command(self) -> list[str]:
        boot = ["-c", _BOOT, str(self.bound)] if self.bound is not None else ["-m", "krex.cli"]
        return [sys.executable, *boot, "daemon", "--sim", "--socket", str(self.socket),
                *self.extra]  # fmt: skip

    def start(self, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        super().start(env=self.env, cwd="/")


def pool_ready(socket: Path, sim: bool, within_s: float = 60.0) -> list[str]:
    """Until every warm worker of GPU 0 is ready; its preload modules."""
    deadline = time.monotonic() + within_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = daemon_status(sim, str(socket))
            pool = last["gpus"][0]["pool"]
            if pool["target"] and pool["idle"] >= pool["target"]:
                return list(pool.get("preload") or [])
        except (ClientError, OSError, KeyError, IndexError):
            pass
        time.sleep(0.05)
    raise HarnessError(f"the warm workers were not ready within {within_s:g} s: {last}")


def pool_counts(socket: Path, sim: bool) -> tuple[int, int]:
    """GPU 0's counts of warm and cold runs."""
    pool = daemon_status(sim, str(socket))["gpus"][0]["pool"]
    return int(pool["warm_runs"]), int(pool["cold_runs"])


def daemon_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def krex_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Krex, Path]]:
    """krex (its command and daemon) and the probes' root directory: the daemon of
    KREX_PROBE_SOCKET, else one of our own on the simulated GPU."""
    root = tmp_path_factory.mktemp("probes")
    external = os.environ.get("KREX_PROBE_SOCKET")
    if external:
        sim = os.environ.get("KREX_PROBE_SIM", "1") != "0"
        sock = Path(external)
        preload = pool_ready(sock, sim)
        env_bound = os.environ.get(TEARDOWN_VAR)
        bound: float | None = float(env_bound) if env_bound else None
        if bound is None:
            import krex.daemon.workers

            bound = getattr(krex.daemon.workers, "TEARDOWN_S", None)
        yield (
            Krex(
                command=krex_command(),
                counts=lambda: pool_counts(sock, sim),
                socket=sock,
                sim=sim,
                before_warm=lambda: pool_ready(sock, sim),
                preload=tuple(preload),
                teardown_s=bound,
            ),
            root,
        )
        return
    d = ProbeDaemon(tmp_path_factory.mktemp("daemon") / "krex.sock", daemon_env(), teardown_bound())
    d.start()
    try:
        preload = pool_ready(d.socket, True)
        yield (
            Krex(
                command=krex_command(),
                counts=lambda: pool_counts(d.socket, True),
                socket=d.socket,
                sim=True,
                before_warm=lambda: pool_ready(d.socket, True),
                preload=tuple(preload),
                teardown_s=d.bound,
            ),
            root,
        )
    finally:
        d.stop()


def _params() -> list[Any]:
    out = []
    # Against another daemon (a real GPU's) what fails depends on it: not strict there.
    strict = not os.environ.get("KREX_PROBE_SOCKET")
    for p in CATALOGUE:
        marks = []
        if p.name in XFAIL and XFAIL_IF.get(p.name, True):
            reason = f"issue #48: {XFAIL[p.name]}"
            marks.append(pytest.mark.xfail(strict=strict, raises=Difference, reason=reason))
        out.append(pytest.param(p, id=p.name, marks=marks))
    return out


def run_all_ways(probe: Probe, krex: Krex, root: Path) -> dict[str, Outcome]:
    """The probe natively, cold and warm. A warm run that found no worker ready (one a probe
    killed still being replaced) is run again once."""
    d = prepare(probe, root)
    out = {}
    for mode in MODES:
        try:
            out[mode] = run_probe(probe, mode, krex, d)
        except HarnessError as e:
            if mode != "warm" or "warm worker" not in str(e):
                raise
            time.sleep(1.0)
            out[mode] = run_probe(probe, mode, krex, d)
    return out


@pytest.mark.parametrize("probe", _params())
def test_warm_is_native(probe: Probe, krex_env: tuple[Krex, Path]) -> None:
    krex, root = krex_env
    why = unmet(probe, krex)
    if why is not None:
        pytest.skip(why)
    outcomes = run_all_ways(probe, krex, root)
    seen = views(outcomes)
    compare(probe, seen, scope(probe.name))


def test_the_catalogue_and_its_tables() -> None:
    """At least 30 probes; the tables name probes of the catalogue; a probe recorded only is
    not also expected to fail."""
    assert len(CATALOGUE) >= 30
    assert set(DELIBERATE) <= set(BY_NAME), set(DELIBERATE) - set(BY_NAME)
    assert set(XFAIL) <= set(BY_NAME), set(XFAIL) - set(BY_NAME)
    for name, (how, why) in DELIBERATE.items():
        assert how in ("krex", "none", "expect") and why, name
        assert not (how == "none" and name in XFAIL), name
        assert (how == "expect") == (BY_NAME[name].expect is not None), name
    doc = Path(__file__).resolve().parents[1] / "docs" / "pool.md"
    text = doc.read_text()
    missing = [n for n in DELIBERATE if f"`{n}`" not in text]
    assert not missing, f"deliberate differences not in {doc.name}: {missing}"


def main(argv: list[str] | None = None) -> int:
    """The catalogue against a running daemon (a real GPU's): a line per probe, and the
    views as JSON with --json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="the daemon's socket")
    ap.add_argument("--no-sim", action="store_true", help="a real GPU's daemon")
    ap.add_argument("--krex", default=" ".join(krex_command()), help="how to start krex")
    ap.add_argument("--only", default="", help="comma-separated probe names")
    ap.add_argument("--root", default=None, help="where the probes' directories go")
    ap.add_argument("--teardown-s", type=float, default=None)
    ap.add_argument("--json", default=None, help="write every probe's views here")
    args = ap.parse_args(argv)
    import tempfile

    sock, sim = Path(args.socket), not args.no_sim
    preload = pool_ready(sock, sim)
    krex = Krex(
        command=args.krex.split(),
        socket=sock,
        sim=sim,
        before_warm=lambda: pool_ready(sock, sim),
        preload=tuple(preload),
        teardown_s=args.teardown_s,
        counts=lambda: pool_counts(sock, sim),
    )
    probes = [BY_NAME[n] for n in args.only.split(",") if n] or CATALOGUE
    root = Path(args.root or tempfile.mkdtemp(prefix="krex-probes-"))
    results = run_catalogue(probes, krex, root, {n: s for n, (s, _) in DELIBERATE.items()},
                            on_result=lambda r: print(table_line(r), flush=True))  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps([r.__dict__ for r in results], indent=1, default=repr) + "\n"
        )
    return 0


def table_line(r: Any) -> str:
    """One probe's line of main's table (with its difference, indented, below it)."""
    if r.skipped:
        state = f"skipped: {r.skipped}"
    elif r.error:
        state = f"ERROR {r.error}"
    elif r.difference:
        state = "DIFFERS" + (" (expected: issue #48)" if r.probe in XFAIL else "")
    else:
        state = "same" if scope(r.probe) == "all" else f"same ({scope(r.probe)})"
    line = f"{r.probe:28} {r.wall_s:6.1f} s  {state}"
    if r.difference:
        line += "\n    " + r.difference.replace("\n", "\n    ")
    return line


if __name__ == "__main__":
    sys.exit(main())


def test_the_gpu_harness_krex_reaches_its_own_dependencies_whatever_a_probe_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/gpu/warm_native_check.py on the GPU box, where krex and cffi are importable only
    through the harness's PYTHONPATH: a probe that sets its own PYTHONPATH (sys_path,
    sitecustomize) or a minimal environment must not take them from `krex run` itself (on the
    H100, 2026-12-05: "No module named '_cffi_backend'", cold and warm alike)."""
    # An interpreter of this Python's version outside this environment, without click or cffi.
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [p for d in ("/usr/bin", "/usr/local/bin") if Path(p := f"{d}/{name}").exists()]
    bare = next((p for p in found if subprocess.run([p, "-c", "import click"]).returncode), None)
    if bare is None:
        pytest.skip(f"needs a {name} without krex's dependencies")
    from conftest import load_script

    check = load_script("scripts/gpu/warm_native_check.py")
    site = [p for p in sys.path if p.endswith("site-packages")]
    monkeypatch.setattr(sys, "executable", bare)
    monkeypatch.setenv("PYTHONPATH", ":".join(site))
    script = check.as_installed(tmp_path)
    assert script is not None
    for env in ({"PYTHONPATH": str(tmp_path / "site")}, {}):
        run = subprocess.run([script, "run", "--help"], env=env, capture_output=True, text=True)
        assert run.returncode == 0 and "Usage" in run.stdout, run.stderr[-2000:]
