"""Every path into the driver is intercepted, each call counted exactly once (issue: foundation)."""

from __future__ import annotations

import os
import signal
import subprocess

from conftest import Node

from krex.daemon.gate import exclusive


def test_every_path_and_variant_is_counted_once(node: Node) -> None:
    """Global binding, dlsym, RTLD_NEXT, cuGetProcAddress v1/v2/per-thread/self-look-up."""
    p = subprocess.run(
        [node.native.program("paths")],
        env=node.env(tenant=1),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAIL" not in p.stdout
    assert p.stdout.strip().splitlines()[-1].endswith(" 0 failed")
    # The slot the program registered shows every call it counted, and nothing unidentified.
    (slot,) = [s for s in node.seg.slots() if s.tenant == 1]
    calls = sum(1 for line in p.stdout.splitlines() if "shim +1 driver +1" in line)
    assert calls >= 25
    assert slot.intercepted == calls + 1  # and the first launch, which registered the process
    assert slot.unmatched == 0
    assert slot.in_flight == 0


def test_a_process_registers_one_slot_and_children_their_own(node: Node) -> None:
    """fork/exec'd children re-register: each process has its own slot and drain thread."""
    script = (
        f"{node.native.program('workload')} submit 1 10 && "
        f"{node.native.program('workload')} submit 1 10"
    )
    p = subprocess.run(
        ["sh", "-c", script], env=node.env(tenant=3), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    slots = [s for s in node.seg.slots() if s.tenant == 3]
    assert len({s.pid for s in slots}) == 2
    assert all(s.intercepted == 10 for s in slots)


def test_a_forked_child_registers_anew_with_its_own_drain_thread(node: Node) -> None:
    """fork without exec: the child gets its own slot, counts its own calls, and drains."""
    p = subprocess.Popen(
        [node.native.program("workload"), "fork-child", "7"],
        env=node.env(tenant=1),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline().split()
        assert line[0] == "child"
        child = int(line[1])
        (parent_slot,) = node.seg.slots_of(p.pid)
        (child_slot,) = node.seg.slots_of(child)
        assert parent_slot.index != child_slot.index
        assert child_slot.intercepted == 7 and child_slot.alive
        # Both processes answer a drain: the child's drain thread exists (threads do not
        # survive fork, so only its re-registration can have started it).
        with exclusive(node.seg, 0, owner=99, drain_timeout_s=5) as hold:
            pass
        assert hold.clean and hold.drained == 2, hold
    finally:
        if "child" in locals():
            os.kill(child, signal.SIGKILL)
        p.wait(timeout=30)
