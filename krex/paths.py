"""Where the native parts of an installed (or editable) krex live."""

from __future__ import annotations

from pathlib import Path

_HOW_TO_BUILD = (
    "build it with `make build` in a source checkout, or reinstall krex "
    "(`pip install .` / `pip install -e .`): setup.py compiles shim/ into krex/_lib/"
)


def package_dir() -> Path:
    """The directory of the krex package."""
    return Path(__file__).resolve().parent


def _required(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {path}: {_HOW_TO_BUILD}")
    return path


def shim_library() -> Path:
    """The preload library libkrex.so."""
    return _required(package_dir() / "_lib" / "libkrex.so", "the KREX preload library")


def sim_library_dir() -> Path:
    """The directory holding the simulated CUDA driver libcuda.so.1 (for LD_LIBRARY_PATH)."""
    directory = package_dir() / "_lib" / "sim"
    _required(directory / "libcuda.so.1", "the simulated CUDA driver")
    return directory
