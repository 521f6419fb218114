"""The `krex` command line. Thin: each command hands over to the module that does the work."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click

from krex import __version__, paths


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
    help="Comma-separated: exclusive (also gives native_repeat), shared, krex, krex-serial.",
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
    help="Warm workers per GPU in the krex mode (default: the daemon's: slots on a real GPU, "
    "none on the simulated one). krex-cold never has any.",
)
def bench_run(
    modes: str, concurrency: int, out_dir: Path, profile: str, tasks: str | None, pool: int | None
) -> None:
    """Run the suite in each mode and report throughput and fidelity side by side."""
    from krex.bench import runner
    from krex.bench.suite import SuiteError

    command = "krex " + " ".join(sys.argv[1:]) if len(sys.argv) > 1 else "krex bench run"
    try:
        chosen = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
        results = runner.run(
            runner.parse_modes(modes), concurrency, out_dir, profile, command, chosen, pool
        )
    except (runner.BenchError, SuiteError) as e:
        click.echo(f"krex bench: {e}", err=True)
        sys.exit(2)
    ratio = results["throughput_ratio_vs_exclusive"]
    click.echo(f"results in {out_dir}: " + ", ".join(f"{m} {ratio[m]:.2f}x" for m in ratio))


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


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--gpu", type=click.IntRange(min=0), help="Run on this GPU (default: least loaded).")
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
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
    type=click.FloatRange(min=0, min_open=True),
    metavar="S",
    help="Revoke any region of this command that lasts longer than S seconds.",
)
@click.option(
    "--no-pool", is_flag=True, help="Never run in a warm pool worker: start CMD as its own process."
)
@click.option("--sim", is_flag=True, help="Run on the simulated GPU (a daemon of its own).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
@click.option(
    "--queue-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=3600.0,
    show_default=True,
    metavar="S",
    help="Give up waiting for a slot after S seconds.",
)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    argv: tuple[str, ...],
    gpu: int | None,
    report: Path | None,
    auto_regions: str | None,
    region_timeout: float | None,
    no_pool: bool,
    sim: bool,
    socket_path: str | None,
    queue_timeout: float,
) -> None:
    """Run CMD in a GPU slot with libkrex.so preloaded: krex run [OPTIONS] -- CMD..."""
    from krex import client

    if auto_regions == "default":
        from krex.autoregions import DEFAULT_AUTO_REGIONS

        auto_regions = ",".join(DEFAULT_AUTO_REGIONS)
    sys.exit(
        client.run(
            client.RunOptions(
                argv=list(argv),
                gpu=gpu,
                report=report,
                auto_regions=auto_regions,
                region_timeout_s=region_timeout,
                sim=sim,
                socket=socket_path,
                queue_timeout_s=queue_timeout,
                no_pool=no_pool,
            )
        )
    )


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML configuration (default: $KREX_CONFIG, then /etc/krex/config.toml).",
)
@click.option("--sim", is_flag=True, help="Serve simulated GPUs.")
@click.option("--socket", "socket_path", metavar="PATH", help="Listen here.")
@click.option("--gpus", type=click.IntRange(1, 16), help="Number of GPUs (simulated or real).")
@click.option("--slots", type=click.IntRange(1, 256), help="Commands admitted per GPU at once.")
@click.option(
    "--pool",
    type=click.IntRange(0, 256),
    help="Warm workers per GPU (default: pool.workers, else slots; 0 on simulated GPUs).",
)
def daemon(
    config_path: Path | None,
    sim: bool,
    socket_path: str | None,
    gpus: int | None,
    slots: int | None,
    pool: int | None,
) -> None:
    """Run the KREX controller in the foreground (for systemd or a terminal)."""
    import dataclasses

    from krex import config as kconfig
    from krex import daemon as kdaemon

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
    if slots:
        changes["slots"] = slots
    if pool is not None:
        changes["pool_workers"] = pool
    sys.exit(kdaemon.run(dataclasses.replace(cfg, **changes)))  # type: ignore[arg-type]


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON.")
@click.option("--sim", is_flag=True, help="Ask the simulated-GPU daemon.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def status(as_json: bool, sim: bool, socket_path: str | None) -> None:
    """Show the daemon's GPUs, slots, queues, regions, tenants and freezer."""
    import json

    from krex import client

    try:
        st = client.status(sim, socket_path)
    except (client.ClientError, OSError) as e:
        click.echo(f"krex status: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    kind = "simulated" if st["sim"] else "real"
    click.echo(
        f"krex daemon {st['version']} (pid {st['pid']}) on {st['socket']}: {kind} GPUs, "
        f"freezer {st['freezer']}, MPS {'on' if st['mps'] else 'off'}"
    )
    for g in st["gpus"]:
        region = g["region"]
        held = (
            f"region held by tenant {region['tenant']} for {region['age_s']:.1f} s"
            if region
            else "no region"
        )
        click.echo(
            f"GPU {g['gpu']}: {g['used']}/{g['slots']} slots, {g['queue']} queued, "
            f"{held}, {g['region_queue']} waiting for a region; cores region "
            f"{g['region_cores']} shared {g['shared_cores']}"
        )
        if g.get("foreign"):
            click.echo(f"  foreign GPU processes (not under krex): {g['foreign']}")
        pool = g.get("pool") or {}
        if pool.get("workers") or pool.get("warm_runs"):
            click.echo(
                f"  pool: {pool['workers']} worker(s) ({pool['idle']} idle, {pool['busy']} busy, "
                f"{pool['starting']} starting); runs warm {pool['warm_runs']}, "
                f"cold {pool['cold_runs']}"
            )
        for t in g["tenants"]:
            click.echo(
                f"  tenant {t['tenant']}: pids {t['pids']}, {t['regions']} region(s), "
                f"{t['age_s']:.1f} s: {' '.join(t['argv'])}"
            )


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
def region(argv: tuple[str, ...]) -> None:
    """Run a command as one exclusive region: krex region -- CMD...

    For shell and C++ benchmarks. Exits with the command's status (127: it cannot start; 125:
    the region cannot begin). Outside krex it just runs the command.
    """
    from krex.markers import run_in_region

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
    from krex.demo import main as demo_main

    sys.exit(demo_main(force_sim))


if __name__ == "__main__":
    main()
