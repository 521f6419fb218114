"""The project skeleton: the krex command's surface, the built native libraries, the cffi layout."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

import krex
from krex.core import paths

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ["run", "daemon", "status", "top", "config", "region", "bench", "info", "demo"]


def krex_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "krex.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def header_int(name: str, header: str = "krex_layout.h") -> int:
    text = (ROOT / "shim" / header).read_text()
    match = re.search(rf"^#define {name} (\w+?)U?\b", text, re.MULTILINE)
    assert match, f"{name} not in {header}"
    return int(match.group(1), 0)


def test_version_option_prints_package_version() -> None:
    """`krex --version` names the package version."""
    result = krex_cli("--version")
    assert result.returncode == 0, result.stderr
    assert krex.__version__ in result.stdout


def test_the_version_is_pep_440_and_the_projects() -> None:
    """krex.__version__ is a valid PEP 440 version, the one pyproject.toml declares and the
    installed metadata carries (not a pinned string: a release bumps it in one place less)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert str(Version(krex.__version__)) == krex.__version__  # canonical, not just parseable
    assert krex.__version__ == declared
    assert importlib.metadata.version("krex") == declared


def test_console_script_is_installed() -> None:
    """The `krex` console script exists beside the interpreter and runs."""
    script = Path(sys.executable).parent / "krex"
    if not script.exists():
        pytest.skip("krex is not installed in this interpreter's environment")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for command in COMMANDS:
        assert command in result.stdout


def test_info_reports_versions_libraries_and_gpu() -> None:
    """`krex info` succeeds and shows the layout version and both library paths."""
    result = krex_cli("info")
    assert result.returncode == 0, result.stdout + result.stderr
    major, minor = header_int("KREX_LAYOUT_MAJOR"), header_int("KREX_LAYOUT_MINOR")
    assert re.search(rf"^layout\s+{major}\.{minor}$", result.stdout, re.MULTILINE)
    assert str(paths.shim_library()) in result.stdout
    assert str(paths.sim_library_dir()) in result.stdout
    assert re.search(r"^gpu\s+\S", result.stdout, re.MULTILINE)


def test_import_krex_does_not_import_region() -> None:
    """`import krex` stays light: the markers are imported only when first used."""
    code = (
        "import sys, krex; a = 'krex.tenant.markers' in sys.modules; krex.region; "
        "print(a, 'krex.tenant.markers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False True", result.stderr


def test_unknown_attribute_raises_attribute_error() -> None:
    """The lazy re-export does not swallow other attribute names."""
    with pytest.raises(AttributeError):
        _ = krex.no_such_thing


LIBRARIES = [
    pytest.param(paths.shim_library, "libkrex.so", id="libkrex.so"),
    pytest.param(lambda: paths.sim_library_dir() / "libcuda.so.1", "libcuda.so.1", id="sim"),
]


@pytest.mark.parametrize(("locate", "soname"), LIBRARIES)
def test_library_is_elf_shared_object_without_python(
    locate: Callable[[], Path], soname: str
) -> None:
    """Both native libraries are built, ELF shared objects with their soname, and need no
    libpython (they must load into any process)."""
    library = locate()
    header = library.read_bytes()[:18]
    assert header[:4] == b"\x7fELF"
    assert int.from_bytes(header[16:18], "little") == 3  # e_type ET_DYN: a shared object
    if shutil.which("readelf") is None:
        pytest.skip("readelf not installed")
    dynamic = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert f"Library soname: [{soname}]" in dynamic
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert not [name for name in needed if "python" in name.lower()]
    ldd = subprocess.run(["ldd", str(library)], capture_output=True, text=True)
    assert "python" not in ldd.stdout.lower()
    assert "not found" not in ldd.stdout


def test_paths_point_into_the_package() -> None:
    """The libraries live in the installed package's _lib/ directory."""
    assert paths.shim_library() == paths.package_dir() / "_lib" / "libkrex.so"
    assert paths.sim_library_dir() == paths.package_dir() / "_lib" / "sim"
    assert paths.package_dir() == Path(krex.__file__).resolve().parent


def test_cffi_struct_sizes_match_the_header() -> None:
    """The cffi module's view of the layout has the header's sizes (cache-line multiples)."""
    from krex._native import ffi, lib

    cacheline = header_int("KREX_CACHELINE")
    max_gpus = header_int("KREX_MAX_GPUS")
    assert ffi.sizeof("struct krex_header") == 128
    assert ffi.sizeof("struct krex_gate") == 64 == cacheline
    assert ffi.sizeof("struct krex_slot") == 192
    assert ffi.sizeof("struct krex_segment") == 128 + max_gpus * 64
    assert ffi.offsetof("struct krex_slot", "drain_req") == cacheline
    version = (lib.KREX_LAYOUT_MAJOR, lib.KREX_LAYOUT_MINOR)
    assert version == (header_int("KREX_LAYOUT_MAJOR"), header_int("KREX_LAYOUT_MINOR"))
    constants = (lib.KREX_MAX_GPUS, lib.KREX_E_TIMEOUT)
    assert constants == (max_gpus, -7)


def test_cffi_module_declares_every_control_function() -> None:
    """Every function of shim/krex_control.h is callable through krex._native."""
    from krex._native import lib

    text = (ROOT / "shim" / "krex_control.h").read_text()
    names = re.findall(r"^[a-z].*?\b(krex_\w+)\(", text, re.MULTILINE)
    assert "krex_seg_init" in names and "krex_now_ns" in names
    for name in names:
        assert callable(getattr(lib, name)), name


def test_markers_need_only_the_standard_library() -> None:
    """A benchmark in another environment can use krex.region(): the markers import neither
    the cffi binding nor posix_ipc."""
    code = (
        "import sys, krex\n"
        "with krex.region():\n    pass\n"
        "print(sorted(m for m in ('cffi', 'posix_ipc', 'krex._native', 'krex.core.shm') "
        "if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
