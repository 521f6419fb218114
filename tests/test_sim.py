"""Tests of the simulated GPU (shim/sim/), the CPU-only stand-in for libcuda.so.1.

Builds the library and tests/c/sim_selftest.c with the project's gcc command into a
temporary directory, runs the selftest against a private simulated node (a unique
KREX_SIM_SHM, removed afterwards), and checks the library's exported symbols and what it
prints.
"""

import contextlib
import os
import re
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "shim" / "sim"


def _lib_cmd(out: Path) -> list[str]:
    # As setup.py builds it: shim/sim/*.c and the log writer it shares with the shim.
    sources = ["shim/log.c", *sorted(str(p.relative_to(ROOT)) for p in SIM.glob("*.c"))]
    return [
        "gcc",
        "-std=gnu11",
        "-O2",
        "-g",
        "-fPIC",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fvisibility=hidden",
        "-pthread",
        "-Ishim",
        "-shared",
        "-Wl,--version-script=shim/sim/simcuda.map",
        "-Wl,-soname,libcuda.so.1",
        "-Wl,-Bsymbolic-functions",
        "-o",
        str(out / "libcuda.so.1"),
        *sources,
        "-ldl",
        "-lrt",
        "-lpthread",
    ]


def _selftest_cmd(out: Path) -> list[str]:
    return [
        "gcc",
        "-std=gnu11",
        "-O2",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pthread",
        "-Ishim",
        "tests/c/sim_selftest.c",
        "-o",
        str(out / "sim_selftest"),
        f"-L{out}",
        "-l:libcuda.so.1",
        f"-Wl,-rpath,{out}",
        "-ldl",
        "-lm",
        "-lpthread",
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out: Path = tmp_path_factory.mktemp("sim")
    for cmd in (_lib_cmd(out), _selftest_cmd(out)):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
        assert r.stderr == "", f"compiler output (must be warning-free):\n{r.stderr}"
    return out


@pytest.fixture
def shm_name() -> Iterator[str]:
    """A private simulated node for one test; its segment is removed afterwards."""
    name = f"/krex-sim-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"/dev/shm/{name[1:]}")


def _sim_env(shm: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KREX_SIM_", "KREX_TENANT"))}
    env.update(KREX_SIM_SHM=shm, KREX_SIM_GPUS="2", KREX_SIM_CTX_CREATE_MS="50")
    env.update(extra)
    return env


def _assert_all_simulated(stderr: str) -> None:
    for line in stderr.splitlines():
        assert "simulated" in line, f"stderr line without 'simulated': {line!r}"


def test_selftest(built: Path, shm_name: str) -> None:
    """The simulator's own checks pass (a second attempt is allowed, and reported as a warning:
    a few checks compare host-side gaps with 100 us and can lose on a loaded 2-core machine)."""
    failures = []
    for attempt in range(2):
        # Debug output on: every line the library prints must still say "simulated".
        r = subprocess.run(
            [str(built / "sim_selftest")],
            env=_sim_env(f"{shm_name}-{attempt}", KREX_SIM_DEBUG="1"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        Path(f"/dev/shm/{shm_name[1:]}-{attempt}").unlink(missing_ok=True)
        if r.returncode == 0:
            break
        failures.append(f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-2000:]}")
    assert r.returncode == 0, "\n\n".join(failures)
    if failures:
        warnings.warn(
            f"sim selftest passed on its second attempt; first: {failures[0]}", stacklevel=1
        )
    assert re.search(r"^\d+ passed, 0 failed$", r.stdout, re.M), r.stdout
    assert r.stderr, "KREX_SIM_DEBUG=1 printed nothing"
    _assert_all_simulated(r.stderr)


def _version_script_names() -> set[str]:
    text = re.sub(r"/\*.*?\*/", "", (SIM / "simcuda.map").read_text(), flags=re.S)
    m = re.search(r"global:(.*?)local:", text, re.S)
    assert m, "simcuda.map has no global: ... local: section"
    return {n.strip() for n in m.group(1).split(";") if n.strip()}


def test_exports_are_the_version_script(built: Path) -> None:
    r = subprocess.run(
        ["nm", "-D", "--defined-only", str(built / "libcuda.so.1")],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split() for line in r.stdout.splitlines() if line.strip()]
    names = {row[-1] for row in rows}
    assert names == _version_script_names()
    # Each exported name is its own function: an address maps back to exactly one name.
    addresses = [row[0] for row in rows]
    assert len(addresses) == len(set(addresses))
    # And every SIM_EXPORT in the sources is in the script (and so exported).
    exported = set()
    for src in SIM.glob("*.c"):
        exported |= set(re.findall(r"^SIM_EXPORT\((\w+)\);", src.read_text(), re.M))
    assert exported == names


_CALL_CUINIT = (
    "import ctypes, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "n = ctypes.c_int(-1)\n"
    "print(lib.cuInit(0), lib.cuDeviceGetCount(ctypes.byref(n)), n.value)\n"
)


def _cuinit(built: Path, shm: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CALL_CUINIT, str(built / "libcuda.so.1")],
        env=_sim_env(shm, **extra),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_cuinit_through_ctypes(built: Path, shm_name: str) -> None:
    r = _cuinit(built, shm_name, KREX_SIM_GPUS="3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0", "3"]
    assert r.stderr == ""


@pytest.mark.parametrize(
    "content, message",
    [
        (b"GARBAGE!" * 512, "is not a KREX simulated-GPU segment"),
        # The right magic ("KSIM"), another layout version.
        (
            (0x4D49534B).to_bytes(4, "little") + (999).to_bytes(4, "little") + bytes(4088),
            "was made by another version of the simulated GPU",
        ),
    ],
)
def test_foreign_segment_refused(built: Path, shm_name: str, content: bytes, message: str) -> None:
    Path(f"/dev/shm/{shm_name[1:]}").write_bytes(content)
    r = _cuinit(built, shm_name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["3", "3"]  # CUDA_ERROR_NOT_INITIALIZED, and it stays so
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr  # one clear message
    assert message in lines[0] and "rm /dev/shm" in lines[0]
    _assert_all_simulated(r.stderr)
