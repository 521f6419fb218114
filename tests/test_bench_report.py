"""krex.bench.report: report.md tables, target verdicts, plots, and re-rendering from JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from krex.bench import report
from krex.bench.metrics import (
    GAP_CLASSES,
    Failure,
    Measurement,
    ModeRun,
    RegionTimes,
    difference_interval,
    summarize,
)
from krex.bench.report import (
    NO_MATPLOTLIB,
    PLOTS,
    TargetRow,
    command_records,
    render,
    target_values,
    targets,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

# (task, variant) -> exclusive median (ms). Pairs by exclusive gap: gemm a/b 1 % (<2%), gemm a/c
# and b/c 3.5 % and 2.5 % (2-5%), norm a/b 20 % (>5%). Nothing above 10 ms: that band is empty.
SMALL = {
    ("gemm", "a"): 2.0,
    ("gemm", "b"): 2.02,
    ("gemm", "c"): 2.07,
    ("norm", "a"): 0.5,
    ("norm", "b"): 0.6,
}
# Adds a > 10 ms pair (25 %, >5%) so that every band has commands.
BIG = {**SMALL, ("conv", "a"): 20.0, ("conv", "b"): 25.0}


def run(
    mode: str, base: dict[tuple[str, str], float], wall_s: float, scale: dict[str, float]
) -> ModeRun:
    """`mode`'s run of `base`'s commands, each median times scale[variant key] (default 1).

    krex commands get one region each; the one of norm/a ends uncleanly.
    """
    out = []
    for (task, variant), ms in base.items():
        regions: tuple[RegionTimes, ...] = ()
        region_s = 0.0
        if mode == "krex":
            clean = (task, variant) != ("norm", "a")
            regions = (RegionTimes(0.002, 0.001, 0.0005, 0.01, clean),)
            region_s = 0.01
        factor = scale.get(f"{task}/{variant}", scale.get("*", 1.0))
        out.append(Measurement(task, variant, ms * factor, 1.0, region_s, regions))
    return ModeRun(mode, wall_s, tuple(out))


def results_of(
    base: dict[tuple[str, str], float],
    krex_wall_s: float,
    krex_scale: dict[str, float],
    simulated: bool,
) -> dict[str, Any]:
    """A results.json document of all four modes: summarize() plus commands and run facts."""
    runs = {
        "exclusive": run("exclusive", base, 600.0, {}),
        "native_repeat": run("native_repeat", base, 600.0, {}),
        # Shared is fast and wrong: gemm/a 4 % slower swaps gemm a/b and a/c; the rest 40 % slower
        # but in step, so they keep their order.
        "shared": run("shared", base, 100.0, {"*": 1.4, "gemm/a": 1.04, "gemm/b": 1, "gemm/c": 1}),
        "krex": run("krex", base, krex_wall_s, krex_scale),
    }
    doc: dict[str, Any] = dict(
        summarize(runs, machine="H200 x1", date="2026-01-01", command="krex bench", concurrency=8)
    )
    doc["commands"] = command_records(runs.values())
    doc["simulated"] = simulated
    doc["profile"] = "smoke"
    return doc


def good() -> dict[str, Any]:
    """krex 4x exclusive, every command 0.1 % slower, no flips; no > 10 ms commands."""
    return results_of(SMALL, 150.0, {"*": 1.001}, simulated=True)


def bad() -> dict[str, Any]:
    """krex 2x exclusive, 5 % slower, gemm/b 3 % faster (flips the <2% pair); a real GPU."""
    return results_of(BIG, 300.0, {"*": 1.05, "gemm/b": 0.97}, simulated=False)


SHARED_FAILURES = "no command fails only because it shared (krex)"


def status(rows: list[TargetRow]) -> dict[str, str]:
    """target name -> verdict."""
    return {r["target"]: r["status"] for r in rows}


def section(text: str, title: str) -> str:
    """The body of the report section whose heading starts with `title`."""
    body = text.split(f"## {title}", 1)[1]
    return body.split("\n## ", 1)[0]


def test_targets_met_and_na_for_empty_band() -> None:
    """A good krex run meets every target; the empty > 10 ms band is n/a, not met."""
    assert status(targets(good())) == {
        "throughput ratio vs exclusive": "met",
        "p95 inflation >10ms": "n/a",
        "p95 inflation >10ms vs native_repeat": "n/a",
        "p95 inflation >1ms": "met",
        "p95 inflation >1ms vs native_repeat": "met",
        "p95 inflation >0.1ms": "met",
        "p95 inflation >0.1ms vs native_repeat": "met",
        "flip rate <2% vs native_repeat": "met",
        "flip rate 2-5% vs native_repeat": "met",
        "flip rate >5% vs native_repeat": "met",
        SHARED_FAILURES: "met",
    }


def test_targets_missed() -> None:
    """A slow, inflated krex run misses throughput, every band and the flipped <2% class only."""
    rows = targets(bad())
    assert status(rows) == {
        "throughput ratio vs exclusive": "missed",
        "p95 inflation >10ms": "missed",
        "p95 inflation >10ms vs native_repeat": "missed",
        "p95 inflation >1ms": "missed",
        "p95 inflation >1ms vs native_repeat": "missed",
        "p95 inflation >0.1ms": "missed",
        "p95 inflation >0.1ms vs native_repeat": "missed",
        "flip rate <2% vs native_repeat": "missed",
        "flip rate 2-5% vs native_repeat": "met",
        "flip rate >5% vs native_repeat": "met",
        SHARED_FAILURES: "met",
    }
    by_name = {r["target"]: r for r in rows}
    assert by_name["throughput ratio vs exclusive"]["value"] == pytest.approx(2.0)
    assert by_name["flip rate <2% vs native_repeat"]["value"] == pytest.approx(1.0)


def test_targets_boundaries_and_overrides() -> None:
    """Exactly on a threshold is met despite float noise; results["targets"] overrides it."""
    doc: dict[str, Any] = {
        "throughput_ratio_vs_exclusive": {"krex": 3.4},
        "inflation_p95": {"krex": {">10ms": 1.003 / 1 - 1, ">1ms": 0.0159, ">0.1ms": None}},
        "flip_rate": {"krex": {"<2%": 0.13}, "native_repeat": {"<2%": 0.10}},
    }
    got = status(targets(doc))
    assert got["throughput ratio vs exclusive"] == "met"
    assert got["p95 inflation >10ms"] == "met"
    assert got["p95 inflation >1ms"] == "missed"
    assert got["p95 inflation >0.1ms"] == "n/a"
    assert got["flip rate <2% vs native_repeat"] == "met"
    assert got["flip rate 2-5% vs native_repeat"] == "n/a"
    doc["targets"] = {"throughput_ratio": 3.5, "inflation_p95": {">1ms": 0.02}}
    got = status(targets(doc))
    assert got["throughput ratio vs exclusive"] == "missed"
    assert got["p95 inflation >1ms"] == "met"
    assert target_values(doc)["inflation_p95"][">10ms"] == 0.0030
    with pytest.raises(ValueError, match="throughput_ratio"):
        targets({"targets": {"throughput_ratio": -1}})


def test_excess_over_the_native_repeat_separates_krex_from_the_gpus_noise() -> None:
    """Issue #18: a band the GPU itself moves (native repeat 9 %) misses the paper's figure
    whatever krex does; the excess row judges krex's share: met within 0.3 points of the
    native repeat, missed above; n/a without a native repeat; overridable."""
    doc: dict[str, Any] = {
        "inflation_p95": {
            "krex": {">1ms": 0.0920, ">0.1ms": 0.0100},
            "native_repeat": {">1ms": 0.0900, ">0.1ms": 0.0050},
        }
    }
    rows = {r["target"]: r for r in targets(doc)}
    assert rows["p95 inflation >1ms"]["status"] == "missed"
    assert rows["p95 inflation >1ms vs native_repeat"]["status"] == "met"
    assert rows["p95 inflation >1ms vs native_repeat"]["shown"] == "+0.20 points (9.20 % vs 9.00 %)"
    assert rows["p95 inflation >0.1ms"]["status"] == "met"
    assert rows["p95 inflation >0.1ms vs native_repeat"]["status"] == "missed"  # +0.50 points
    assert rows["p95 inflation >10ms vs native_repeat"]["status"] == "n/a"
    doc["targets"] = {"inflation_excess": 0.006}
    assert status(targets(doc))["p95 inflation >0.1ms vs native_repeat"] == "met"
    del doc["inflation_p95"]["native_repeat"]
    assert status(targets(doc))["p95 inflation >1ms vs native_repeat"] == "n/a"


def test_targets_without_krex_are_na() -> None:
    """Only an exclusive run: every target is n/a."""
    assert set(status(targets({"modes": {"exclusive": {}}})).values()) == {"n/a"}


def test_report_tables_and_simulated_line(tmp_path: Path) -> None:
    """report.md has the run facts, the SIMULATED line and every table with the right cells."""
    paths = render(good(), tmp_path)
    assert paths[0] == tmp_path / "report.md"
    text = paths[0].read_text()
    assert text.startswith("# KREX bench report")
    assert "\nSIMULATED GPU: " in text
    for fact in ("Machine: H200 x1", "Date: 2026-01-01", "`krex bench`", "Profile: smoke"):
        assert fact in text
    assert "Concurrency: 8" in text
    # Throughput: 5 commands in 150 s = 2 cmds/min, 4x the exclusive 0.5; none failed.
    assert "| krex | 5 | 5 | 0 (0) | 0 | 150.0 | 2.00 | 2.00 | 4.00x |" in section(
        text, "Throughput"
    )
    assert "| exclusive | 5 | 5 | 0 (0) | 0 | 600.0 | 0.50 | 0.50 | 1.00x |" in section(
        text, "Throughput"
    )
    assert "none: every command succeeded" in section(text, "Failures")
    inflation = section(text, "Timing inflation")
    assert "| krex | >10ms | n/a | n/a | n/a | 0 |" in inflation
    assert "| krex | >1ms | +0.10 % | 0.10 % | 0.10 % | 3 |" in inflation
    flips = section(text, "Ranking flips")
    assert "| gap class | pairs | native_repeat | shared | krex |" in flips
    # Shared swaps gemm a/b (<2%) and a/c (2-5%) but not b/c.
    assert "| <2% | 1 | 0.00 % (0/1) | 100.00 % (1/1) | 0.00 % (0/1) |" in flips
    assert "| 2-5% | 2 | 0.00 % (0/2) | 50.00 % (1/2) | 0.00 % (0/2) |" in flips
    assert "| krex | 1.000 | 2/2 |" in section(text, "Ranking fidelity")
    # One 10 ms region per 1 s command.
    assert "| krex | 1.00 % |" in section(text, "Region share")
    regions = section(text, "Region times")
    assert "| wait | 2.000 | 2.000 | 2.000 | 5 |" in regions
    assert "| duration | 10.000 | 10.000 | 10.000 | 5 |" in regions
    assert "Unclean regions: 1" in regions
    tgt = section(text, "Targets")
    assert "| p95 inflation >10ms | <= 0.30 % | n/a | n/a |" in tgt
    assert "| p95 inflation >1ms | <= 1.58 % | 0.10 % | met |" in tgt
    assert "4.00x; below aim | met |" in tgt


def test_report_of_missed_targets_on_real_gpu(tmp_path: Path) -> None:
    """A real-GPU run has no SIMULATED line and shows its missed targets."""
    text = render(bad(), tmp_path)[0].read_text()
    assert "SIMULATED" not in text
    tgt = section(text, "Targets")
    assert (
        "| throughput ratio vs exclusive | >= 3.40x (aim 6.00x) | 2.00x; below aim | missed |"
        in tgt
    )
    assert "| p95 inflation >10ms | <= 0.30 % | 5.00 % | missed |" in tgt
    assert "+100.00 points (100.00 % vs 0.00 %; " in tgt and "| missed |" in tgt


def test_flip_targets_say_how_few_pairs_resolve(tmp_path: Path) -> None:
    """With pair counts, a flip target shows the 95 % interval of the difference."""
    doc = bad()
    del doc["flip_rate_pairs_by_mode"]  # as before failures: the exclusive run's counts only
    doc["flip_rate_pairs"] = dict.fromkeys(doc["flip_rate"]["krex"], 4)
    tgt = section(render(doc, tmp_path)[0].read_text(), "Targets")
    assert "+100.00 points (100.00 % vs 0.00 %; 4 pairs, 95 % interval +" in tgt
    del doc["flip_rate_pairs"]
    tgt = section(render(doc, tmp_path)[0].read_text(), "Targets")
    assert "+100.00 points (100.00 % vs 0.00 %) | missed |" in tgt


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
@pytest.mark.parametrize("make", [good, bad], ids=["simulated", "real"])
def test_plots_are_png(tmp_path: Path, make: Any) -> None:
    """With matplotlib, the three plots are written, returned, valid PNGs, and linked."""
    paths = render(make(), tmp_path)
    assert paths == [tmp_path / "report.md", *(tmp_path / p for p in PLOTS)]
    for path in paths[1:]:
        assert path.read_bytes()[:8] == PNG_MAGIC
    text = paths[0].read_text()
    assert all(f"]({p})" in text for p in PLOTS)
    assert "plots skipped" not in text


def test_without_matplotlib_only_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without matplotlib, only report.md is written and it says why the plots are missing."""
    monkeypatch.setattr(report, "_matplotlib", lambda: None)
    paths = render(good(), tmp_path)
    assert paths == [tmp_path / "report.md"]
    assert NO_MATPLOTLIB in paths[0].read_text()
    assert not any((tmp_path / p).exists() for p in PLOTS)


def test_render_from_json_round_trip(tmp_path: Path) -> None:
    """Rendering the parsed JSON gives the same report.md as rendering the dict itself."""
    doc = bad()
    direct = render(doc, tmp_path / "direct")
    parsed = render(json.loads(json.dumps(doc, allow_nan=False)), tmp_path / "parsed")
    assert [p.name for p in direct] == [p.name for p in parsed]
    assert direct[0].read_text() == parsed[0].read_text()


def test_render_tolerates_missing_keys(tmp_path: Path) -> None:
    """A bare document (no commands, no krex) still renders, with n/a and no per-command plots."""
    doc = {"machine": "m", "modes": {"exclusive": {"throughput_cmds_per_min": 1.0}}}
    paths = render(doc, tmp_path)
    text = paths[0].read_text()
    assert "n/a: no krex run." in text
    assert all(g in text for g in GAP_CLASSES)
    assert (tmp_path / PLOTS[1]) not in paths
    with pytest.raises(ValueError, match="mapping"):
        render([], tmp_path)  # type: ignore[arg-type]


# --- failures ------------------------------------------------------------------------------------


def with_failures() -> dict[str, Any]:
    """SMALL plus gemm/d, which fails everywhere (alone); krex and krex-cold also lose norm/b to
    an out-of-memory error it has only when shared (krex after one earlier attempt)."""
    alone = Failure("gemm", "d", 1, False, "ValueError: | bad shape", 0.5)

    def mode(name: str, wall_s: float, shared_oom: bool) -> ModeRun:
        measured = run(name, SMALL, wall_s, {}).measurements
        failed = [alone]
        if shared_oom:
            measured = tuple(m for m in measured if m.key != ("norm", "b"))
            attempts = 1 if name == "krex" else 0
            failed.append(
                Failure("norm", "b", None if attempts else 1, True, "CUDA out of memory", 3.0,
                        attempts)
            )  # fmt: skip
        return ModeRun(name, wall_s, measured, tuple(failed))

    runs = {
        "exclusive": mode("exclusive", 600.0, False),
        "native_repeat": mode("native_repeat", 600.0, False),
        "krex": mode("krex", 150.0, True),
        "krex-cold": mode("krex-cold", 200.0, True),
    }
    doc: dict[str, Any] = dict(
        summarize(runs, machine="m", date="d", command="krex bench", concurrency=8)
    )
    doc["commands"] = command_records(runs.values())
    return doc


def test_throughput_table_shows_failures_and_both_rates(tmp_path: Path) -> None:
    """krex: 6 tried, 4 succeeded, 2 failed (1 out of memory, 1 only when shared); 4 and 6 in
    150 s are 1.60 and 2.40 cmds/min, 3.20x the exclusive 0.50 (5 of 6 in 600 s)."""
    text = render(with_failures(), tmp_path)[0].read_text()
    table = section(text, "Throughput")
    assert "| krex | 6 | 4 | 2 (1) | 1 | 150.0 | 1.60 | 2.40 | 3.20x |" in table
    assert "| exclusive | 6 | 5 | 1 (0) | 0 | 600.0 | 0.50 | 0.60 | 1.00x |" in table


def test_failures_section_lists_each_failed_command(tmp_path: Path) -> None:
    """Every failure is a row: mode, command, status (a time-out as such), out of memory, only
    when shared, earlier attempts and reason (a | in it escaped)."""
    text = section(render(with_failures(), tmp_path)[0].read_text(), "Failures")
    assert "| krex | norm/b | time-out | yes | yes | 1 | CUDA out of memory |" in text
    assert "| krex-cold | norm/b | 1 | yes | yes | 0 | CUDA out of memory |" in text
    assert "| exclusive | gemm/d | 1 | no | no | 0 | ValueError: \\| bad shape |" in text
    assert text.count("gemm/d") == 4


def test_shared_failure_target_missed_in_any_krex_mode() -> None:
    """A command that failed only when shared in krex or krex-cold misses the target, and the
    measured value counts them over the krex modes present."""
    rows = {r["target"]: r for r in targets(with_failures())}
    row = rows[SHARED_FAILURES]
    assert row["status"] == "missed"
    assert row["value"] == 2.0
    assert row["shown"] == "krex 1, krex-cold 1"


def test_shared_failure_target_met_and_na() -> None:
    """Met when every krex mode present has none (failures alone do not count); n/a without a
    krex mode, or where the results do not count failures (an older results.json)."""
    doc = with_failures()
    for m in ("krex", "krex-cold"):
        doc["modes"][m]["failed_only_when_shared"] = 0
    assert status(targets(doc))[SHARED_FAILURES] == "met"
    only_cold = {"modes": {"exclusive": {}, "krex-cold": {"failed_only_when_shared": 0}}}
    assert status(targets(only_cold))[SHARED_FAILURES] == "met"
    assert status(targets({"modes": {"exclusive": {}, "shared": {}}}))[SHARED_FAILURES] == "n/a"
    assert status(targets({"modes": {"exclusive": {}, "krex": {}}}))[SHARED_FAILURES] == "n/a"


def test_flip_cells_use_each_modes_own_pair_count(tmp_path: Path) -> None:
    """The pairs column keeps the exclusive run's count; a mode's cell counts its own pairs:
    krex lost norm/b, so its >5% class has no pair and no rate."""
    doc = with_failures()
    flips = section(render(doc, tmp_path)[0].read_text(), "Ranking flips")
    # Exclusive: norm a/b is the one >5% pair; krex lost norm/b, so it has none there.
    assert doc["flip_rate_pairs"][">5%"] == 1
    assert doc["flip_rate_pairs_by_mode"]["krex"][">5%"] == 0
    assert "| >5% | 1 | 0.00 % (0/1) | n/a | n/a |" in flips


def test_flip_target_interval_uses_each_modes_pairs() -> None:
    """krex compared fewer pairs than native_repeat (a candidate failed): the interval is of
    1/2 against 0/4, and says so."""
    doc: dict[str, Any] = {
        "flip_rate": {"krex": {"<2%": 0.5}, "native_repeat": {"<2%": 0.0}},
        "flip_rate_pairs": {"<2%": 4},
        "flip_rate_pairs_by_mode": {"krex": {"<2%": 2}, "native_repeat": {"<2%": 4}},
    }
    row = {r["target"]: r for r in targets(doc)}["flip rate <2% vs native_repeat"]
    lo, hi = difference_interval(1, 2, 0, 4)
    assert (
        f"; 2 and 4 pairs, 95 % interval {lo * 100:+.0f} to {hi * 100:+.0f} points)"
        in (row["shown"])
    )


def test_old_results_without_failure_keys_render_na(tmp_path: Path) -> None:
    """A results.json from before failures were counted renders: the new columns are n/a, the
    Failures section says they are not recorded, and the failure target is n/a."""
    doc = good()
    for m in doc["modes"].values():
        for key in [k for k in m if k not in ("throughput_cmds_per_min", "wall_s", "commands")]:
            del m[key]
    for key in ("failures", "throughput_ratio_all_vs_exclusive", "flip_rate_pairs_by_mode"):
        del doc[key]
    text = render(json.loads(json.dumps(doc)), tmp_path)[0].read_text()
    assert "| krex | 5 | n/a | n/a | n/a | 150.0 | 2.00 | n/a | 4.00x |" in section(
        text, "Throughput"
    )
    assert "n/a: these results do not record failures." in section(text, "Failures")
    assert f"| {SHARED_FAILURES} | 0 failed only when shared | n/a | n/a |" in text
    assert "| <2% | 1 | 0.00 % (0/1) | 100.00 % (1/1) | 0.00 % (0/1) |" in text


def test_memory_waits_section(tmp_path: Path) -> None:
    """Per mode with krex reports: p50/p95/max of the memory wait in s, and how many commands."""
    doc = good()
    doc["modes"]["krex"]["memory_wait_s"] = {"p50": 0.25, "p95": 1.5, "max": 2.0, "n": 5}
    text = section(render(doc, tmp_path)[0].read_text(), "Memory waits")
    assert "| krex | 0.250 | 1.500 | 2.000 | 5 |" in text
    assert "| exclusive |" not in text
    assert "n/a: no krex report" in section(render(good(), tmp_path)[0].read_text(), "Memory")


def test_choices_section_sets_each_modes_winner_against_exclusive(tmp_path: Path) -> None:
    """Candidates that report what their autotuner picked get a table: `same`, or the other
    mode's own choice, with that mode's timing against exclusive's (none without a median); a
    run where none reports one has no such section."""
    assert "Autotuners' choices" not in render(good(), tmp_path)[0].read_text()
    doc = good()
    picks = {"exclusive": "BM: 128", "native_repeat": "BM: 128", "shared": "BM: 64",
             "krex": "BM: 128"}  # fmt: skip
    for rec in doc["commands"]:
        if (rec["task"], rec["variant"]) == ("gemm", "a"):
            rec["output"] = {"choice": picks[rec["mode"]]}
        elif (rec["task"], rec["variant"]) == ("gemm", "b") and rec["mode"] != "krex":
            rec["output"] = {"choice": "w8"}  # krex's run said nothing: n/a, not counted
            if rec["mode"] == "shared":
                rec["median_ms"] = None
    text = section(render(doc, tmp_path)[0].read_text(), "Autotuners' choices")
    assert "| command | exclusive | native_repeat | shared | krex |" in text
    # the fixture's shared run of gemm/a is 4 % slow, krex's every command 0.1 %
    assert "| gemm/a | BM: 128 | same (+0.00 %) | BM: 64 (+4.00 %) | same (+0.10 %) |" in text
    assert "| gemm/b | w8 | same (+0.00 %) | same | n/a |" in text
    assert "native_repeat 2 of 2, shared 1 of 2, krex 1 of 1" in text
