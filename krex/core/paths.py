"""Where the native parts of an installed (or editable) krex live."""

from __future__ import annotations

from pathlib import Path

_HOW_TO_BUILD = (
    "build it with `make build` in a source checkout, or reinstall krex "
    "(`pip install .` / `pip install -e .`): setup.py compiles shim/ into krex/_lib/"
)


def package_dir() -> Path:
    """The directory of the krex package (this module is in its core/)."""
    return Path(__file__).resolve().parent.parent


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


def hip_shim_library() -> Path:
    """libkrex-hip.so: the HIP wrappers (preloaded; it exports no HIP name)."""
    return _required(package_dir() / "_lib" / "libkrex-hip.so", "the KREX HIP library")


def hip_audit_library() -> Path:
    """libkrex-hip-audit.so: the LD_AUDIT module that routes HIP bindings to the wrappers."""
    return _required(package_dir() / "_lib" / "libkrex-hip-audit.so", "the KREX HIP audit module")


def sim_hip_available() -> bool:
    """Whether the simulated HIP runtime (libamdhip64.so) was built beside the simulated CUDA."""
    return (package_dir() / "_lib" / "sim" / "libamdhip64.so").is_file()
