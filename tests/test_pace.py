"""Pacing (docs/shim.md, "Pacing"; `[regions] pace_ms`) on the simulated GPU: outside its own
regions a process's stream keeps about the pace of GPU work queued, however far ahead its host
runs; inside a region of its own tenant nothing is paced; a bad KREX_PACE_US is one warning and
no pacing. The simulated GPU runs a kernel in real time, so a loaded machine only slows the
host: queues are shorter, never longer."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import Node
from helpers import configured, krex_run

# argv: launches. That many 1 ms kernels on one stream, no sync, an event recorded after each:
# after each launch, how many of those events are not complete (the stream's queue, in
# launches), then a sync. Prints {"queued": [...], "ok": true}.
PROBE = textwrap.dedent("""
    import json, sys
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    events, done, queued = [], 0, []
    for _ in range(int(sys.argv[1])):
        g.launch(1_000_000)
        e = g.event()
        g._call("cuEventRecord", e, g.stream)
        events.append(e)
        while done < len(events) and g.cu.cuEventQuery(events[done]) == 0:
            done += 1  # in stream order: the first not complete ends the complete ones
        queued.append(len(events) - done)
    g.sync()
    print(json.dumps({"queued": queued, "ok": True}))
""")


def _probe(
    node: Node, launches: int, script: str = PROBE, **env: str
) -> tuple[dict[str, Any], str]:
    p = subprocess.run(
        [sys.executable, "-c", script, str(launches)],
        env=node.env(1, 0, **env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.mark.node(slots=8)
def test_a_paced_stream_keeps_about_the_pace_queued(node: Node) -> None:
    """3 ms of pace, 1 ms kernels: once its first markers completed (the estimate known), the
    stream holds at most a few launches, where unpaced it holds all it launched (~60). Beside
    two busy cores too: a time from a completion seen late whose start is not known either
    (it may be below the launches') never lowers the estimate (before, one such made it 0 and
    the queue grew to 23)."""
    out, _ = _probe(node, 60, KREX_PACE_US="3000")
    assert out["ok"]
    # The first launches are paced only by the oldest's age (no completed one yet): a burst.
    steady = out["queued"][20:]
    assert max(steady) <= 6, out["queued"]


# argv: launches. That many 1 us kernels on one stream as fast as Python launches them (each
# done before the next: nothing to pace), then a sync. Prints the work-submitting calls beside
# the launches (our markers' records) and the loop's wall time.
COST = textwrap.dedent("""
    import ctypes, json, sys, time
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    g.cu.krexsim_submissions.restype = ctypes.c_ulonglong
    n = int(sys.argv[1])
    g.launch(1000)
    g.sync()
    s0, t0 = g.cu.krexsim_submissions(), time.monotonic_ns()
    for _ in range(n):
        g.launch(1000)
    g.sync()
    s1, t1 = g.cu.krexsim_submissions(), time.monotonic_ns()
    print(json.dumps({"records": s1 - s0 - n, "elapsed_ns": t1 - t0, "ok": True}))
""")


@pytest.mark.node(slots=8)
def test_a_stream_whose_kernels_end_at_once_is_not_marked_every_launch(node: Node) -> None:
    """Under the pace a launch queries the stream's oldest marker only every 50 us
    (PACE_LOOK_NS), and its estimate is the least of its bounds (each completion seen only at
    the next look: a time above the launches'), not its slowest, first launch's; so a stream
    whose kernels end before its next launch gets a marker per 16 launches, per 200 us or per
    look, not one per launch (before: 2,000 of 2,000, each launch finding the last marker
    complete, or the first launch's 155 us standing for every launch). A loaded machine
    launches more slowly: the bound, in launches and in time, grows with it."""
    n = 2000
    out, err = _probe(node, n, COST, KREX_PACE_US="3000")
    bound = n / 16 + out["elapsed_ns"] / 40_000 + 5
    assert 0 < out["records"] <= bound, (out, bound, err[-1000:])


@pytest.mark.node(slots=8)
def test_inside_its_own_region_nothing_is_paced(node: Node) -> None:
    """The gate closed for the process's own tenant (its region): its launches run ahead as
    natively; a region's timing is never paced."""
    node.seg.gate_close(0, 1, deadline_s=120)
    try:
        out, _ = _probe(node, 40, KREX_PACE_US="3000")
    finally:
        node.seg.gate_open(0)
    assert max(out["queued"]) >= 12, out["queued"]  # paced, 3-4 (above)


@pytest.mark.node(slots=8)
def test_a_bad_pace_is_one_warning_and_no_pacing(node: Node) -> None:
    out, err = _probe(node, 40, KREX_PACE_US="3ms")
    assert out["ok"]
    assert err.count("KREX_PACE_US must be microseconds") == 1, err
    assert max(out["queued"]) >= 12, out["queued"]  # paced, 3-4 (above)


def test_a_daemon_with_a_pace_gives_its_commands_the_shims_setting(tmp_path: Path) -> None:
    """`[regions] pace_ms` reaches the shim as KREX_PACE_US (microseconds), which `krex run`
    takes from the daemon (krex/core/trust.py); without it, none is set."""
    show = [sys.executable, "-c", "import os; print(os.environ.get('KREX_PACE_US'))"]
    for config, said in (("[regions]\npace_ms = 2.5\n", "2500"), ("", "None")):
        with configured(tmp_path, config) as d:
            p = krex_run(d, *show, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == said
