"""scripts/bench/launch_probe.py's core sets and summaries, and the CPU slice the GPU scripts
give their daemon (krex.bench.runner.slice_config); the probe itself runs on the GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import load_script

from krex.bench.runner import slice_config
from krex.core.config import load


def probe() -> Any:
    return load_script("scripts/bench/launch_probe.py")


def test_core_sets_are_all_then_contiguous_quarters() -> None:
    sets = probe().core_sets(list(range(16)))
    assert sets == [list(range(16)), [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert probe().core_sets([3, 1, 2, 0, 4]) == [[0, 1, 2, 3, 4], [0, 1], [2], [3], [4]]
    assert probe().core_sets([0, 1]) == [[0, 1], [0], [1]]


def test_a_summary_gives_the_median_and_the_tails() -> None:
    s = probe().summary([float(x) for x in range(1, 101)])
    assert s["median_us"] == 50.5 and s["p10_us"] < 12 < 89 < s["p90_us"]


def test_a_slice_is_written_as_the_daemon_reads_it(tmp_path: Path) -> None:
    path = slice_config("12-15/0-11", tmp_path / "krex.toml")
    config = load(path).slices[0]  # what the daemon reads from KREX_CONFIG
    assert config.region == {12, 13, 14, 15} and config.shared == set(range(12))


@pytest.mark.parametrize("bad", ["12-15", "/0-11", "12-15/", '1"/2'])
def test_a_slice_that_is_not_two_cpu_lists_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="is not REGION/SHARED"):
        slice_config(bad, tmp_path / "krex.toml")
    assert not (tmp_path / "krex.toml").exists()


def test_steal_is_summed_over_the_named_cores_only() -> None:
    stat = (
        "cpu  10 0 5 100 0 0 0 90 0 0\n"
        "cpu0 1 0 1 50 0 0 0 30 0 0\n"
        "cpu1 9 0 4 50 0 0 0 60 0 0\n"
        "cpu12 9 0 4 50 0 0 0 7 0 0\n"
        "intr 5 1 2\n"
    )
    tick_ms = 1000 / probe().os.sysconf("SC_CLK_TCK")
    assert probe().steal_ms([1, 12], stat) == 67 * tick_ms
    assert probe().steal_ms([0], stat) == 30 * tick_ms
    assert probe().steal_ms([5], stat) == 0  # a core the file does not list


def test_the_cpu_counters_of_this_thread_only_grow() -> None:
    mod = probe()
    before = mod.counters([0])
    for _ in range(200):
        mod.reference()
    after = mod.counters([0])
    assert set(before) == {"steal_ms", "runq_wait_ms", "involuntary_switches"}
    assert all(after[k] >= before[k] for k in before)
