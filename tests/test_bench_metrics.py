"""krex.bench.metrics: hand-computed examples for every metric, properties, bad input, summarize."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from krex.bench.metrics import (
    BANDS,
    GAP_CLASSES,
    Failure,
    Measurement,
    ModeRun,
    RegionTimes,
    difference_interval,
    flip_rate,
    gap_class,
    inflation,
    inflation_percentiles,
    kendall_tau,
    kendall_tau_median,
    kendall_tau_per_task,
    memory_wait_stats,
    only_when_shared,
    quantile,
    region_share_median,
    region_time_stats,
    summarize,
    throughput_all_cmds_per_min,
    throughput_cmds_per_min,
    wilson_interval,
)

Medians = dict[tuple[str, str], float]

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def run_of(mode: str, medians: Medians, wall_s: float = 60.0) -> ModeRun:
    """A run of `mode` with the given (task, variant) -> median_ms and 1 s per command."""
    return ModeRun(
        mode, wall_s, tuple(Measurement(t, v, ms, 1.0) for (t, v), ms in medians.items())
    )


def failure(task: str, variant: str, oom: bool = False, status: int | None = 1) -> Failure:
    """A failed command: `status`, out of memory or not, 2 s of wall."""
    return Failure(task, variant, status, oom, "RuntimeError: boom", 2.0)


def run_with_failures(
    mode: str, medians: Medians, failed: list[Failure], wall_s: float = 60.0
) -> ModeRun:
    """`run_of(mode, medians)` with `failed` added as its failures."""
    return ModeRun(mode, wall_s, run_of(mode, medians).measurements, tuple(failed))


def region(wait_s: float = 0.0, clean: bool = True) -> RegionTimes:
    """A region with the given wait, small drain and freeze, and a 0.1 s duration."""
    return RegionTimes(wait_s=wait_s, drain_s=0.001, freeze_s=0.002, duration_s=0.1, clean=clean)


def reference_quantile(values: list[float], q: float) -> float:
    """Textbook linear interpolation between order statistics, written apart from the module's."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    below = int(pos)
    if below == len(s) - 1:
        return s[below]
    return s[below] + (s[below + 1] - s[below]) * (pos - below)


# --- the model ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Measurement("t", "v", float("nan"), 1.0),
        lambda: Measurement("t", "v", 0.0, 1.0),
        lambda: Measurement("t", "v", -1.0, 1.0),
        lambda: Measurement("t", "v", 1.0, -1.0),
        lambda: Measurement("t", "v", 1.0, float("inf")),
        lambda: Measurement("t", "v", 1.0, 1.0, region_s=float("nan")),
        lambda: Measurement("", "v", 1.0, 1.0),
        lambda: RegionTimes(-0.1, 0.0, 0.0, 0.0, True),
        lambda: RegionTimes(0.0, float("nan"), 0.0, 0.0, True),
        lambda: ModeRun("krex", 1.0, ()),
        lambda: ModeRun("krex", 0.0, (Measurement("t", "v", 1.0, 1.0),)),
        lambda: ModeRun("turbo", 1.0, (Measurement("t", "v", 1.0, 1.0),)),
        lambda: ModeRun("krex", 1.0, (Measurement("t", "v", 1.0, 1.0),) * 2),
    ],
    ids=[
        "nan-median",
        "zero-median",
        "negative-median",
        "negative-wall",
        "infinite-wall",
        "nan-region-s",
        "empty-task",
        "negative-wait",
        "nan-drain",
        "empty-run",
        "zero-run-wall",
        "unknown-mode",
        "repeated-command",
    ],
)
def test_bad_model_input_raises(make: Callable[[], object]) -> None:
    """NaN, non-positive medians, negative times, empty runs and repeats are ValueErrors."""
    with pytest.raises(ValueError, match=r"\.$"):
        make()


def test_measurement_stores_regions_as_a_tuple() -> None:
    """A list of regions is stored as a tuple, so the frozen measurement stays immutable."""
    m = Measurement("t", "v", 1.0, 1.0, 0.1, [region()])  # type: ignore[arg-type]
    assert isinstance(m.regions, tuple)
    assert m.key == ("t", "v")


# --- throughput and inflation ------------------------------------------------------------------


def test_throughput_is_commands_per_minute() -> None:
    """3 commands in 90 s is 2 commands a minute."""
    run = run_of("krex", {("a", "1"): 1.0, ("a", "2"): 1.0, ("b", "1"): 1.0}, wall_s=90.0)
    assert throughput_cmds_per_min(run) == pytest.approx(2.0)


def test_inflation_is_measured_over_baseline_minus_one() -> None:
    """2.02 ms over 2 ms is +1 %; 0.97 ms over 1 ms is -3 %."""
    base = run_of("exclusive", {("a", "1"): 2.0, ("a", "2"): 1.0})
    run = run_of("krex", {("a", "1"): 2.02, ("a", "2"): 0.97})
    got = inflation(run, base)
    assert got == pytest.approx({("a", "1"): 0.01, ("a", "2"): -0.03})


@pytest.mark.parametrize(
    "medians",
    [{("a", "1"): 1.0, ("a", "2"): 2.0, ("a", "3"): 3.0}, {("a", "1"): 1.0}],
    ids=["extra-command", "missing-command"],
)
def test_mismatched_commands_raise(medians: Medians) -> None:
    """Every comparison of two runs refuses runs that measure different commands."""
    base = run_of("exclusive", {("a", "1"): 1.0, ("a", "2"): 2.0})
    run = run_of("krex", medians)
    for compare in (
        lambda: inflation(run, base),
        lambda: inflation_percentiles(run, base),
        lambda: flip_rate(run, base, base),
        lambda: kendall_tau_per_task(run, base),
        lambda: summarize(
            {"exclusive": base, "krex": run}, machine="m", date="d", command="c", concurrency=8
        ),
    ):
        with pytest.raises(ValueError, match="different commands"):
            compare()


def test_inflation_percentiles_by_band_hand_computed() -> None:
    """Bands by baseline median; p50 of signed inflation, p95/p99 of its absolute value."""
    base = run_of(
        "exclusive", {("t", "big"): 20.0, ("t", "mid"): 5.0, ("t", "small"): 0.5, ("t", "x"): 0.05}
    )
    run = run_of(
        "krex", {("t", "big"): 20.2, ("t", "mid"): 4.85, ("t", "small"): 0.55, ("t", "x"): 0.075}
    )
    got = inflation_percentiles(run, base)
    # >10ms: {+1 %}.
    assert got[">10ms"] == pytest.approx({"p50": 0.01, "p95": 0.01, "p99": 0.01, "n": 1})
    # >1ms: {+1 %, -3 %}: signed median -1 %; |.| = {1, 3} %: p95 = 1 + 0.95 * 2 (in %).
    assert got[">1ms"] == pytest.approx({"p50": -0.01, "p95": 0.029, "p99": 0.0298, "n": 2})
    # >0.1ms: {+1, -3, +10} %: signed median +1 %; |.| sorted {1, 3, 10}: p95 at 1.9 -> 3 + 0.9 * 7.
    assert got[">0.1ms"] == pytest.approx({"p50": 0.01, "p95": 0.093, "p99": 0.0986, "n": 3})


def test_inflation_percentiles_empty_band_is_none() -> None:
    """A band without commands reports None percentiles and n = 0."""
    base = run_of("exclusive", {("t", "v"): 0.05})
    got = inflation_percentiles(run_of("krex", {("t", "v"): 0.06}), base)
    for band in BANDS:
        assert got[band] == {"p50": None, "p95": None, "p99": None, "n": 0}


def test_band_threshold_is_strict_and_by_baseline() -> None:
    """A 10 ms baseline kernel is not in >10ms even when measured at 30 ms; it is in >1ms."""
    base = run_of("exclusive", {("t", "v"): 10.0})
    got = inflation_percentiles(run_of("krex", {("t", "v"): 30.0}), base)
    assert got[">10ms"]["n"] == 0
    assert got[">1ms"]["n"] == 1
    assert got[">1ms"]["p95"] == pytest.approx(2.0)


@given(st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=20))
def test_bands_are_nested(medians: list[float]) -> None:
    """Every band holds all commands of the narrower band: n(>10ms) <= n(>1ms) <= n(>0.1ms)."""
    base = run_of("exclusive", {("t", str(i)): ms for i, ms in enumerate(medians)})
    got = inflation_percentiles(base, base)
    counts = [got[band]["n"] for band in (">10ms", ">1ms", ">0.1ms")]
    assert counts == sorted(counts)
    assert counts == [sum(ms > t for ms in medians) for t in (10.0, 1.0, 0.1)]


# --- quantiles ---------------------------------------------------------------------------------


def test_quantile_hand_computed() -> None:
    """numpy's 'linear' values: quantile([1, 2, 3, 4]) is 2.5 at 0.5 and 3.85 at 0.95."""
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.95) == pytest.approx(3.85)
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.0) == 1.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0
    assert quantile([7.0], 0.99) == 7.0


@given(st.lists(finite, min_size=2, max_size=30), st.integers(min_value=1, max_value=99))
def test_quantile_matches_statistics_inclusive(values: list[float], pct: int) -> None:
    """Agrees with statistics.quantiles(method='inclusive') (numpy 'linear') at each percentile."""
    expected = statistics.quantiles(values, n=100, method="inclusive")[pct - 1]
    assert quantile(values, pct / 100) == pytest.approx(expected, rel=1e-9, abs=1e-6)


@given(st.lists(finite, min_size=1, max_size=30), st.floats(min_value=0.0, max_value=1.0))
def test_quantile_matches_reference_and_stays_in_range(values: list[float], q: float) -> None:
    """Agrees with a plain sorted-list interpolation and lies between min and max."""
    got = quantile(values, q)
    assert got == pytest.approx(reference_quantile(values, q), rel=1e-9, abs=1e-6)
    assert min(values) <= got <= max(values)


@pytest.mark.parametrize(
    ("values", "q"),
    [([], 0.5), ([1.0, math.nan], 0.5), ([1.0, math.inf], 0.5), ([1.0], 1.5), ([1.0], -0.1)],
    ids=["empty", "nan", "inf", "q-above-1", "q-below-0"],
)
def test_quantile_bad_input_raises(values: list[float], q: float) -> None:
    """No values, a NaN or infinity, or q outside [0, 1] is a ValueError."""
    with pytest.raises(ValueError):
        quantile(values, q)


# --- flips -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "cls"),
    [
        (100.0, 101.9, "<2%"),
        (100.0, 102.0, "2-5%"),
        (102.0, 100.0, "2-5%"),
        (100.0, 105.0, "2-5%"),
        (100.0, 105.1, ">5%"),
        (1.0, 1.0, "<2%"),
    ],
)
def test_gap_class_boundaries(a: float, b: float, cls: str) -> None:
    """Gap |a - b| / min(a, b): 2 % and 5 % both fall in 2-5 %; the order of a and b is moot."""
    assert gap_class(a, b) == cls


def test_flip_rate_three_variants_one_flip_at_3_percent() -> None:
    """Of a (1.00), b (1.03), c (1.20), only the 3 % pair a/b swaps: 1/1 in 2-5 %, 0/2 in >5 %."""
    excl = run_of("exclusive", {("s", "a"): 1.00, ("s", "b"): 1.03, ("s", "c"): 1.20})
    run = run_of("shared", {("s", "a"): 1.04, ("s", "b"): 1.02, ("s", "c"): 1.30})
    got = flip_rate(run, excl, excl)
    assert got["<2%"] == {"rate": None, "pairs": 0, "flips": 0}
    assert got["2-5%"] == {"rate": 1.0, "pairs": 1, "flips": 1}
    assert got[">5%"] == {"rate": 0.0, "pairs": 2, "flips": 0}


def test_flip_rate_ties() -> None:
    """A tie on one side only is a flip; a tie on both sides is not."""
    medians: Medians = {("t", "a"): 1.0, ("t", "b"): 1.0, ("u", "a"): 1.0, ("u", "b"): 1.01}
    excl = run_of("exclusive", medians)
    # t: tied in both -> no flip. u: ordered in the reference, tied in the run -> flip.
    run = run_of("krex", {("t", "a"): 2.0, ("t", "b"): 2.0, ("u", "a"): 1.0, ("u", "b"): 1.0})
    assert flip_rate(run, excl, excl)["<2%"] == {"rate": 0.5, "pairs": 2, "flips": 1}


def test_flip_rate_pairs_stay_within_a_task() -> None:
    """Variants of different tasks are never paired, however the medians compare."""
    excl = run_of("exclusive", {("t", "a"): 1.0, ("u", "a"): 2.0})
    run = run_of("krex", {("t", "a"): 3.0, ("u", "a"): 1.0})
    assert all(s["pairs"] == 0 and s["rate"] is None for s in flip_rate(run, excl, excl).values())


def test_flip_rate_class_from_order_by_order_from_reference() -> None:
    """The gap class comes from `order_by`; the order checked is the reference's, not order_by's."""
    order_by = run_of("exclusive", {("t", "a"): 1.0, ("t", "b"): 1.10})  # 10 % gap: >5%
    reference = run_of("native_repeat", {("t", "a"): 1.01, ("t", "b"): 1.0})  # reversed, 1 %
    agrees = run_of("krex", {("t", "a"): 2.0, ("t", "b"): 1.5})
    got = flip_rate(agrees, reference, order_by)
    assert got[">5%"] == {"rate": 0.0, "pairs": 1, "flips": 0}
    assert got["<2%"]["pairs"] == 0
    assert flip_rate(order_by, reference, order_by)[">5%"]["flips"] == 1


# --- Kendall tau -------------------------------------------------------------------------------


def test_kendall_tau_known_values() -> None:
    """Perfect order 1, reversed -1, one swap of four 4/6, one x-tie 5/sqrt(30) (scipy's tau-b)."""
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.6667, abs=1e-4)
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))
    # A tie on each side, in different pairs: nc = 4, nd = 0, n1 = n2 = 1 of 6 pairs -> 4 / 5.
    assert kendall_tau([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8)
    # The same tie on both sides is no discordance: a tied sequence against itself is 1.
    assert kendall_tau([1, 2, 2, 3], [1, 2, 2, 3]) == 1.0


def test_kendall_tau_undefined_is_none() -> None:
    """Fewer than 2 items, or one side all tied, has no tau."""
    assert kendall_tau([], []) is None
    assert kendall_tau([1.0], [2.0]) is None
    assert kendall_tau([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


@pytest.mark.parametrize(
    ("xs", "ys"),
    [([1.0, 2.0], [1.0]), ([1.0, math.nan], [1.0, 2.0]), ([1.0, 2.0], [math.inf, 2.0])],
    ids=["lengths", "nan", "inf"],
)
def test_kendall_tau_bad_input_raises(xs: list[float], ys: list[float]) -> None:
    """Unpaired sequences and NaN or infinite values are ValueErrors."""
    with pytest.raises(ValueError):
        kendall_tau(xs, ys)


distinct = st.lists(finite, min_size=2, max_size=15, unique=True)


@given(distinct)
def test_kendall_tau_identity_and_reversal(xs: list[float]) -> None:
    """tau(xs, xs) = 1 and tau(xs, reversed order) = -1 for distinct values."""
    assert kendall_tau(xs, xs) == 1.0
    assert kendall_tau(xs, [-x for x in xs]) == -1.0


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=2, max_size=15))
def test_kendall_tau_symmetric_and_bounded(pairs: list[tuple[int, int]]) -> None:
    """tau(xs, ys) = tau(ys, xs), and a defined tau lies in [-1, 1]."""
    xs = [float(x) for x, _ in pairs]
    ys = [float(y) for _, y in pairs]
    tau = kendall_tau(xs, ys)
    assert tau == kendall_tau(ys, xs)
    if tau is not None:
        assert -1.0 <= tau <= 1.0


def test_kendall_tau_per_task_and_median() -> None:
    """Per task against the baseline (1, -1, None for one variant); median over defined ones."""
    base = run_of(
        "exclusive",
        {
            ("up", "a"): 1.0,
            ("up", "b"): 2.0,
            ("up", "c"): 3.0,
            ("down", "a"): 1.0,
            ("down", "b"): 2.0,
            ("solo", "a"): 1.0,
        },
    )
    run = run_of(
        "shared",
        {
            ("up", "a"): 1.5,
            ("up", "b"): 2.5,
            ("up", "c"): 9.0,
            ("down", "a"): 3.0,
            ("down", "b"): 2.0,
            ("solo", "a"): 4.0,
        },
    )
    assert kendall_tau_per_task(run, base) == {"down": -1.0, "solo": None, "up": 1.0}
    assert kendall_tau_median(run, base) == 0.0
    solo = run_of("exclusive", {("solo", "a"): 1.0})
    assert kendall_tau_median(solo, solo) is None


# --- regions -----------------------------------------------------------------------------------


def test_region_share_median_hand_computed() -> None:
    """Shares 0.1, 0.2 and 0 (no regions) have median 0.1; a 0 s wall time is left out."""
    run = ModeRun(
        "krex",
        10.0,
        (
            Measurement("t", "a", 1.0, 2.0, region_s=0.2),
            Measurement("t", "b", 1.0, 1.0, region_s=0.2),
            Measurement("t", "c", 1.0, 4.0),
            Measurement("t", "d", 1.0, 0.0, region_s=0.5),
        ),
    )
    assert region_share_median(run) == pytest.approx(0.1)


def test_region_share_median_none_without_regions() -> None:
    """A run where no command had regions has no region share."""
    assert region_share_median(run_of("exclusive", {("t", "a"): 1.0})) is None


def test_region_time_stats_hand_computed() -> None:
    """Waits 0.1, 0.2, 0.3: p50 0.2, p95 0.29, max 0.3, n 3; one unclean region of three."""
    run = ModeRun(
        "krex",
        10.0,
        (
            Measurement("t", "a", 1.0, 2.0, 0.2, (region(0.3), region(0.1, clean=False))),
            Measurement("t", "b", 1.0, 2.0, 0.1, (region(0.2),)),
            Measurement("t", "c", 1.0, 2.0),
        ),
    )
    got = region_time_stats(run)
    assert got["wait_s"] == pytest.approx({"p50": 0.2, "p95": 0.29, "max": 0.3, "n": 3})
    assert got["duration_s"] == pytest.approx({"p50": 0.1, "p95": 0.1, "max": 0.1, "n": 3})
    assert got["drain_s"]["max"] == pytest.approx(0.001)
    assert got["freeze_s"]["n"] == 3
    assert got["unclean"] == 1
    assert got["warnings"] == {}


def test_region_warnings_are_counted_by_name() -> None:
    """Each region's warnings are counted by name over the run."""
    warned = RegionTimes(0.0, 0.0, 0.0, 0.1, True, ("gpu_capped", "memory_placement"))
    run = ModeRun(
        "krex",
        10.0,
        (
            Measurement("t", "a", 1.0, 2.0, 0.2, (warned, region())),
            Measurement(
                "t", "b", 1.0, 2.0, 0.1, (RegionTimes(0, 0, 0, 0.1, True, ("gpu_capped",)),)
            ),
        ),
    )
    assert region_time_stats(run)["warnings"] == {"gpu_capped": 2, "memory_placement": 1}


def test_region_time_stats_without_regions() -> None:
    """No regions: every statistic None, n 0, nothing unclean."""
    got = region_time_stats(run_of("exclusive", {("t", "a"): 1.0}))
    for field in ("wait_s", "drain_s", "freeze_s", "duration_s"):
        assert got[field] == {"p50": None, "p95": None, "max": None, "n": 0}
    assert got["unclean"] == 0


# --- summarize ---------------------------------------------------------------------------------


def four_modes() -> dict[str, ModeRun]:
    """A suite of two tasks run in all four modes, with regions timed in the krex mode."""
    excl: Medians = {("s", "a"): 20.0, ("s", "b"): 20.5, ("s", "c"): 30.0, ("m", "a"): 0.5}
    runs = {
        "exclusive": run_of("exclusive", excl, wall_s=120.0),
        "native_repeat": run_of("native_repeat", {k: v * 1.01 for k, v in excl.items()}, 120.0),
        "shared": run_of("shared", {**excl, ("s", "a"): 21.0, ("m", "a"): 0.9}, wall_s=30.0),
    }
    runs["krex"] = ModeRun(
        "krex",
        40.0,
        tuple(
            Measurement(t, v, ms, 2.0, 0.2, (region(0.05), region(0.01)))
            for (t, v), ms in excl.items()
        ),
    )
    return runs


def test_summarize_has_every_required_key_and_is_json() -> None:
    """results.json keys and types for all four modes; json.dumps accepts it; values add up."""
    runs = four_modes()
    res = summarize(runs, machine="H200", date="2026-01-01", command="krex bench", concurrency=8)
    doc = json.loads(json.dumps(res, allow_nan=False))
    assert (doc["machine"], doc["date"], doc["command"], doc["concurrency"]) == (
        "H200",
        "2026-01-01",
        "krex bench",
        8,
    )
    modes = ["exclusive", "native_repeat", "shared", "krex"]
    assert list(doc["modes"]) == modes
    for mode in modes:
        assert isinstance(doc["modes"][mode]["throughput_cmds_per_min"], float)
        assert isinstance(doc["throughput_ratio_vs_exclusive"][mode], float)
        assert set(doc["inflation_p95"][mode]) == {">10ms", ">1ms", ">0.1ms"}
        assert all(isinstance(v, float) for v in doc["inflation_p95"][mode].values())
        assert isinstance(doc["kendall_tau_median"][mode], float)
    assert set(doc["flip_rate"]) == {"native_repeat", "shared", "krex"}
    for classes in doc["flip_rate"].values():
        assert set(classes) == set(GAP_CLASSES)
    assert doc["throughput_ratio_vs_exclusive"]["exclusive"] == 1.0
    assert doc["throughput_ratio_vs_exclusive"]["krex"] == pytest.approx(3.0)
    assert doc["modes"]["krex"]["throughput_cmds_per_min"] == pytest.approx(6.0)
    # s/a vs s/b (2.5 %) swaps in the shared run only; the other two s pairs are > 5 %.
    assert doc["flip_rate_pairs"] == {"<2%": 0, "2-5%": 1, ">5%": 2}
    assert doc["flip_rate"]["shared"] == {"<2%": None, "2-5%": 1.0, ">5%": 0.0}
    assert doc["flip_rate"]["krex"] == {"<2%": None, "2-5%": 0.0, ">5%": 0.0}
    # Shared |inflation| sorted {0, 0, 5 %, 80 %}: p95 at index 2.85.
    assert doc["inflation_p95"]["shared"][">0.1ms"] == pytest.approx(0.05 + 0.85 * 0.75)
    assert doc["region_share_median"] == pytest.approx(0.1)
    assert doc["region_share_median_by_mode"]["exclusive"] is None
    assert doc["region_times"]["krex"]["wait_s"]["n"] == 8


def test_summarize_without_krex_has_no_region_share() -> None:
    """Only the exclusive run: ratio 1, zero inflation, no flip rates, no region share."""
    runs = {"exclusive": four_modes()["exclusive"]}
    res = summarize(runs, machine="m", date="d", command="c", concurrency=1)
    assert res["throughput_ratio_vs_exclusive"] == {"exclusive": 1.0}
    assert res["inflation_p95"]["exclusive"] == {">10ms": 0.0, ">1ms": 0.0, ">0.1ms": 0.0}
    assert res["flip_rate"] == {}
    assert res["region_share_median"] is None


@pytest.mark.parametrize(
    ("drop", "rename", "concurrency", "match"),
    [
        ("exclusive", None, 8, "exclusive"),
        (None, "shared", 8, "holds the results"),
        (None, None, 0, "concurrency"),
    ],
    ids=["no-exclusive", "key-not-mode", "zero-concurrency"],
)
def test_summarize_bad_input_raises(
    drop: str | None, rename: str | None, concurrency: int, match: str
) -> None:
    """A missing baseline, a key naming another mode, or concurrency below 1 is a ValueError."""
    runs = four_modes()
    if drop:
        del runs[drop]
    if rename:
        runs["krex-serial"] = runs.pop(rename)
    with pytest.raises(ValueError, match=match):
        summarize(runs, machine="m", date="d", command="c", concurrency=concurrency)


def test_wilson_and_newcombe_intervals_match_published_values() -> None:
    """Newcombe (1998), Stat. Med. 17: 873-890: Wilson 81/263 is 0.2553-0.3662; the difference
    56/70 - 48/80 by the hybrid score method is 0.0524-0.3339."""
    lo, hi = wilson_interval(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    lo, hi = difference_interval(56, 70, 48, 80)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


@given(st.integers(0, 40), st.integers(1, 40), st.integers(0, 40), st.integers(1, 40))
def test_difference_interval_holds_the_difference(k1: int, n1: int, k2: int, n2: int) -> None:
    k1, k2 = min(k1, n1), min(k2, n2)
    lo, hi = difference_interval(k1, n1, k2, n2)
    assert -1.0 - 1e-12 <= lo <= k1 / n1 - k2 / n2 <= hi <= 1.0 + 1e-12


# --- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Failure("", "v", 1, False, "r", 1.0),
        lambda: Failure("t", "v", True, False, "r", 1.0),
        lambda: Failure("t", "v", 1.5, False, "r", 1.0),  # type: ignore[arg-type]
        lambda: Failure("t", "v", 1, 1, "r", 1.0),  # type: ignore[arg-type]
        lambda: Failure("t", "v", 1, False, None, 1.0),  # type: ignore[arg-type]
        lambda: Failure("t", "v", 1, False, "r", -1.0),
        lambda: Failure("t", "v", 1, False, "r", float("nan")),
        lambda: Failure("t", "v", 1, False, "r", 1.0, attempts=-1),
        lambda: Failure("t", "v", 1, False, "r", 1.0, attempts=True),
        lambda: ModeRun("krex", 1.0, (Measurement("t", "v", 1.0, 1.0),), (failure("t", "v"),)),
        lambda: ModeRun("krex", 1.0, (), (failure("t", "v"),) * 2),
        lambda: ModeRun("krex", 1.0, (), (Measurement("t", "v", 1.0, 1.0),)),  # type: ignore[arg-type]
        lambda: Measurement("t", "v", 1.0, 1.0, memory_wait_s=-0.5),
    ],
    ids=[
        "empty-task",
        "bool-status",
        "float-status",
        "int-oom",
        "no-reason",
        "negative-wall",
        "nan-wall",
        "negative-attempts",
        "bool-attempts",
        "measured-and-failed",
        "failed-twice",
        "measurement-as-failure",
        "negative-memory-wait",
    ],
)
def test_bad_failure_input_raises(make: Callable[[], object]) -> None:
    """Failures are validated like measurements, and a command is in a run at most once."""
    with pytest.raises(ValueError, match=r"\.$"):
        make()


def test_a_run_of_failures_only_is_a_run() -> None:
    """A mode in which every command failed is a valid run; a time-out's status is None."""
    run = ModeRun("krex", 10.0, (), (failure("t", "a", status=None),))
    assert run.measurements == () and run.failures[0].status is None
    assert run.attempted() == {("t", "a")}


def test_comparisons_use_commands_that_succeeded_in_both() -> None:
    """A command that failed on either side is left out of inflation, not an error."""
    base = run_with_failures("exclusive", {("a", "1"): 2.0, ("a", "2"): 1.0}, [failure("a", "3")])
    run = run_with_failures(
        "krex", {("a", "1"): 2.02, ("a", "3"): 5.0}, [failure("a", "2", oom=True)]
    )
    assert inflation(run, base) == pytest.approx({("a", "1"): 0.01})
    assert inflation_percentiles(run, base)[">1ms"]["n"] == 1


def test_different_attempted_commands_still_raise() -> None:
    """Runs that tried different commands are refused even when the extra one failed."""
    base = run_of("exclusive", {("a", "1"): 1.0, ("a", "2"): 2.0})
    run = run_with_failures("krex", {("a", "1"): 1.0, ("a", "2"): 2.0}, [failure("a", "3")])
    with pytest.raises(ValueError, match="different commands"):
        inflation(run, base)
    with pytest.raises(ValueError, match="different commands"):
        summarize(
            {"exclusive": base, "krex": run}, machine="m", date="d", command="c", concurrency=2
        )


def test_flip_rate_counts_only_pairs_that_succeeded_everywhere() -> None:
    """With b failed in the run, of a/b/c only the pair a/c is compared (and it swaps)."""
    excl = run_of("exclusive", {("s", "a"): 1.00, ("s", "b"): 1.01, ("s", "c"): 1.03})
    run = run_with_failures("shared", {("s", "a"): 1.2, ("s", "c"): 1.1}, [failure("s", "b")])
    got = flip_rate(run, excl, excl)
    assert got["<2%"] == {"rate": None, "pairs": 0, "flips": 0}
    assert got["2-5%"] == {"rate": 1.0, "pairs": 1, "flips": 1}


def test_kendall_tau_over_the_candidates_that_succeeded() -> None:
    """A candidate that failed on either side drops out of its task's ranking: s keeps a and c
    (in order), u keeps only a and has no tau."""
    excl = run_with_failures(
        "exclusive",
        {("s", "a"): 1.0, ("s", "b"): 2.0, ("s", "c"): 3.0, ("u", "a"): 1.0},
        [failure("u", "b")],
    )
    run = run_with_failures(
        "krex",
        {("s", "a"): 1.0, ("s", "c"): 3.0, ("u", "a"): 1.0, ("u", "b"): 2.0},
        [failure("s", "b", oom=True)],
    )
    assert kendall_tau_per_task(run, excl) == {"s": 1.0, "u": None}
    assert kendall_tau_median(run, excl) == 1.0


def test_both_throughputs() -> None:
    """3 succeeded and 1 failed in 60 s: 3 commands a minute that succeeded, 4 run."""
    run = run_with_failures(
        "krex", {("a", "1"): 1.0, ("a", "2"): 1.0, ("a", "3"): 1.0}, [failure("a", "4")]
    )
    assert throughput_cmds_per_min(run) == pytest.approx(3.0)
    assert throughput_all_cmds_per_min(run) == pytest.approx(4.0)
    none_ok = ModeRun("krex", 30.0, (), (failure("a", "1"),))
    assert throughput_cmds_per_min(none_ok) == 0.0
    assert throughput_all_cmds_per_min(none_ok) == pytest.approx(2.0)


def test_only_when_shared_is_by_the_baseline() -> None:
    """A failure is only-when-shared when the baseline measured the command, alone otherwise."""
    base = run_with_failures("exclusive", {("a", "1"): 1.0, ("a", "2"): 1.0}, [failure("a", "3")])
    run = run_with_failures(
        "shared", {("a", "1"): 1.0}, [failure("a", "2", oom=True), failure("a", "3")]
    )
    assert only_when_shared(run, base) == {("a", "2"): True, ("a", "3"): False}


def failing_modes() -> dict[str, ModeRun]:
    """exclusive: a/3 fails (alone). shared: a/2 (out of memory) and a/3 fail. krex: a/3 fails.
    All in 60 s; four commands a mode."""
    ok = {("a", "1"): 1.0, ("a", "2"): 1.1, ("a", "4"): 1.3}
    return {
        "exclusive": run_with_failures("exclusive", ok, [failure("a", "3")]),
        "shared": run_with_failures(
            "shared",
            {("a", "1"): 1.0, ("a", "4"): 1.3},
            [failure("a", "2", oom=True), failure("a", "3", status=None)],
        ),
        "krex": run_with_failures("krex", ok, [failure("a", "3")], wall_s=20.0),
    }


def test_summarize_counts_failures_per_mode() -> None:
    """Per mode: tried, succeeded, failed, out of memory, only when shared, alone, both rates."""
    res = summarize(failing_modes(), machine="m", date="d", command="c", concurrency=4)
    shared, krex, excl = res["modes"]["shared"], res["modes"]["krex"], res["modes"]["exclusive"]
    assert (shared["commands"], shared["succeeded"], shared["failed"]) == (4, 2, 2)
    assert (shared["failed_oom"], shared["failed_only_when_shared"], shared["failed_alone"]) == (
        1,
        1,
        1,
    )
    assert (krex["failed"], krex["failed_only_when_shared"], krex["failed_alone"]) == (1, 0, 1)
    assert (excl["failed_only_when_shared"], excl["failed_alone"]) == (0, 1)
    assert shared["throughput_cmds_per_min"] == pytest.approx(2.0)
    assert shared["throughput_all_cmds_per_min"] == pytest.approx(4.0)
    # Successful over successful: krex 9/min vs exclusive 3/min; all over all: 12 vs 4.
    assert res["throughput_ratio_vs_exclusive"]["krex"] == pytest.approx(3.0)
    assert res["throughput_ratio_vs_exclusive"]["shared"] == pytest.approx(2 / 3)
    assert res["throughput_ratio_all_vs_exclusive"]["krex"] == pytest.approx(3.0)
    assert res["throughput_ratio_all_vs_exclusive"]["shared"] == pytest.approx(1.0)


def test_summarize_lists_failures_and_stays_json() -> None:
    """results["failures"] lists each failed command per mode, in run order, as plain JSON."""
    res = summarize(failing_modes(), machine="m", date="d", command="c", concurrency=4)
    doc = json.loads(json.dumps(res, allow_nan=False))
    assert doc["failures"]["krex"] == [
        {
            "task": "a",
            "variant": "3",
            "status": 1,
            "oom": False,
            "only_when_shared": False,
            "reason": "RuntimeError: boom",
            "attempts": 0,
            "wall_s": 2.0,
        }
    ]
    shared = doc["failures"]["shared"]
    assert [(f["variant"], f["status"], f["oom"], f["only_when_shared"]) for f in shared] == [
        ("2", 1, True, True),
        ("3", None, False, False),
    ]
    assert doc["failures"]["exclusive"][0]["only_when_shared"] is False


def test_flip_pairs_per_mode_count_only_what_was_compared() -> None:
    """flip_rate_pairs stays the exclusive run's; the by-mode count drops pairs with a failure."""
    res = summarize(failing_modes(), machine="m", date="d", command="c", concurrency=4)
    # exclusive a/1, a/2, a/4: 1.0/1.1 (>5%), 1.0/1.3, 1.1/1.3 (>5%); shared lacks a/2.
    assert res["flip_rate_pairs"] == {"<2%": 0, "2-5%": 0, ">5%": 3}
    assert res["flip_rate_pairs_by_mode"]["shared"] == {"<2%": 0, "2-5%": 0, ">5%": 1}
    assert res["flip_rate_pairs_by_mode"]["krex"] == {"<2%": 0, "2-5%": 0, ">5%": 3}


def test_summarize_of_a_mode_where_everything_failed() -> None:
    """A krex run of failures only: throughput 0, ratio 0, empty bands, no tau, no flips."""
    runs = failing_modes()
    runs["krex"] = ModeRun("krex", 20.0, (), tuple(failure("a", v) for v in "1234"))
    res = summarize(runs, machine="m", date="d", command="c", concurrency=4)
    assert res["modes"]["krex"]["succeeded"] == 0
    assert res["modes"]["krex"]["failed_only_when_shared"] == 3
    assert res["throughput_ratio_vs_exclusive"]["krex"] == 0.0
    assert res["inflation"]["krex"][">0.1ms"] == {"p50": None, "p95": None, "p99": None, "n": 0}
    assert res["kendall_tau_median"]["krex"] is None
    assert all(v is None for v in res["flip_rate"]["krex"].values())


def test_summarize_ratio_is_none_without_a_successful_baseline() -> None:
    """An exclusive run where every command failed gives no successful-throughput ratio."""
    runs = {
        "exclusive": ModeRun("exclusive", 60.0, (), (failure("a", "1"),)),
        "krex": run_of("krex", {("a", "1"): 1.0}, wall_s=30.0),
    }
    res = summarize(runs, machine="m", date="d", command="c", concurrency=4)
    assert res["throughput_ratio_vs_exclusive"] == {"exclusive": None, "krex": None}
    assert res["throughput_ratio_all_vs_exclusive"]["krex"] == pytest.approx(2.0)


@given(
    st.lists(st.booleans(), min_size=1, max_size=12),
    st.lists(st.booleans(), min_size=1, max_size=12),
)
def test_failure_counts_add_up(base_ok: list[bool], run_ok: list[bool]) -> None:
    """For any pattern of failures: succeeded + failed = commands, and every failure is either
    only-when-shared or alone, the former exactly those that succeeded in exclusive."""
    n = min(len(base_ok), len(run_ok))

    def make(mode: str, ok: list[bool]) -> ModeRun:
        return ModeRun(
            mode,
            60.0,
            tuple(Measurement("t", str(i), 1.0 + i, 1.0) for i in range(n) if ok[i]),
            tuple(failure("t", str(i)) for i in range(n) if not ok[i]),
        )

    runs = {"exclusive": make("exclusive", base_ok), "shared": make("shared", run_ok)}
    m = summarize(runs, machine="m", date="d", command="c", concurrency=2)["modes"]["shared"]
    assert m["commands"] == n == m["succeeded"] + m["failed"]
    assert m["failed"] == m["failed_only_when_shared"] + m["failed_alone"]
    assert m["failed_only_when_shared"] == sum(base_ok[i] and not run_ok[i] for i in range(n))


def test_memory_wait_stats() -> None:
    """Waits 0, 1 and 3 s of commands with a krex report: p50 1, p95 2.8, max 3, n 3; commands
    without a report are left out, and a run without any has None statistics."""
    run = ModeRun(
        "krex",
        10.0,
        tuple(
            Measurement("t", str(i), 1.0, 1.0, memory_wait_s=w)
            for i, w in enumerate((0.0, 3.0, None, 1.0))
        ),
    )
    assert memory_wait_stats(run) == pytest.approx({"p50": 1.0, "p95": 2.8, "max": 3.0, "n": 3})
    none = memory_wait_stats(run_of("exclusive", {("t", "a"): 1.0}))
    assert none == {"p50": None, "p95": None, "max": None, "n": 0}
    res = summarize(
        {"exclusive": run_of("exclusive", {(m.task, m.variant): 1.0 for m in run.measurements}),
         "krex": run},
        machine="m", date="d", command="c", concurrency=2,
    )  # fmt: skip
    assert res["modes"]["krex"]["memory_wait_s"]["n"] == 3
    assert res["modes"]["exclusive"]["memory_wait_s"]["p95"] is None
