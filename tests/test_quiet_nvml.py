"""regions.quiet_nvml: no NVML read of a GPU while its region's owner measures
(docs/operator-guide.md, "Reads beside a region"). The regions' part (the grant's clock sample
before the grant, the memory split and the audit at the end) is in tests/test_regions.py; here
the daemon's own reads: its once-a-second tick, the per-process and free memory that admission
and the memory arbiter read."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from helpers import HOLDER, Counter, Daemon, krex_run

from krex.core.config import load
from krex.daemon.machinery import NodeMachinery
from krex.daemon.node import Node


class FakeNvml:
    """Counts every read by name; process memory answers `used`, memory (total, used)."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, int]] = []
        self.used = {7: 1 << 30}

    def sample(self, gpu: int) -> dict[str, int]:
        self.reads.append(("sample", gpu))
        return {"sm_clock_mhz": 1980, "throttle_reasons": 0, "energy_mj": 1000}

    def process_memory(self, gpu: int) -> dict[int, int]:
        self.reads.append(("process_memory", gpu))
        return dict(self.used)

    def memory(self, gpu: int) -> tuple[int, int]:
        self.reads.append(("memory", gpu))
        return 100 << 30, sum(self.used.values())


def machinery(nvml: FakeNvml) -> NodeMachinery:
    segments = SimpleNamespace(live_slots=lambda: [], gates=None)
    gpus = [SimpleNamespace(index=0), SimpleNamespace(index=1)]
    return NodeMachinery(SimpleNamespace(sim=False), gpus, segments, nvml)  # type: ignore[arg-type]


def test_the_tick_and_the_per_process_memory_leave_a_measured_gpu_alone() -> None:
    """While GPU 0's owner measures: the tick reads only GPU 1, and GPU 0's per-process memory
    is the last read (its siblings are frozen); once the region ends both read again. Off (the
    default), every read goes to NVML as before."""
    nvml = FakeNvml()
    m = machinery(nvml)
    m.tick()
    assert nvml.reads == [("sample", 0), ("sample", 1)]  # the default: no GPU quiet
    assert m.device_users(0) == {7: 1 << 30}
    measuring = {0}
    m.quiet = lambda gpu: gpu in measuring
    nvml.reads.clear()
    nvml.used = {7: 2 << 30}
    m.tick()
    assert m.device_users(0) == {7: 1 << 30}  # the last read stands in
    assert m.device_users(1) == {7: 2 << 30}
    assert nvml.reads == [("sample", 1), ("process_memory", 1)]
    measuring.clear()
    nvml.reads.clear()
    m.tick()
    assert m.device_users(0) == {7: 2 << 30}
    assert nvml.reads == [("sample", 0), ("sample", 1), ("process_memory", 0)]


def test_a_gpu_never_read_before_its_region_is_read_once_even_when_quiet() -> None:
    """No last read to stand in (a daemon that started during the region): one read, not a
    made-up figure."""
    nvml = FakeNvml()
    m = machinery(nvml)
    m.quiet = lambda gpu: True
    assert m.device_users(0) == {7: 1 << 30} and nvml.reads == [("process_memory", 0)]
    assert m.device_users(0) == {7: 1 << 30} and len(nvml.reads) == 1


def test_free_memory_and_the_device_sample_hold_back_while_a_region_measures() -> None:
    """Node.device_free (admission) gives the last read while the GPU is quiet; the tick's
    device sample (learned driver peaks) skips that GPU."""
    nvml = FakeNvml()
    m = machinery(nvml)
    node: Any = SimpleNamespace(nvml=nvml, machinery=m, _free_seen={})
    assert Node.device_free(node, 0) == 99 << 30
    m.quiet = lambda gpu: gpu == 0
    nvml.used = {7: 5 << 30}
    nvml.reads.clear()
    assert Node.device_free(node, 0) == 99 << 30 and nvml.reads == []
    assert Node.device_free(node, 1) == 95 << 30

    def never(gpu: int) -> None:
        raise AssertionError("read a measured GPU")

    m.device_users = never  # type: ignore[method-assign]
    node.gpus = [SimpleNamespace(index=0, tenants=[])]
    node.segments = SimpleNamespace(live_by_tenant=lambda: {})
    Node.sample_device(node)  # GPU 0 skipped: no read


def test_the_setting_is_off_by_default_and_read_from_the_regions_table(tmp_path: Path) -> None:
    assert load(None).region_quiet_nvml is False
    conf = tmp_path / "krex.toml"
    conf.write_text("[regions]\nquiet_nvml = true\n")
    assert load(conf).region_quiet_nvml is True


def test_a_daemon_with_quiet_nvml_runs_clean_regions_beside_a_sibling(tmp_path: Path) -> None:
    """End to end on the simulated GPU (its driver's memory counts stand in for NVML's): with
    the setting on, a region beside a busy sibling is granted, clean, and its record has the
    placement taken at the end and the grant's sample step."""
    cfg = tmp_path / "config.toml"
    cfg.write_text("[regions]\nquiet_nvml = true\n")
    d = Daemon(tmp_path / "krex.sock", "--config", str(cfg))
    d.start()
    sibling = Counter(d)
    try:
        report = tmp_path / "holder.json"
        p = krex_run(d, sys.executable, "-c", HOLDER, "0.2", report=report)
        assert p.wait(timeout=60) == 0
        (region,) = json.loads(report.read_text())["regions"]
        assert region["clean"] is True, region["problems"]
        assert "memory_gib" in region and "sample" in region["entry_steps_s"]
    finally:
        sibling.stop()
        d.stop()
