"""Libraries loaded with RTLD_DEEPBIND (docs/security.md, case 3; issue #49): such a library
binds to the driver it depends on before the preloaded shim, so its work used to bypass the
gate and the drain (`intercepted 0`, and a region beside it measured 40 ms for 20, `clean:
true`). The shim's dlopen now routes every object such a load brings in through the shim; what
it cannot route makes the process `ungated`, and a region beside it unclean.

The sibling (tests/c/deep_user.c) takes its slot through the shim, then runs
tests/c/deep_lib.c loaded deep-bound: "direct" launches through the library's own references
to the driver, "nested" through the driver that the library opens by path and dlsym's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import C_DIR, Native, Node, compile_c
from helpers import Daemon, Witness, krex_run

# How the deep-bound library is linked: "lazy" calls through its PLT, bound at the first call;
# "now" takes every driver entry from its GOT (-fno-plt), bound at load and made read-only
# (full RELRO).
FLAVOURS = {"lazy": (), "now": ("-fno-plt", "-Wl,-z,now", "-Wl,-z,relro")}


@pytest.fixture(scope="module")
def deep(native: Native, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The programs: deep_user, and deep_lib-<flavour>.so for each flavour."""
    out = tmp_path_factory.mktemp("deep")
    built = {
        "user": str(compile_c(C_DIR / "deep_user.c", out / "deep_user", link_sim=native.sim_dir))
    }
    for flavour, flags in FLAVOURS.items():
        lib = out / f"deep_lib-{flavour}.so"
        built[flavour] = str(
            compile_c(
                C_DIR / "deep_lib.c", lib, "-shared", "-fPIC", *flags, link_sim=native.sim_dir
            )
        )
    return built


@pytest.fixture
def witness() -> Iterator[Witness]:
    w = Witness()
    try:
        yield w
    finally:
        w.close()


def _driver(native: Native) -> str:
    """The driver deep_lib opens by path ("nested")."""
    return str(native.sim_dir / "libcuda.so.1")


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
@pytest.mark.parametrize("how", ["direct", "nested"])
def test_a_deep_bound_librarys_launches_wait_at_a_closed_gate(
    node: Node, deep: dict[str, str], witness: Witness, how: str, flavour: str
) -> None:
    """With the gate closed to its tenant, the deep-bound library's first launch blocks in the
    shim: the simulated driver records no submission from it while another tenant holds the
    GPU. Once the gate opens every launch goes through, each one counted. (The gate closes once
    the library has its context: a context's creation waits at a closed gate too.)"""
    env = node.env(
        tenant=1, DEEP_DRIVER=_driver(node.native), KREX_SIM_WITNESS=str(witness.path),
        DEEP_WAIT="1",
    )  # fmt: skip
    p = subprocess.Popen(
        [deep["user"], deep[flavour], how, "5", "1000000", "0"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
    node.seg.gate_close(0, owner=9, deadline_s=30)
    witness.grant(9)
    try:
        p.stdin.write("go\n")
        p.stdin.flush()
        deadline = time.monotonic() + 10
        while p.poll() is None and time.monotonic() < deadline:
            if any(s.blocked for s in node.seg.slots_of(p.pid)):
                break
            time.sleep(0.01)
        assert p.poll() is None, f"the deep-bound library ran past a closed gate: {p.stdout.read()}"
        assert witness.violations == 0
        (slot,) = node.seg.slots_of(p.pid)
        assert slot.blocked >= 1 and slot.ungated == 0, slot
    finally:
        witness.grant(0)
        node.seg.gate_open(0)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"launches": 5}
    assert "krex[" not in err, err
    assert witness.violations == 0 and witness.submissions >= 5
    (slot,) = node.seg.slots_of(p.pid)
    assert slot.intercepted >= 5, slot


def test_a_second_copy_of_the_driver_makes_the_process_ungated(
    node: Node, deep: dict[str, str], tmp_path: Path
) -> None:
    """The deep-bound library opens a copy of the driver from another file: a second driver
    the shim does not gate. Its look-ups are passed through as they are, the process says so
    once, naming the copy, and its slot counts as ungated (a region beside it is unclean)."""
    copy = tmp_path / "elsewhere" / "libcuda.so.1"
    copy.parent.mkdir()
    shutil.copy(_driver(node.native), copy)
    p = subprocess.run(
        [deep["user"], deep["lazy"], "nested", "2", "1000", "0"],
        env=node.env(tenant=1, DEEP_DRIVER=str(copy)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert f"from {copy} is not in the driver the shim gates" in p.stderr, p.stderr
    (slot,) = [s for s in node.seg.slots() if s.tenant == 1]
    assert slot.ungated >= 1, slot


# The owner: a region timing a 20 ms kernel on the simulated GPU (model time: a kernel that
# shares the GPU with another's measures longer).
OWNER = textwrap.dedent("""
    import json, krex
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    g.launch(1000)
    g.sync()
    with krex.region():
        ms = g.measure(20_000_000, 3)
    print(json.dumps(ms), flush=True)
""")


@pytest.mark.parametrize("how", ["direct", "nested"])
def test_a_region_beside_a_deep_bound_library_is_alone_or_unclean(
    deep: dict[str, str], native: Native, tmp_path: Path, how: str
) -> None:
    """The issue's reproduction: a sibling whose deep-bound library keeps 200 ms of kernels
    queued in a context of its own; an owner times a 20 ms kernel in a region beside it. The
    region is clean only if nothing of the sibling's shared the GPU with it (the library's
    context drained, its launches gated); else it is unclean, with the reason. Before the
    shim routed such libraries: clean, and 40 ms."""
    d = Daemon(tmp_path / "krex.sock", "--slots", "4")
    d.start()
    argv = [deep["user"], deep["lazy"], how, "10", "20000000", "120"]
    env = {**os.environ, "DEEP_DRIVER": _driver(native)}
    sib = krex_run(d, *argv, stdout=subprocess.PIPE, env=env)
    try:
        assert sib.stdout is not None
        assert sib.stdout.readline().strip() == "ready"
        assert sib.stdout.readline().startswith("launched")  # its queue is busy from now on
        report = tmp_path / "owner.json"
        owner = krex_run(d, sys.executable, "-c", OWNER, report=report, stdout=subprocess.PIPE)
        out, _ = owner.communicate(timeout=60)
        assert owner.returncode == 0
    finally:
        sib.kill()
        sib.wait(timeout=30)
        d.stop()
    ms = json.loads(out.strip().splitlines()[-1])
    (region,) = json.loads(report.read_text())["regions"]
    if region["clean"]:
        assert max(ms) < 30, f"a clean region shared the GPU with the sibling: {ms} ms"
    else:
        assert any("RTLD_DEEPBIND" in p for p in region["problems"]), region
