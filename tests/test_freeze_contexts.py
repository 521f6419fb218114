"""regions.freeze on the simulated GPU: with `contexts` a region freezes a sibling's process that
holds a GPU context and leaves its contextless child (a compile worker's shape) running, the
region clean; with `all` both are frozen. And a sibling's process left running that creates its
first context while a region is open gets it only after the region (the shim gates it)."""

from __future__ import annotations

import json
import mmap
import os
import select
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import HOLDER, configured, krex_run, until

# argv: a 16-byte counter file. The process counts into its first 8 bytes, a child it spawned
# before its context (no context: Inductor's subprocess pool's shape) into the last 8.
SIBLING = textwrap.dedent("""
    import mmap, os, struct, subprocess, sys
    from krex.sim.simgpu import SimGPU
    CHILD = '''
    import mmap, os, struct, sys
    m = mmap.mmap(os.open(sys.argv[1], os.O_RDWR), 16)
    parent, i = os.getppid(), 0
    while os.getppid() == parent:
        i += 1
        struct.pack_into("Q", m, 8, i)
    '''
    m = mmap.mmap(os.open(sys.argv[1], os.O_RDWR), 16)
    child = subprocess.Popen([sys.executable, "-c", CHILD, sys.argv[1]])
    g = SimGPU()
    g.launch(1000)
    g.sync()
    print("ready", child.pid, flush=True)
    i = 0
    while True:
        i += 1
        struct.pack_into("Q", m, 0, i)
""")

# argv: a file whose appearance makes it create its first context (SimGPU), then say so.
LATE = textwrap.dedent("""
    import os, sys, time
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    print("context", flush=True)
    time.sleep(120)
""")


def _line(p: subprocess.Popen[str], within_s: float) -> str | None:
    """p's next line of output, or None if none came within `within_s`."""
    assert p.stdout is not None
    if not select.select([p.stdout], [], [], within_s)[0]:
        return None
    return p.stdout.readline().strip()


def _config(freeze: str) -> str:
    return f'[regions]\nfreeze = "{freeze}"\n'


@pytest.fixture(params=["contexts", "all"])
def freeze(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _counts(m: mmap.mmap) -> tuple[int, int]:
    main, child = struct.unpack_from("QQ", m, 0)
    return int(main), int(child)


def test_contexts_leaves_a_contextless_child_running(tmp_path: Path, freeze: str) -> None:
    """During the owner's region the sibling's context holder is frozen under either setting;
    its contextless child runs on only with `contexts`; the region is clean, its record's
    `awake` at least 1 (the child) with `contexts`, 0 with `all`."""
    counter = tmp_path / "counts"
    counter.write_bytes(bytes(16))
    fd = os.open(counter, os.O_RDWR)
    m = mmap.mmap(fd, 16)
    os.close(fd)
    report = tmp_path / "owner.json"
    with configured(tmp_path, _config(freeze)) as d:
        sib = krex_run(d, sys.executable, "-c", SIBLING, str(counter), stdout=subprocess.PIPE)
        try:
            ready = _line(sib, 60)
            assert ready and ready.startswith("ready"), ready
            until(lambda: all(_counts(m)), 30, "both of the sibling's processes to count")
            holder = krex_run(
                d, sys.executable, "-c", HOLDER, "4", report=report, stdout=subprocess.PIPE
            )
            assert (_line(holder, 60) or "").startswith("in region")
            main, child = _counts(m)
            if freeze == "contexts":
                until(lambda: _counts(m)[1] > child, 3, "the contextless child to run on")
            else:
                time.sleep(1.0)
                assert _counts(m)[1] == child, "the child ran during the region"
            assert _counts(m)[0] == main, "the context holder ran during the region"
            assert _line(holder, 60) == "out"
            assert holder.wait(timeout=60) == 0
            until(lambda: _counts(m)[0] > main, 30, "the context holder to run again")
        finally:
            sib.kill()
            sib.wait(timeout=60)
    m.close()
    (region,) = json.loads(report.read_text())["regions"]
    assert region["clean"], region["problems"]
    if freeze == "contexts":
        assert region["awake"] >= 1, region
    else:
        assert region["awake"] == 0, region


def test_a_context_made_during_a_region_waits_for_its_end(tmp_path: Path) -> None:
    """A sibling's process left running (no context at the freeze) that creates its first
    context while the owner's region is open gets it only once the region has ended."""
    go = tmp_path / "go"
    report = tmp_path / "owner.json"
    with configured(tmp_path, _config("contexts")) as d:
        sib = krex_run(d, sys.executable, "-c", LATE, str(go), stdout=subprocess.PIPE)
        try:
            assert _line(sib, 60) == "ready"
            holder = krex_run(
                d, sys.executable, "-c", HOLDER, "6", report=report, stdout=subprocess.PIPE
            )
            assert (_line(holder, 60) or "").startswith("in region")
            go.touch()
            # The region lasts 6 s from its grant: well past this look.
            said = _line(sib, 2.0)
            assert said is None, f"the sibling said {said!r} while the region was open"
            assert _line(holder, 60) == "out"
            assert holder.wait(timeout=60) == 0
            assert _line(sib, 30) == "context"
        finally:
            sib.kill()
            sib.wait(timeout=60)
    (region,) = json.loads(report.read_text())["regions"]
    assert region["clean"], region["problems"]
    assert region["awake"] >= 1, region


def test_a_regions_siblings_ask_the_gpus_users_once() -> None:
    """With regions.freeze = contexts each sibling's freeze asks who uses the GPUs (NVML on a
    GPU); a region's siblings freeze in parallel, so the list is read once while the gate stays
    closed, and again after any change of a gate word (a new close, an open) or while open."""
    from types import SimpleNamespace

    from krex.core.shm import Gate
    from krex.daemon.machinery import NodeMachinery

    reads: list[int] = []
    word = [Gate(0, 0)]
    users: set[int] | None = {7}

    def processes(gpu: int) -> set[int] | None:
        reads.append(gpu)
        return users

    nvml = SimpleNamespace(processes=processes)
    segments = SimpleNamespace(gates=SimpleNamespace(gate=lambda gpu: word[0]))
    cfg = SimpleNamespace(sim=False)
    gpus = [SimpleNamespace(index=0), SimpleNamespace(index=1)]
    m = NodeMachinery(cfg, gpus, segments, nvml)  # type: ignore[arg-type]
    assert m.all_users.read() == {7} and m.all_users.read() == {7}
    assert len(reads) == 4, "an open gate: read every time"
    word[0] = Gate(epoch=1, owner=3)
    assert [m.all_users.read() for _ in range(5)] == [{7}] * 5
    assert len(reads) == 6, "a closed gate: read once"
    word[0] = Gate(epoch=2, owner=3)  # the next region's close
    users = None
    assert m.all_users.read() is None and len(reads) == 8, "a new epoch: read again (unknown)"
