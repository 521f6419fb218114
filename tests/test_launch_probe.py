"""scripts/bench/launch_probe.py's core sets and summaries, and the CPU slice the GPU scripts
give their daemon (krex.bench.runner.slice_config); the probe itself runs on the GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import load_script

from krex.bench.runner import slice_config
from krex.config import load


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
