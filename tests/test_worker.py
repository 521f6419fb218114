"""krex/pool/worker.py's parts that need no daemon: which exit handlers are the command's own, the
order they run in, and the refusal to fork after a preload initialised the GPU driver."""

from __future__ import annotations

import atexit
import functools
import subprocess
import sys
import textwrap
from pathlib import Path

from krex.pool import worker


def test_exit_handlers_of_frameworks_are_told_from_the_commands() -> None:
    def mine() -> None:
        pass

    def fake_torch() -> None:
        pass

    fake_torch.__module__ = "torch._inductor.async_compile"
    assert worker._own(mine)
    assert worker._own(functools.partial(mine))
    assert not worker._own(fake_torch)
    assert not worker._own(functools.partial(fake_torch))
    assert worker._own(print), "a builtin the command registered is its own"


def test_captured_handlers_run_last_registered_first_own_before_frameworks() -> None:
    ran: list[str] = []

    def framework() -> None:
        ran.append("framework")

    framework.__module__ = "triton.runtime"
    with worker.ExitHandlers() as h:
        atexit.register(ran.append, "first")
        atexit.register(framework)
        atexit.register(ran.append, "second")
        atexit.register(ran.append, "dropped")
        atexit.unregister(ran.append)  # as atexit does: every registration of it goes
        atexit.register(ran.append, "third")
    assert atexit.register is not None and "ExitHandlers" not in repr(atexit.register)
    h.run(own=True)
    assert ran == ["third"]
    h.run(own=False)
    assert ran == ["third", "framework"]


def _fake_driver(tmp: Path, body: str) -> Path:
    """A libcuda.so.1 of our own in a directory of its own."""
    d = tmp / f"drv-{abs(hash(body))}"
    d.mkdir()
    src = d / "x.c"
    src.write_text(body)
    lib = d / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def _warm_up_with(tmp: Path, lib: Path, sim: bool) -> list[str]:
    """warm_up(["json", "not_a_module_at_all", "loads_driver"]) in a process of its own (the
    test's stays clean), where loads_driver loads `lib`: its printed outcome."""
    (lib.parent / "loads_driver.py").write_text(f"import ctypes\nctypes.CDLL({str(lib)!r})\n")
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(lib.parent)!r})
        os.environ.pop("KREX_SIM_SHM", None)
        if {sim!r}:
            os.environ["KREX_SIM_SHM"] = "/krex-test-sim"
        from krex.pool import worker
        print(worker.warm_up(["json", "not_a_module_at_all"]))
        try:
            print("kept:", worker.warm_up(["loads_driver"]))
        except worker.DriverInitialized as e:
            print("refused:", e.module, e)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_a_preload_that_initialises_the_driver_is_refused(tmp_path: Path) -> None:
    """A child forked after the driver is initialised could not use the GPU: the worker
    refuses such a preload, naming it. Loaded is not initialised: the real driver answers
    CUDA_ERROR_NOT_INITIALIZED (3) before cuInit, and such a preload is kept."""
    fresh = _fake_driver(tmp_path, "int cuDeviceGetCount(int *n) { *n = 0; return 3; }\n")
    ready = _fake_driver(tmp_path, "int cuDeviceGetCount(int *n) { *n = 1; return 0; }\n")
    mute = _fake_driver(tmp_path, "int krex_test_symbol(void) { return 1; }\n")
    skipped, kept = _warm_up_with(tmp_path, fresh, sim=False)
    assert "not_a_module_at_all (ModuleNotFoundError" in skipped
    assert kept == "kept: []", kept
    for lib in (ready, mute):  # initialised; a driver that cannot be asked
        _, refused = _warm_up_with(tmp_path, lib, sim=False)
        assert refused.startswith("refused: loads_driver importing loads_driver initialised"), (
            refused
        )
    # The simulated driver initialises on any call: there, loaded counts as initialised.
    _, refused = _warm_up_with(tmp_path, fresh, sim=True)
    assert refused.startswith("refused: loads_driver"), refused
