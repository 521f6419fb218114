"""The `krex` command line. Thin: each command hands over to the module that does the work."""

from __future__ import annotations

import math
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click

from krex.bench import SETTLE_S as BENCH_SETTLE_S
from krex.core import paths
from krex.core.build import build_id
from krex.core.config import MAX_SECONDS, MAX_SETTLE_S
from krex.core.version import __version__


class Seconds(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on
    """A duration in seconds: a finite number above 0 (and at least `least`), at most
    MAX_SECONDS. nan, inf and 1e300 pass click's FloatRange and crash later."""

    name = "seconds"

    def __init__(self, least: float = 0.0, most: float = MAX_SECONDS, zero: bool = False) -> None:
        self.least, self.most, self.zero = least, most, zero

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if self.zero and seconds == 0:
            return 0.0
        if not (math.isfinite(seconds) and seconds > 0 and self.least <= seconds <= self.most):
            if self.zero and not self.least:  # 0 itself is allowed: a plain range reads right
                rule = f"from 0 to {self.most:g}"
            else:
                low = f"at least {self.least:g}" if self.least else "more than 0"
                rule = f"{'0 or ' if self.zero else ''}{low} and at most {self.most:g}"
            self.fail(f"{value!r}: seconds must be {rule}", param, ctx)
        return seconds


# A region's settle (--settle, --capped-settle, krex bench's --settle): 0 (off) to 5 s.
SETTLE_SECONDS = Seconds(most=MAX_SETTLE_S, zero=True)


@click.group(name="krex", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="krex")
def main() -> None:
    """KREX: many GPU benchmarking commands share a GPU; each timing-critical region runs alone."""


@main.group()
def bench() -> None:
    """Benchmark a workload suite side by side: exclusive, shared, krex."""


@bench.command(name="run")
@click.option(
    "--modes",
    default="exclusive,shared,krex",
    show_default=True,
    help="Comma-separated: exclusive (also gives native_repeat), shared, krex, krex-cold (krex "
    "with no warm workers), krex-settle (krex with --settle), krex-mps (krex with its MPS daemon: "
    "`krex daemon --mps`), krex-serial (one at a time through krex).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Commands at once in the shared and krex modes.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for results.json, report.md and the plots.",
)
@click.option(
    "--profile",
    type=click.Choice(["tiny", "quick", "full"]),
    default="tiny",
    show_default=True,
    help="tiny: the simulated suite; quick/full: real GPUs.",
)
@click.option(
    "--tasks",
    metavar="NAMES",
    help="Comma-separated tasks of the profile to run (default: all of them).",
)
@click.option(
    "--pool",
    type=click.IntRange(0, 256),
    help="Warm workers per GPU in the krex mode (default: the daemon's: 2 on a real GPU, "
    "none on the simulated one). krex-cold never has any.",
)
@click.option(
    "--settle",
    "settle_s",
    type=SETTLE_SECONDS,
    default=BENCH_SETTLE_S,
    show_default=True,
    help="The krex-settle mode's `krex run --settle S --capped-settle S`: seconds each region "
    "idles after the freeze where the other commands worked on the GPU lately (0: never, "
    "krex without the power-capped rule's settle).",
)
def bench_run(
    modes: str,
    concurrency: int,
    out_dir: Path,
    profile: str,
    tasks: str | None,
    pool: int | None,
    settle_s: float,
) -> None:
    """Run the suite in each mode and report throughput and fidelity side by side."""
    from krex.bench import runner
    from krex.bench.suite import SuiteError

    command = "krex " + " ".join(sys.argv[1:]) if len(sys.argv) > 1 else "krex bench run"
    try:
        chosen = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
        results = runner.run(
            runner.parse_modes(modes),
            concurrency,
            out_dir,
            profile,
            command,
            chosen,
            pool,
            settle_s=settle_s,
        )
    except (runner.BenchError, SuiteError) as e:
        click.echo(f"krex bench: {e}", err=True)
        sys.exit(2)
    ratio = results["throughput_ratio_vs_exclusive"]
    shown = [f"{m} {'n/a' if r is None else f'{r:.2f}x'}" for m, r in ratio.items()]
    click.echo(f"results in {out_dir}: " + ", ".join(shown))


@bench.command(name="report")
@click.argument("out_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def bench_report(out_dir: Path) -> None:
    """Re-render report.md and the plots of a finished run from its results.json."""
    import json

    from krex.bench import runner

    try:
        results = json.loads((out_dir / "results.json").read_text())
    except (OSError, ValueError) as e:
        click.echo(f"krex bench report: cannot read {out_dir / 'results.json'}: {e}", err=True)
        sys.exit(2)
    for path in runner.render_report(results, out_dir):
        click.echo(path)


# Options end at `--` or at the command's first word: what follows is the command's own, and an
# unknown option before it is a usage error (not a command named after the typo).
def _names(value: str) -> bool:
    """Whether an --auto-regions value is names to wrap (dotted paths), not a program."""
    from krex.tenant.autoregions import parse

    try:
        parse(value)
    except ValueError:
        return False
    return True


@main.command(context_settings={"allow_interspersed_args": False})
@click.option(
    "--gpu",
    "gpu_text",
    metavar="I[,J...]",
    help="Run on this GPU, or these (default: the least loaded).",
)
@click.option(
    "--gpus",
    type=click.IntRange(1, 16),
    help="Run on this many GPUs (the least loaded); regions hold all of them.",
)
@click.option(
    "--report",
    type=click.Path(path_type=Path),  # checked by krex run itself: exit 125, as other failures
    help="Write a JSON report (exit code, GPU, wall time, counts, regions) here.",
)
@click.option(
    "--auto-regions",
    "auto_regions",
    is_flag=False,
    flag_value="default",
    default=None,
    metavar="[NAMES]",
    help="Wrap these callables in regions in every child Python process (default: "
    "triton.testing.do_bench and friends).",
)
@click.option(
    "--region-timeout",
    type=Seconds(),
    metavar="S",
    help="Revoke any region of this command that lasts longer than S seconds.",
)
@click.option(
    "--settle",
    type=SETTLE_SECONDS,
    metavar="S",
    help="In each region, when other commands worked on the GPU in the last second or two, idle S "
    "seconds after freezing them, before the grant, so that a power-limited kernel starts as "
    "it would alone (0..5; default: the daemon's regions.settle_s).",
)
@click.option(
    "--capped-settle",
    type=SETTLE_SECONDS,
    metavar="S",
    help="The same idle, only once one of CMD's regions ran into the GPU's power or thermal "
    "limit (its power-limited kernels read the others' heat; 0..5, 0: off; default: the "
    "daemon's regions.capped_settle_s, 2 s).",
)
@click.option(
    "--mem",
    "mem_text",
    metavar="SIZE",
    help="Device memory CMD needs at most (e.g. 24G): admitted only where it fits beside the "
    "others (docs/memory.md).",
)
@click.option(
    "--no-memory-retry",
    is_flag=True,
    help="Do not run CMD again when sharing the GPU's memory ended or bent it (preempted, an "
    "error only sharing caused, a region revoked while it waited for memory; such a region "
    "then leaves CMD running, its record unclean).",
)
@click.option(
    "--no-pool", is_flag=True, help="Never run in a warm pool worker: start CMD as its own process."
)
@click.option("--sim", is_flag=True, help="Run on the simulated GPU (a daemon of its own).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
@click.option(
    "--queue-timeout",
    type=Seconds(),
    default=3600.0,
    show_default=True,
    metavar="S",
    help="Give up waiting for a slot after S seconds.",
)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="[--] CMD...")
def run(
    argv: tuple[str, ...],
    gpu_text: str | None,
    gpus: int | None,
    report: Path | None,
    auto_regions: str | None,
    region_timeout: float | None,
    settle: float | None,
    capped_settle: float | None,
    mem_text: str | None,
    no_memory_retry: bool,
    no_pool: bool,
    sim: bool,
    socket_path: str | None,
    queue_timeout: float,
) -> None:
    """Run CMD in a GPU slot with libkrex.so preloaded: krex run [OPTIONS] -- CMD...

    \b
    Exit status: CMD's own (128+N when a signal N killed it), or
      125  krex could not do its part (daemon unreachable, no slot in time, a bad
           configuration, a refused request, a report that cannot be written)
      127  CMD could not start
    """
    from krex.client import run as client

    argv, auto_regions = _auto_regions(argv, auto_regions)
    gpu = _gpu_choice(gpu_text, gpus)
    mem = 0 if mem_text is None else _mem_bytes(mem_text)
    sys.exit(
        client.run(
            client.RunOptions(
                argv=list(argv),
                gpu=gpu,
                gpus=gpus,
                report=report,
                auto_regions=auto_regions,
                region_timeout_s=region_timeout,
                settle_s=settle,
                capped_settle_s=capped_settle,
                mem_bytes=mem,
                no_memory_retry=no_memory_retry,
                sim=sim,
                socket=socket_path,
                queue_timeout_s=queue_timeout,
                no_pool=no_pool,
            )
        )
    )


def _auto_regions(argv: tuple[str, ...], names: str | None) -> tuple[tuple[str, ...], str | None]:
    """krex run's command and --auto-regions' names (the default's spelled out), checked before
    any daemon sees them: a bad name is one line and exit 125, nothing admitted."""
    from krex.tenant.autoregions import DEFAULT_AUTO_REGIONS, parse

    if names not in (None, "default") and not _names(names) and shutil.which(names):
        # `--auto-regions python bench.py`: the option's value is optional, so click took the
        # command's first word for it; a name to wrap is a dotted path, a program is not.
        argv, names = (names, *argv), "default"
    if names == "default":
        names = ",".join(DEFAULT_AUTO_REGIONS)
    if names is not None:
        try:
            parse(names)
        except ValueError as e:
            click.echo(f"krex run: --auto-regions: {e}", err=True)
            sys.exit(125)
    return argv, names


def _gpu_choice(gpu_text: str | None, gpus: int | None) -> int | list[int] | None:
    """--gpu's index or indices (None: the daemon chooses), agreeing with --gpus."""
    if gpu_text is None:
        return None
    try:
        ids = [int(x) for x in gpu_text.split(",")]
    except ValueError:
        ids = []
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise click.BadParameter(
            f"{gpu_text!r}: GPU indices (0, 1, ...) separated by commas, each once",
            param_hint="'--gpu'",
        )
    if gpus is not None and gpus != len(ids):
        raise click.BadParameter(
            f"--gpus {gpus} but --gpu names {len(ids)} GPU(s)", param_hint="'--gpus'"
        )
    return ids[0] if len(ids) == 1 else ids


def _mem_bytes(mem_text: str) -> int:
    """--mem in bytes, more than 0 and at most 1 PiB."""
    from krex.core.config import MAX_BYTES, parse_size

    try:
        mem = parse_size(mem_text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--mem'") from None
    if not 0 < mem <= MAX_BYTES:
        raise click.BadParameter(
            f"{mem_text!r}: must be more than 0 and at most 1024T (1 PiB)", param_hint="'--mem'"
        )
    return mem


@main.group(invoke_without_command=True)
@click.pass_context
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML configuration (default: $KREX_CONFIG, then /etc/krex/config.toml).",
)
@click.option("--sim", is_flag=True, help="Serve simulated GPUs.")
@click.option("--socket", "socket_path", metavar="PATH", help="Listen here.")
@click.option("--gpus", type=click.IntRange(1, 16), help="Number of GPUs (simulated or real).")
@click.option(
    "--vendor",
    type=click.Choice(["auto", "nvidia", "amd"]),
    help="GPU vendor (default: gpus.vendor, auto). amd: HIP through LD_AUDIT (docs/hip.md).",
)
@click.option("--slots", type=click.IntRange(1, 256), help="Commands admitted per GPU at once.")
@click.option(
    "--pool",
    type=click.IntRange(0, 256),
    help="Warm workers per GPU (default: pool.workers, else 2 on real GPUs, 0 on simulated ones).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on this port (default: metrics.port; 0: off).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Human log lines, or one JSON object per line (default: daemon.log_format).",
)
@click.option(
    "--mps/--no-mps",
    default=None,
    help="Start krex's own MPS control daemon for the commands' work outside regions (default: "
    "mps.enabled; ignored on simulated GPUs).",
)
def daemon(
    ctx: click.Context,
    config_path: Path | None,
    sim: bool,
    socket_path: str | None,
    gpus: int | None,
    vendor: str | None,
    slots: int | None,
    pool: int | None,
    metrics_port: int | None,
    log_format: str | None,
    mps: bool | None,
) -> None:
    """Run the KREX controller in the foreground (for systemd or a terminal).

    `krex daemon stop` stops a running one.
    """
    if ctx.invoked_subcommand is not None:
        return
    import dataclasses

    from krex.core import config as kconfig
    from krex.daemon import daemon as kdaemon

    try:
        cfg = kconfig.load(config_path)
    except kconfig.ConfigError as e:
        click.echo(f"krex daemon: {e}", err=True)
        sys.exit(2)
    changes: dict[str, object] = {}
    if sim:
        changes["sim"] = True
    if socket_path:
        changes["socket"] = Path(socket_path)
    if gpus:
        changes["gpu_count"] = gpus
    if vendor:
        changes["vendor"] = vendor
    if slots:
        changes["slots"] = slots
    if pool is not None:
        changes["pool_workers"] = pool
    if metrics_port is not None:
        changes["metrics_port"] = metrics_port
    if log_format is not None:
        changes["log_format"] = log_format
    if mps is not None:
        changes["mps"] = mps
    cfg = dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]
    try:
        kconfig.validate(cfg)  # the flags' values too (a --socket path too long to bind)
    except kconfig.ConfigError as e:
        click.echo(f"krex daemon: {e}", err=True)
        sys.exit(2)
    sys.exit(kdaemon.run(cfg))


@daemon.command(name="stop")
@click.option("--sim", is_flag=True, help="Stop the simulated-GPU daemon.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
@click.option(
    "--timeout",
    "timeout_s",
    type=Seconds(),
    default=60.0,
    show_default=True,
    metavar="S",
    help="Give up waiting for it to stop after S seconds (exit 1).",
)
def daemon_stop(sim: bool, socket_path: str | None, timeout_s: float) -> None:
    """Stop the daemon on the socket (as `krex status` finds it): SIGTERM to the pid its lock
    file names, then wait until it has ended its regions and released the lock. Exits 0 also
    when no daemon runs there."""
    import os

    from krex.client import run as client
    from krex.core.config import ConfigError

    try:
        sock = client.socket_for(sim, socket_path)
    except ConfigError as e:
        click.echo(f"krex daemon stop: {e}", err=True)
        sys.exit(2)
    fd = _open_pid_file(sock)
    if fd is None:
        return
    try:
        if not _lock_held(fd):
            click.echo(f"krex daemon stop: no krex daemon runs on {sock}", err=True)
            return
        text = os.read(fd, 64).decode(errors="replace").strip()
        if not text.isdigit():
            click.echo(f"krex daemon stop: {sock}.pid names no process ({text!r})", err=True)
            sys.exit(1)
        what = client.daemon_identity(sock)
        _terminate(text, fd, timeout_s)
        click.echo(f"krex daemon stop: stopped {what} on {sock} (pid {text})", err=True)
    finally:
        os.close(fd)


def _open_pid_file(sock: Path) -> int | None:
    """The daemon's lock file beside `sock`, open for reading (None, said: there is none)."""
    import os

    from krex.core.trust import TrustError, open_beside, trusted_uids

    try:
        # The pid it signals: from a file of ours or root's, never through a planted link.
        return open_beside(f"{sock}.pid", os.O_RDONLY, owners=trusted_uids())
    except FileNotFoundError:
        click.echo(f"krex daemon stop: no krex daemon runs on {sock}", err=True)
        return None
    except TrustError as e:
        click.echo(f"krex daemon stop: {e}", err=True)
        sys.exit(2)


def _lock_held(fd: int) -> bool:
    """Whether a daemon holds the lock of its lock file `fd` (it does for as long as it runs)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _terminate(pid: str, fd: int, timeout_s: float) -> None:
    """SIGTERM to the daemon `pid` (as its lock file spells it), then wait until it has released
    the lock of `fd` (exit 1 when it cannot be signalled or has not stopped within `timeout_s`)."""
    import os
    import signal
    import time

    try:
        os.kill(int(pid), signal.SIGTERM)
    except OSError as e:
        click.echo(f"krex daemon stop: cannot signal process {pid}: {e.strerror}", err=True)
        sys.exit(1)
    deadline = time.monotonic() + timeout_s
    while _lock_held(fd):
        if time.monotonic() > deadline:
            click.echo(
                f"krex daemon stop: the daemon (pid {pid}) has not stopped within {timeout_s:g} s",
                err=True,
            )
            sys.exit(1)
        time.sleep(0.05)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON.")
@click.option("--sim", is_flag=True, help="Ask the simulated-GPU daemon.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def status(as_json: bool, sim: bool, socket_path: str | None) -> None:
    """Show the daemon's GPUs, slots, queues, regions, tenants and freezer."""
    import json

    from krex.client import run as client
    from krex.core.config import ConfigError

    try:
        st = client.status(sim, socket_path)
    except ConfigError as e:
        click.echo(f"krex status: {e}", err=True)
        sys.exit(2)
    except (client.ClientError, OSError) as e:
        click.echo(f"krex status: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    from rich.console import Console

    from krex.daemon.views import status_tables

    Console(width=200).print(status_tables(st))


@main.command()
@click.option("--sim", is_flag=True, help="Watch the simulated-GPU daemon.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
@click.option(
    "--interval",
    type=Seconds(least=0.1),
    default=1.0,
    show_default=True,
    metavar="S",
    help="Seconds between frames (at least 0.1).",
)
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts).")
def top(sim: bool, socket_path: str | None, interval: float, once: bool) -> None:
    """Live view: per GPU the slots, queues, active region and its age, regions per minute,
    wait and drain times (the last minute), pool and tenants. Ctrl-C ends it."""
    import time

    from rich.console import Console
    from rich.live import Live

    from krex.client import run as client
    from krex.core.config import ConfigError
    from krex.core.errors import KrexError
    from krex.daemon.views import status_tables

    try:
        client.socket_for(sim, socket_path)  # a bad configuration: one line, not a live error
    except ConfigError as e:
        click.echo(f"krex top: {e}", err=True)
        sys.exit(2)

    def frame() -> object:
        try:
            return status_tables(client.status(sim, socket_path))
        except (KrexError, OSError) as e:  # the configuration may be edited while watching
            return f"krex top: {e}"

    if once or not sys.stdout.isatty():
        # Not to a terminal (a pipe, a log): one frame, as --once, whose status says whether a
        # daemon answered (a live view there would write nothing, and retry forever).
        shown = frame()
        Console(width=200).print(shown)
        sys.exit(1 if isinstance(shown, str) else 0)
    try:
        with Live(frame(), refresh_per_second=4) as live:  # type: ignore[arg-type]
            while True:
                time.sleep(interval)
                live.update(frame())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        pass


@main.group()
def config() -> None:
    """The daemon's configuration."""


@config.command(name="show")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML configuration (default: $KREX_CONFIG, then /etc/krex/config.toml).",
)
@click.option("--sim", is_flag=True, help="As `krex daemon --sim` would run.")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def config_show(config_path: Path | None, sim: bool, as_json: bool) -> None:
    """Print the effective configuration, derived defaults included (GPUs, core slices from the
    topology, slots, pool, freezer, MPS)."""
    import dataclasses
    import json

    from krex.core import config as kconfig
    from krex.daemon.views import config_toml, effective_config

    try:
        cfg = kconfig.load(config_path)
        if sim:
            cfg = dataclasses.replace(cfg, sim=True)
        doc = effective_config(cfg)
    except kconfig.ConfigError as e:
        click.echo(f"krex config show: {e}", err=True)
        sys.exit(2)
    click.echo(json.dumps(doc, indent=2) if as_json else config_toml(doc), nl=as_json)


@main.command(context_settings={"allow_interspersed_args": False})
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
def region(argv: tuple[str, ...]) -> None:
    """Run a command as one exclusive region: krex region -- CMD...

    For shell and C++ benchmarks. Exits with the command's status (127: it cannot start; 125:
    the region cannot begin). Outside krex it just runs the command.
    """
    from krex.tenant.markers import run_in_region

    sys.exit(run_in_region(argv))


def _layout_version() -> tuple[str, bool]:
    try:
        from krex._native import lib
    except ImportError as exc:
        return f"unavailable: krex._native does not import ({exc})", False
    return f"{lib.KREX_LAYOUT_MAJOR}.{lib.KREX_LAYOUT_MINOR}", True


def _library(locate: Callable[[], Path]) -> tuple[str, bool]:
    try:
        return str(locate()), True
    except FileNotFoundError as exc:
        return f"missing: {exc}", False


def _gpu() -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unknown: nvidia-smi -L failed ({exc})"
        gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
        if listed.returncode == 0 and gpus:
            return f"yes, {len(gpus)}: {gpus[0]}" + (" ..." if len(gpus) > 1 else "")
    if Path("/dev/nvidia0").exists():
        return "yes (/dev/nvidia0)"
    return "no (the demo uses the simulated GPU)"


@main.command()
def info() -> None:
    """Show versions, native library paths and whether a GPU is visible.

    Exits 1 when a native part (krex._native, libkrex.so, the simulated driver) is missing.
    """
    layout, layout_ok = _layout_version()
    shim, shim_ok = _library(paths.shim_library)
    sim, sim_ok = _library(paths.sim_library_dir)
    rows = [
        ("krex", __version__),
        ("build", f"{build_id()} ({paths.package_dir()})"),
        ("layout", layout),
        ("libkrex.so", shim),
        ("sim libcuda.so.1 dir", sim),
        ("gpu", _gpu()),
        ("python", f"{platform.python_version()} ({sys.executable})"),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
    if not (layout_ok and shim_ok and sim_ok):
        sys.exit(1)


@main.command()
@click.option(
    "--sim/--gpu",
    "force_sim",
    default=None,
    help="Use the simulated GPU, or insist on a real one. Default: a GPU when one is visible.",
)
def demo(force_sim: bool | None) -> None:
    """Run the demo: concurrent benchmarks through KREX on a real or the simulated GPU."""
    from krex.client.demo import main as demo_main

    sys.exit(demo_main(force_sim))


if __name__ == "__main__":
    main()
