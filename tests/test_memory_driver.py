"""Device memory the driver takes for itself, through the shim (issue #47; docs/memory.md):
every call the driver can answer with out-of-memory waits as an allocation does (context
creation, module and library loading, lazy loading, launches, graphs), holding no gate
announcement while it waits; and a process that submitted nothing since its last drain (one
waiting for memory, say) costs a region nothing, even if it cannot answer a drain.

Each test drives Python workers (ctypes through krex.sim.simgpu, so the shim sees the calls as it
sees a framework's) on a private simulated node and KREX segment (the `node` fixture).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from conftest import Node
from helpers import until

from krex.core.shm import MEM_KINDS
from krex.daemon.gate import exclusive

MIB = 1 << 20

# A worker: one statement per stdin line, "ok" (or the exception) back; `g` is a SimGPU.
WORKER = textwrap.dedent("""
    import sys, traceback
    from krex.sim.simgpu import SimGPU
    g = SimGPU() if sys.argv[1] == "open" else None
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            exec(line)
            print("ok", flush=True)
        except Exception as e:
            print("error", type(e).__name__, e, flush=True)
""")


class Worker:
    def __init__(self, env: dict[str, str], *, open_gpu: bool = True) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", WORKER, "open" if open_gpu else "-"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.read() == "ready", self.p.stderr.read() if self.p.stderr else ""

    def read(self) -> str:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        assert line, f"worker exited: {self.p.wait(timeout=10)}"
        return line.strip()

    def do(self, stmt: str) -> str:
        assert self.p.stdin is not None
        self.p.stdin.write(stmt + "\n")
        self.p.stdin.flush()
        return self.read()

    def start(self, stmt: str) -> None:
        """Send a statement without waiting for its answer (read() it later)."""
        assert self.p.stdin is not None
        self.p.stdin.write(stmt + "\n")
        self.p.stdin.flush()

    def close(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)
            self.p.kill()
        self.p.wait(timeout=10)
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            if f:
                f.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.close()


def test_a_sibling_that_submitted_nothing_since_its_last_drain_is_not_waited_for(
    node: Node, workers: list[Worker]
) -> None:
    """Issue #47, 4: a region never times out on a sibling that has submitted nothing since
    its last drain (one blocked in a memory wait, or stopped, as here): what it submitted was
    drained then, and the gate keeps it from submitting more. Once it submits again, it is
    drained again."""
    w = Worker(node.env(tenant=2))
    workers.append(w)
    assert w.do("g.launch(1000); g.sync()") == "ok"
    with exclusive(node.seg, 0, owner=1) as hold:
        pass
    assert hold.clean and hold.drained == 1  # it had submitted: drained
    with exclusive(node.seg, 0, owner=1) as hold:
        pass
    assert hold.clean and hold.drained == 0  # nothing since: not asked
    os.kill(w.p.pid, signal.SIGSTOP)  # cannot answer a drain now
    with exclusive(node.seg, 0, owner=1, drain_timeout_s=0.5) as hold:
        pass
    assert hold.clean and hold.drained == 0, hold.problems  # a drain asked would time out
    os.kill(w.p.pid, signal.SIGCONT)
    assert w.do("g.launch(1000)") == "ok"
    with exclusive(node.seg, 0, owner=1) as hold:
        pass
    assert hold.clean and hold.drained == 1


@pytest.mark.node(KREX_SIM_MEM_BYTES="64M")
def test_a_sibling_waiting_for_memory_stalls_no_region(node: Node, workers: list[Worker]) -> None:
    """A sibling that launched work, was drained, and now waits for memory another holds:
    regions on its GPU are granted at once and clean, however long it waits."""
    holder = Worker(node.env(tenant=3, KREX_MEM_WAIT_S="60"))
    workers.append(holder)
    assert holder.do("p = g.alloc(48 << 20)") == "ok"
    waiter = Worker(node.env(tenant=2, KREX_MEM_WAIT_S="60"))
    workers.append(waiter)
    assert waiter.do("g.launch(1000); g.sync()") == "ok"
    with exclusive(node.seg, 0, owner=1) as hold:
        pass
    assert waiter.p.stdin is not None
    waiter.p.stdin.write("q = g.alloc(32 << 20)\n")  # waits: the holder keeps 48 of 64 MiB
    waiter.p.stdin.flush()
    until(lambda: any(s.mem_want for s in node.seg.slots_of(waiter.p.pid)), 30, "the wait")
    for _ in range(3):
        with exclusive(node.seg, 0, owner=1, quiesce_timeout_s=0.5, drain_timeout_s=0.5) as hold:
            pass
        assert hold.clean, hold.problems  # a drain asked of the waiter would time out
    assert holder.do("g.free(p)") == "ok"
    for s in node.seg.slots_of(waiter.p.pid):
        node.seg.mem_grant(s.index)
    assert waiter.read() == "ok"


# The driver's own memory, per kind of call: (extra environment of the waiter, statements run
# before (they fit), the statement whose driver call runs out of memory, the wait's kind).
DRIVER_CASES = {
    "context": ({"KREX_SIM_CTX_BYTES": "16M"}, "", "g = SimGPU()", "context"),
    "created-context": ({"KREX_SIM_CTX_BYTES": "16M"}, "g = SimGPU()", "g.create_context()",
                        "context"),
    "module": ({"KREX_SIM_MODULE_BYTES": "16M"}, "g = SimGPU()", "g.load_module()", "module"),
    "lazy-module": ({"KREX_SIM_MODULE_BYTES": "16M", "CUDA_MODULE_LOADING": "LAZY"},
                    "g = SimGPU(); m = g.load_module()", "g.function(m, 'k')", "module"),
    "library": ({"KREX_SIM_MODULE_BYTES": "16M"}, "g = SimGPU()", "g.library_load()", "module"),
    "launch": ({}, "g = SimGPU(); f = g.function(g.load_module(), 'k@local=16M')",
               "g.launch_fn(f, 1000)", "launch"),
    "graph": ({"KREX_SIM_GRAPH_BYTES": "16M"}, "g = SimGPU(); gr = g.graph_create()",
              "g.graph_instantiate(gr)", "graph"),
}  # fmt: skip


@pytest.mark.node(KREX_SIM_MEM_BYTES="64M")
@pytest.mark.parametrize("case", sorted(DRIVER_CASES))
def test_the_drivers_own_memory_waits_as_an_allocation_does(
    node: Node, workers: list[Worker], case: str
) -> None:
    """Issue #47, 1: a context, a module (loaded eagerly or at its first function), a library,
    a launch's local memory, a graph: where the driver answers out-of-memory because another
    process holds the memory, the call waits (the slot says which kind), holds no gate
    announcement meanwhile (a region on its GPU is granted at once and clean), and succeeds
    once the memory comes back, with no error reaching the program."""
    env, before, call, kind = DRIVER_CASES[case]
    holder = Worker(node.env(tenant=3))
    workers.append(holder)
    waiter = Worker(node.env(2, 0, KREX_MEM_WAIT_S="60", **env), open_gpu=False)
    workers.append(waiter)
    if before:
        assert waiter.do(before) == "ok"
    free = holder.do("q = g.alloc(g.mem_info()[0] - (8 << 20))")  # leave 8 of the 16 MiB asked
    assert free == "ok"
    waiter.start(call)
    # Waiting, not in flight: each retry of a gated call is announced for its moment only
    # (KREX_MEM_RETRY), so a read may catch one (seen once beside a loaded suite).
    mine = until(
        lambda: [s for s in node.seg.slots() if s.tenant == 2 and s.mem_want and s.in_flight == 0],
        30,
        f"{case}'s wait",
    )
    assert MEM_KINDS[mine[0].mem_kind] == kind
    with exclusive(node.seg, 0, owner=1, quiesce_timeout_s=0.5, drain_timeout_s=0.5) as hold:
        pass
    assert hold.clean, hold.problems
    assert holder.do("g.free(q)") == "ok"
    node.seg.mem_grant(mine[0].index)
    assert waiter.read() == "ok"
    (s,) = [s for s in node.seg.slots() if s.tenant == 2]
    assert s.mem_kind_waits[MEM_KINDS.index(kind)] == 1 and s.mem_waits == 1
    assert s.mem_oom_alone == s.mem_oom_shared == 0 and s.mem_want == 0
