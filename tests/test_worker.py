"""krex/worker.py's parts that need no daemon: which exit handlers are the command's own, the
order they run in, and the refusal to fork after a preload loaded the GPU driver."""

from __future__ import annotations

import atexit
import functools
import subprocess
import sys
import textwrap
from pathlib import Path

from krex import worker


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


def test_a_preload_that_loads_the_driver_is_refused(tmp_path: Path) -> None:
    """A child forked after the driver is loaded could not use the GPU: the worker refuses to
    start, naming the module (run in a process of its own: the test's stays clean)."""
    lib = tmp_path / "libcuda.so.1"
    src = tmp_path / "x.c"
    src.write_text("int krex_test_symbol(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    (tmp_path / "loads_driver.py").write_text(f"import ctypes\nctypes.CDLL({str(lib)!r})\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from krex import worker
        print(worker.warm_up(["json", "not_a_module_at_all"]))
        try:
            worker.warm_up(["loads_driver"])
        except worker.DriverLoaded as e:
            print("refused:", e.module, e)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    skipped, refused = p.stdout.splitlines()
    assert "not_a_module_at_all (ModuleNotFoundError" in skipped
    assert refused.startswith("refused: loads_driver importing loads_driver loaded the GPU"), (
        refused
    )
