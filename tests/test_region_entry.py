"""scripts/bench/region_entry.py on the simulated GPU: behaviour only (every kind runs, every
region is recorded with the fields it summarises, clean); its figures are the H200's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench" / "region_entry.py"


def _entry(out: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """region_entry.py --sim --json out, with args; its status 0 where `ok`."""
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--sim", "--json", str(out), *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert not ok or p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p


@pytest.mark.slow
def test_region_overhead_by_sibling_kind_on_the_simulated_gpu(tmp_path: Path) -> None:
    out = tmp_path / "entry.json"
    p = _entry(out, "--siblings", "2", "--regions", "4")
    assert "SIMULATED GPU" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["sim"] is True and [k["kind"] for k in doc["kinds"]] == [
        "idle", "launching", "compiling", "memwait"
    ]  # fmt: skip
    for k in doc["kinds"]:
        assert k["regions"] == 4 and k["clean"] == 4, k
        # Launching siblings' turn timed alone first (two 1 ms simulated kernels and a sync):
        # the most work a drain can wait for.
        assert ("turn_ms" in k) == (k["kind"] == "launching"), k
        assert 0 <= k["entry_s"]["p50_ms"] <= k["wait_s"]["p95_ms"] + 1e-6, k
        assert k["freeze_s"]["max_ms"] is not None and k["exit_s"]["max_ms"] is not None
    launching = doc["kinds"][1]
    assert launching["turn_ms"] >= 2.0, launching
    assert launching["queued_most_ms"] == pytest.approx(2 * launching["turn_ms"])
    assert "2 siblings' most queued work" in p.stdout


@pytest.mark.slow
def test_freeze_contexts_leaves_the_compile_workers_running(tmp_path: Path) -> None:
    """--freeze all,contexts: each kind under both settings; the compiling sibling's workers
    (no GPU context) are left running under contexts only, every region clean."""
    out = tmp_path / "entry.json"
    _entry(out, "--kinds", "compiling", "--siblings", "1", "--regions", "3", "--freeze",
           "all,contexts")  # fmt: skip
    kinds = json.loads(out.read_text())["kinds"]
    assert [(k["kind"], k["freeze"]) for k in kinds] == [
        ("compiling", "all"), ("compiling", "contexts")
    ]  # fmt: skip
    for k in kinds:
        assert k["regions"] == 3 and k["clean"] == 3, (k["freeze"], k["problems"])
    assert kinds[0]["awake"] == 0 and kinds[1]["awake"] >= 1, kinds


@pytest.mark.slow
def test_pace_settings_each_run_and_count_the_siblings_turns(tmp_path: Path) -> None:
    """--pace-ms 0,2 (given twice: each runs): the deep kind (launching, synced every 16) under
    each regions.pace_ms, each with its regions clean and the siblings' turns a second counted
    while the owner took them (what pacing costs them; a figure only on a GPU)."""
    out = tmp_path / "entry.json"
    p = _entry(out, "--kinds", "deep", "--siblings", "2", "--regions", "4", "--pace-ms",
               "0,2,2")  # fmt: skip
    kinds = json.loads(out.read_text())["kinds"]
    assert [(k["kind"], k["pace_ms"]) for k in kinds] == [
        ("deep", 0.0), ("deep", 2.0), ("deep", 2.0)
    ]  # fmt: skip
    assert kinds[0]["turn_ms"] >= 16.0, kinds[0]  # 16 kernels of 1 ms simulated
    for k in kinds:
        assert k["regions"] == 4 and k["clean"] == 4, k
        assert k["sibling_turns_per_s"] > 0 and k["sibling_turns_free_per_s"] > 0, k
    assert "pace 2 ms" in p.stdout


def test_a_bad_pace_is_one_error(tmp_path: Path) -> None:
    p = _entry(tmp_path / "e.json", "--pace-ms", "fast", ok=False)
    assert p.returncode == 2 and "--pace-ms 'fast'" in p.stderr, p.stderr
