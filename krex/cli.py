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

# Commands that land with the controller; they accept any arguments (`krex run -- cmd ...`).
_PENDING = {
    "run": "Run a command in a GPU slot with libkrex.so preloaded.",
    "daemon": "Run the KREX controller.",
    "status": "Show the controller's slots, gates and regions.",
    "region": "Run a command as one exclusive region.",
    "bench": "Benchmark commands side by side through KREX.",
}


@click.group(name="krex", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="krex")
def main() -> None:
    """KREX: many GPU benchmarking commands share a GPU; each timing-critical region runs alone."""


def _pending(name: str, summary: str) -> click.Command:
    @click.command(
        name=name,
        help=f"{summary} (Not available yet.)",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        click.echo(f"krex {name}: not available yet (lands with the controller issue)", err=True)
        sys.exit(2)

    return command


for _name, _summary in _PENDING.items():
    main.add_command(_pending(_name, _summary))


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
