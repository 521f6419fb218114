"""Shared fixtures: the built native pieces, compiled C test programs, a simulated node, and a
daemon with one warm worker (`pool`).

A simulated node is a fresh KREX segment plus a fresh simulated-GPU segment, both with names
unique to the test, removed afterwards. `node.env(tenant)` gives the environment a tenant
process runs with: the shim preloaded and the simulated libcuda.so.1 on the library path.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from krex.core.liveness import daemon_holds
from krex.core.paths import shim_library, sim_library_dir
from krex.core.shm import Segment

ROOT = Path(__file__).resolve().parents[1]
C_DIR = ROOT / "tests" / "c"
_names = itertools.count()


@dataclass(frozen=True)
class Native:
    shim: Path
    sim_dir: Path
    bin_dir: Path

    def program(self, name: str) -> str:
        return str(self.bin_dir / name)


def compile_c(
    src: Path, out: Path, *extra: str, link_sim: Path | None = None, link: str = "libcuda.so.1"
) -> Path:
    """Compile one test program with the project's warnings as errors; with link_sim, linked
    against the library `link` (the simulated driver, or the simulated HIP runtime) there."""
    cmd = [
        os.environ.get("CC", "cc"),
        "-std=gnu11",
        "-O2",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{ROOT / 'shim'}",
        f"-I{C_DIR}",
        "-o",
        str(out),
        str(src),
        *extra,
    ]
    if link_sim is not None:
        cmd += [f"-L{link_sim}", f"-l:{link}"]
    cmd += ["-ldl", "-lpthread", "-lrt"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def _group_roots() -> set[str]:
    """The krex group roots (krex-...) under the cgroup hierarchies mounted here."""
    from krex.core.tenants import V1_CPUSET, V1_FREEZER, V2_MOUNT

    roots: set[str] = set()
    for mount in (V2_MOUNT, V1_FREEZER, V1_CPUSET):
        with contextlib.suppress(OSError):
            roots |= {n for n in os.listdir(mount) if n.startswith("krex-")}
    return roots


_ROOTS_BEFORE = pytest.StashKey[set[str]]()


def pytest_configure(config: pytest.Config) -> None:
    """The tests start commands that a Ctrl-C, a `kill -INT` or a hang-up must reach. A pytest
    started where those are ignored (a script's `cmd &` ignores SIGINT and SIGQUIT, nohup
    SIGHUP) or blocked would hand that on to every command (krex keeps a caller's ignored
    signals, as natively): those tests would test their caller (seen: 7 failures of a CI run
    started in the background). The defaults, in every process of the session."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _controller(config: pytest.Config) -> bool:
    """Whether this is the session that runs no tests itself when pytest-xdist spreads them
    (or the only one): what it sees before and after spans every worker's daemons."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session.config):
        session.config.stash[_ROOTS_BEFORE] = _group_roots()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the group roots the session's daemons left. A daemon that stops while its
    commands run leaves their groups (they keep running, and the next daemon on the same
    root prunes them); every test daemon has a root of its own, so nothing would. Done once
    every worker is done: a worker's own teardown would take its neighbours' live roots."""
    before = session.config.stash.get(_ROOTS_BEFORE, None)
    if not _controller(session.config) or before is None:
        return
    from krex.core.tenants import TenantsError, recover

    for root in _group_roots() - before:
        if _daemon_lives(root) or _test_process_lives(root):
            continue  # another session's (tests of two checkouts at once): not ours to thaw
        with contextlib.suppress(TenantsError, OSError):
            recover(root)


def _test_process_lives(root: str) -> bool:
    """Whether `root` is a test's own group root (tests/test_tenants.py's Env: krex-test-PID-N)
    whose process still runs and is not this one: this session's workers have ended by now,
    so it is another session's, whose groups recover() would remove under it (seen: a CI
    run's test failed with its group gone when a second pytest on the machine ended)."""
    parts = root.split("-")
    if len(parts) != 4 or parts[:2] != ["krex", "test"] or not parts[2].isdigit():
        return False
    if int(parts[2]) == os.getpid():
        return False  # a session without workers: its own
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _daemon_lives(root: str) -> bool:
    """Whether a daemon runs on group root `root` (its gates segment has the root's name)."""
    try:
        fd = os.open(f"/dev/shm/{root}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return daemon_holds(fd)
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops a lock taken here


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> Native:
    bin_dir = tmp_path_factory.mktemp("bin")
    sim_dir = sim_library_dir()
    for prog in ("paths", "workload"):
        compile_c(C_DIR / f"{prog}.c", bin_dir / prog, link_sim=sim_dir)
    if (sim_dir / "libamdhip64.so").exists():  # the simulated HIP runtime (tests skip without)
        compile_c(
            C_DIR / "hip_workload.c",
            bin_dir / "hip_workload",
            link_sim=sim_dir,
            link="libamdhip64.so",
        )
    return Native(shim=shim_library(), sim_dir=sim_dir, bin_dir=bin_dir)


@dataclass
class Node:
    """One simulated GPU node: a KREX segment and a simulated-driver segment."""

    native: Native
    seg: Segment
    sim_shm: str
    extra: dict[str, str]

    def wait_registered(self, pid: int, within_s: float = 10.0) -> None:
        """Until process pid holds a slot (the shim registers at the first gated call)."""
        from helpers import until  # helpers imports this module

        until(lambda: self.seg.slots_of(pid), within_s, f"process {pid}'s slot", every_s=0.01)

    def env(self, tenant: int, gpu: int = 0, **more: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            LD_PRELOAD=str(self.native.shim),
            LD_LIBRARY_PATH=str(self.native.sim_dir),
            KREX_SHM=self.seg.name,
            KREX_TENANT=str(tenant),
            KREX_GPU=str(gpu),
            KREX_SIM_SHM=self.sim_shm,
        )
        env.update(self.extra)
        env.update(more)
        return env


def load_script(relpath: str) -> Any:
    """A script of the repository (e.g. "scripts/bench/launch_probe.py") loaded as a module, for
    testing its functions without running its main."""
    import importlib.util

    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unique(prefix: str) -> str:
    return f"/{prefix}-{os.getpid()}-{next(_names)}"


def remove_shm(name: str) -> None:
    path = Path("/dev/shm") / name.lstrip("/")
    if path.exists():
        path.unlink()


@pytest.fixture
def node(native: Native, request: pytest.FixtureRequest) -> Iterator[Node]:
    marker = request.node.get_closest_marker("node")
    kw = dict(marker.kwargs) if marker else {}
    seg = Segment.create(unique("krex-test"), n_gpus=kw.pop("gpus", 1), n_slots=kw.pop("slots", 64))
    n = Node(
        native=native,
        seg=seg,
        sim_shm=unique("krex-sim-test"),
        extra={k: str(v) for k, v in kw.items()},
    )
    try:
        yield n
    finally:
        seg.close()
        seg.unlink()
        remove_shm(n.sim_shm)


def _gpu_present() -> bool:
    return Path("/dev/nvidia0").exists()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked gpu need a real NVIDIA GPU; elsewhere they are skipped, saying why."""
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Any]:
    """A simulated daemon (tests/helpers.py's Daemon) with one warm worker, ready."""
    from helpers import Daemon, wait_pool_ready  # helpers imports this module

    d = Daemon(tmp_path / "krex.sock", "--pool", "1")
    d.start()
    wait_pool_ready(d, 1)
    try:
        yield d
    finally:
        d.stop()
