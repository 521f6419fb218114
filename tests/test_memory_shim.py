"""Device memory through the shim (docs/shim.md, "Device memory"): every allocation and free
counted through every look-up path; an allocation that could not succeed alone fails at once; one
that fails because another process holds memory waits for a grant, ends on a release or
KREX_MEM_WAIT_S; a process outside KREX passes through.

The cross-process cases need the simulated driver's node-wide capacity (KREX_SIM_MEM_BYTES,
branch mem-sim); without it they are skipped, saying so.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import C_DIR, Node, compile_c
from helpers import until

from krex.core.paths import sim_library_dir
from krex.core.shm import SlotView

MIB = 1024 * 1024
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


def _sim_has_node_memory() -> bool:
    lib = sim_library_dir() / "libcuda.so.1"
    return b"KREX_SIM_MEM_BYTES" in lib.read_bytes()


node_memory = pytest.mark.skipif(
    not _sim_has_node_memory(),
    reason="the simulated driver has no node-wide memory capacity (KREX_SIM_MEM_BYTES: mem-sim)",
)


@pytest.fixture(scope="module")
def mem_user(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("mem") / "mem_user"
    return str(compile_c(C_DIR / "mem_user.c", out, link_sim=sim_library_dir()))


def _slot(node: Node, index: int) -> SlotView:
    return node.seg.slot(index)


def _wait_for(pred: Callable[[], object], within_s: float = 30.0) -> None:
    until(pred, within_s)


class Proc:
    """A mem_user process driven line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def line(self) -> str:
        assert self.p.stdout is not None
        text = self.p.stdout.readline()
        assert text, f"exited early: {self.p.wait(timeout=10)} {self.stderr()}"
        return text.strip()

    def send(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("\n")
        self.p.stdin.flush()

    def stderr(self) -> str:
        return self.p.stderr.read() if self.p.stderr and self.p.poll() is not None else ""

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            if f:
                f.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.close()


def test_every_allocation_and_free_through_every_path(node: Node, mem_user: str) -> None:
    """mem_bytes goes up by each allocation and back down at its free; mem_peak stays."""
    p = subprocess.run(
        [mem_user, "paths"], env=node.env(tenant=1), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAIL" not in p.stdout
    ok = [line for line in p.stdout.splitlines() if line.startswith("ok")]
    # cuMemAlloc/cuMemFree through all five paths at least (the simulated driver of main);
    # with mem-sim's entry points, every one of them through every path.
    assert len(ok) >= 6, p.stdout
    if _sim_has_node_memory():  # mem-sim's driver: all but cuArray3DCreate_v2, five paths each
        assert len(ok) >= 36, p.stdout
    (slot,) = [s for s in node.seg.slots() if s.tenant == 1]
    assert slot.mem_bytes == 0
    assert slot.mem_peak >= 3 * MIB
    assert slot.mem_waits == slot.mem_oom_alone == slot.mem_oom_shared == 0


def test_an_allocation_bigger_than_the_device_fails_at_once(node: Node, mem_user: str) -> None:
    p = subprocess.run(
        [mem_user, "alloc", str(1 << 50)],
        env=node.env(tenant=1, KREX_MEM_WAIT_S="30"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    rc, seconds, index = p.stdout.splitlines()[-1].split()[1:]
    assert int(rc) == OOM and float(seconds) < 1.0
    slot = _slot(node, int(index))
    assert slot.mem_oom_alone == 1 and slot.mem_oom_shared == 0 and slot.mem_waits == 0
    assert slot.mem_want == 0 and slot.mem_bytes == 0


def test_a_process_outside_krex_passes_through(node: Node, mem_user: str) -> None:
    """No KREX_SHM: the driver's error at once, no slot taken, nothing written."""
    env = node.env(tenant=1)
    del env["KREX_SHM"]
    p = subprocess.run(
        [mem_user, "alloc", str(1 << 50)], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    rc, seconds, index = p.stdout.splitlines()[-1].split()[1:]
    assert int(rc) == OOM and float(seconds) < 1.0 and int(index) == -1
    assert not node.seg.slots()


def _holder_and_waiter(
    node: Node, mem_user: str, procs: list[Proc], **env: str
) -> tuple[Proc, Proc, int]:
    """A holds 48 MiB of a 64 MiB GPU; B asks for 32 MiB and waits. Returns (A, B, B's slot)."""
    a = Proc([mem_user, "hold", str(48 * MIB)], {**node.env(tenant=1), **env})
    procs.append(a)
    assert a.line().startswith("held ")
    b = Proc([mem_user, "alloc", str(32 * MIB)], {**node.env(tenant=2), **env})
    procs.append(b)
    index = int(b.line().split()[1])
    _wait_for(lambda: _slot(node, index).mem_want == 32 * MIB)
    assert _slot(node, index).mem_since_ns > 0
    return a, b, index


@node_memory
@pytest.mark.node(KREX_SIM_MEM_BYTES="64M")
def test_a_wait_succeeds_after_the_other_frees_and_a_grant(
    node: Node, mem_user: str, procs: list[Proc]
) -> None:
    a, b, index = _holder_and_waiter(node, mem_user, procs, KREX_MEM_WAIT_S="60")
    time.sleep(0.3)
    assert _slot(node, index).mem_want == 32 * MIB  # still waiting: nobody freed or granted
    a.send()
    assert a.line() == "freed"
    node.seg.mem_grant(index)
    rc, seconds, _ = b.line().split()[1:]
    assert int(rc) == 0, b.stderr()
    assert float(seconds) < 2.0  # the grant, not the 2 s fallback, ended it
    s = _slot(node, index)
    assert s.mem_want == 0 and s.mem_waits == 1 and s.mem_wait_ns > 0
    assert s.mem_oom_alone == 0 and s.mem_oom_shared == 0
    assert s.mem_peak >= 32 * MIB


@node_memory
@pytest.mark.node(KREX_SIM_MEM_BYTES="64M")
def test_each_granted_retry_that_fails_is_said_and_none_before_it_is_made(
    node: Node, mem_user: str, procs: list[Proc]
) -> None:
    """Layout 2.2: the waiter adds 1 to mem_failed for each retry that failed again, and only
    once it was made: the controller's "a retry failed" (docs/memory.md) is the process's word,
    not a time since its grant (a loaded machine may run the waiter seconds later)."""
    a, _b, index = _holder_and_waiter(node, mem_user, procs, KREX_MEM_WAIT_S="60")
    assert _slot(node, index).mem_failed == 0  # waiting, no retry made yet
    # (At least: with no controller passing over it, it also retries on its own.)
    node.seg.mem_grant(index)
    _wait_for(lambda: _slot(node, index).mem_failed >= 1)
    node.seg.mem_grant(index)
    _wait_for(lambda: _slot(node, index).mem_failed >= 2)
    a.send()
    assert a.line() == "freed"
    failed = _slot(node, index).mem_failed
    node.seg.mem_grant(index)
    _wait_for(lambda: _slot(node, index).mem_want == 0)
    assert _slot(node, index).mem_failed == failed  # the retry that succeeded is no failure


@node_memory
@pytest.mark.node(KREX_SIM_MEM_BYTES="64M")
def test_a_denial_ends_the_wait_with_out_of_memory_counted_alone(
    node: Node, mem_user: str, procs: list[Proc]
) -> None:
    """The controller judged the wait could not succeed even with the GPU to the command
    alone: the driver's error goes back, as it would natively, and counts as alone."""
    _a, b, index = _holder_and_waiter(node, mem_user, procs, KREX_MEM_WAIT_S="60")
    node.seg.mem_deny(index)
    rc, seconds, _ = b.line().split()[1:]
    assert int(rc) == OOM and float(seconds) < 2.0
    s = _slot(node, index)
    assert s.mem_oom_alone == 1 and s.mem_oom_shared == 0
    assert s.mem_want == 0 and s.mem_waits == 1
    assert s.mem_kind_waits[0] == 1  # an allocation's wait


@node_memory
@pytest.mark.node(KREX_SIM_MEM_BYTES="64M")
def test_krex_mem_wait_s_bounds_a_wait_nobody_grants(
    node: Node, mem_user: str, procs: list[Proc]
) -> None:
    _a, b, index = _holder_and_waiter(node, mem_user, procs, KREX_MEM_WAIT_S="0.5")
    rc, seconds, _ = b.line().split()[1:]
    assert int(rc) == OOM and 0.4 <= float(seconds) < 3.0
    s = _slot(node, index)
    assert s.mem_oom_shared == 1 and s.mem_want == 0 and s.mem_waits == 1
    assert s.mem_wait_ns >= 400_000_000


@node_memory
@pytest.mark.node(KREX_SIM_MEM_BYTES="64M")
def test_without_a_controller_the_waiter_retries_on_its_own(
    node: Node, mem_user: str, procs: list[Proc]
) -> None:
    """No grant ever comes: after 2 s of silence the waiter retries every second itself."""
    a, b, index = _holder_and_waiter(node, mem_user, procs, KREX_MEM_WAIT_S="30")
    a.send()
    assert a.line() == "freed"
    rc, seconds, _ = b.line().split()[1:]
    assert int(rc) == 0 and 1.5 <= float(seconds) < 5.0
    assert _slot(node, index).mem_waits == 1


def test_a_slot_handed_to_another_tenant_starts_its_memory_figures_again(
    node: Node, mem_user: str, procs: list[Proc]
) -> None:
    """A pool worker's slot serves one command after another: at the hand-over its peak is
    what it holds now and its waits and errors are 0, so no command reports another's."""
    p = Proc([mem_user, "hold", str(8 * MIB)], node.env(tenant=1))
    procs.append(p)
    index = int(p.line().split()[1])
    p.send()
    assert p.line() == "freed"
    before = _slot(node, index)
    assert before.mem_peak >= 8 * MIB and before.mem_bytes == 0
    node.seg.set_slot_tenant(index, before.pid, 2)
    after = _slot(node, index)
    assert after.tenant == 2 and after.mem_peak == 0
    assert after.mem_waits == after.mem_wait_ns == after.mem_oom_shared == 0
