"""Metrics of one `krex bench` run: throughput, timing inflation, ranking fidelity, region times.

The suite runs the same commands in several modes. The `exclusive` mode (one command per GPU at a
time) is the ground truth: inflation and Kendall tau are measured against it, and it decides the
gap class of each pair of candidates. The `native_repeat` mode (exclusive again) shows how much
a fair re-run moves, which is the floor that `shared` and `krex` are compared with.

A command may fail in a mode (a `Failure`: it exited non-zero, ran too long or printed no
result). Every mode must try the same commands; the comparisons of two runs (inflation, flips,
Kendall tau) use only the commands that succeeded in both. A failure is "only when shared" when
the same command succeeded in the exclusive run, "alone" when it failed there too.

Everything here is pure and numpy-free; bad input raises `ValueError` with one sentence.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

MODES = (
    "exclusive",
    "native_repeat",
    "shared",
    "krex",
    "krex-cold",
    "krex-settle",
    "krex-mps",
    "krex-serial",
)
"""The modes a run may have, in the order `summarize` reports them."""

BASELINE = "exclusive"

BANDS: Mapping[str, float] = {">10ms": 10.0, ">1ms": 1.0, ">0.1ms": 0.1}
"""Inflation bands: baseline median above the threshold (ms). Nested: 20 ms is in all three."""

GAP_CLASSES = ("<2%", "2-5%", ">5%")
"""Gap classes of a pair of candidates: gap < 2 %, 2 % <= gap <= 5 %, gap > 5 %."""

_GAP_LOW = 0.02
_GAP_HIGH = 0.05

REGION_FIELDS = ("wait_s", "drain_s", "freeze_s", "duration_s")

CommandId = tuple[str, str]
"""A command: (task, variant)."""


def _finite(what: str, value: object) -> float:
    """`value` as a finite float; `what` names it in the error."""
    # bool is an int subclass; True as a time is a bug in the caller, not a 1 s measurement.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, not {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, not {value!r}.")
    return float(value)


def _number(what: str, value: object, *, positive: bool = False) -> float:
    """`value` as a finite float, non-negative (or positive); `what` names it in the error."""
    value = _finite(what, value)
    if positive and value <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}.")
    if value < 0:
        raise ValueError(f"{what} must not be negative, not {value!r}.")
    return float(value)


def _name(what: str, value: object) -> str:
    """`value` as a non-empty string; `what` names it in the error."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}.")
    return value


@dataclass(frozen=True)
class RegionTimes:
    """One critical region's times in seconds, whether it ended cleanly, and the names of its
    record's warnings (krex/daemon/fidelity.py: power and placement; they leave a region clean).

    `wait_s` is the time spent waiting to enter, `drain_s` and `freeze_s` the time spent draining
    and freezing the siblings on entry, and `duration_s` the time inside the region;
    `settle_s` the time it idled after the freeze (`krex run --settle`, the krex-settle mode;
    `settle_capped` where the power-capped rule chose it); `candidate` where an autotuner's
    candidate benchmark began it.
    """

    wait_s: float
    drain_s: float
    freeze_s: float
    duration_s: float
    clean: bool
    warnings: tuple[str, ...] = ()
    settle_s: float = 0.0
    settle_capped: bool = False
    candidate: bool = False

    def record(self) -> dict[str, Any]:
        """What results.json keeps of it (`region_records`): why a timing moved or waited."""
        return {
            "duration_s": self.duration_s,
            "settle_s": self.settle_s,
            "warnings": list(self.warnings),
            **({"settle_capped": True} if self.settle_capped else {}),
            **({"candidate": True} if self.candidate else {}),
        }

    def __post_init__(self) -> None:
        """Reject negative, infinite or NaN times and a non-bool `clean`."""
        for field in REGION_FIELDS:
            _number(f"RegionTimes.{field}", getattr(self, field))
        _number("RegionTimes.settle_s", self.settle_s)
        if not isinstance(self.clean, bool):
            raise ValueError(f"RegionTimes.clean must be a bool, not {self.clean!r}.")


@dataclass(frozen=True)
class Measurement:
    """One command's result in one mode.

    `median_ms` is the command's own timed statistic and must be positive. `wall_s` may be 0,
    meaning not recorded (such a command is left out of the region share). `region_s` is the
    time inside regions, 0 when there were none. `memory_wait_s` is the time the command waited
    for device memory by its krex report (None outside krex, or without a report).
    """

    task: str
    variant: str
    median_ms: float
    wall_s: float
    region_s: float = 0.0
    regions: tuple[RegionTimes, ...] = ()
    memory_wait_s: float | None = None

    def __post_init__(self) -> None:
        """Reject empty names, a non-positive median and negative, infinite or NaN times."""
        _name("Measurement.task", self.task)
        _name("Measurement.variant", self.variant)
        _number(f"median_ms of {self.task}/{self.variant}", self.median_ms, positive=True)
        _number(f"wall_s of {self.task}/{self.variant}", self.wall_s)
        _number(f"region_s of {self.task}/{self.variant}", self.region_s)
        if self.memory_wait_s is not None:
            _number(f"memory_wait_s of {self.task}/{self.variant}", self.memory_wait_s)
        # A list would make the frozen object unhashable and mutable underneath; store a tuple.
        regions = tuple(self.regions)
        for region in regions:
            if not isinstance(region, RegionTimes):
                raise ValueError(f"regions of {self.task}/{self.variant} must be RegionTimes.")
        object.__setattr__(self, "regions", regions)

    @property
    def key(self) -> CommandId:
        """The command's identity, (task, variant)."""
        return (self.task, self.variant)


@dataclass(frozen=True)
class Failure:
    """One command that produced no measurement in one mode.

    `status` is its exit status, None when it was killed for running too long. `oom` says it
    died of device out-of-memory (by its stderr or its krex report). `reason` is one line (the
    last line of its stderr, or what the runner saw). `wall_s` is how long it ran. `attempts` is
    how many earlier runs krex made of it before this one (re-runs after an out-of-memory error
    caused only by sharing), 0 outside krex.
    """

    task: str
    variant: str
    status: int | None
    oom: bool
    reason: str
    wall_s: float
    attempts: int = 0

    def __post_init__(self) -> None:
        """Reject empty names, a non-int status, a non-bool `oom`, a non-str reason, a negative,
        infinite or NaN wall time and a negative or non-int `attempts`."""
        _name("Failure.task", self.task)
        _name("Failure.variant", self.variant)
        where = f"{self.task}/{self.variant}"
        if self.status is not None and (
            isinstance(self.status, bool) or not isinstance(self.status, int)
        ):
            raise ValueError(
                f"status of failed {where} must be an int or None, not {self.status!r}."
            )
        if not isinstance(self.oom, bool):
            raise ValueError(f"oom of failed {where} must be a bool, not {self.oom!r}.")
        if not isinstance(self.reason, str):
            raise ValueError(f"reason of failed {where} must be a string, not {self.reason!r}.")
        _number(f"wall_s of failed {where}", self.wall_s)
        if (
            isinstance(self.attempts, bool)
            or not isinstance(self.attempts, int)
            or self.attempts < 0
        ):
            raise ValueError(
                f"attempts of failed {where} must be a non-negative int, not {self.attempts!r}."
            )

    @property
    def key(self) -> CommandId:
        """The command's identity, (task, variant)."""
        return (self.task, self.variant)


@dataclass(frozen=True)
class ModeRun:
    """One mode's whole run: its wall time (first start to last end), one measurement per
    command that succeeded and one failure per command that did not."""

    mode: str
    wall_s: float
    measurements: tuple[Measurement, ...]
    failures: tuple[Failure, ...] = ()

    def __post_init__(self) -> None:
        """Reject an unknown mode, a non-positive wall time, no commands and repeated commands
        (a command measured twice, failed twice, or both measured and failed)."""
        if self.mode not in MODES:
            raise ValueError(f"Mode {self.mode!r} is not one of {', '.join(MODES)}.")
        _number(f"wall_s of mode {self.mode}", self.wall_s, positive=True)
        measurements = tuple(self.measurements)
        failures = tuple(self.failures)
        if not measurements and not failures:
            raise ValueError(f"Mode {self.mode} has no measurements and no failures.")
        seen: set[CommandId] = set()
        for m in measurements:
            if not isinstance(m, Measurement):
                raise ValueError(f"Mode {self.mode} has a measurement that is not a Measurement.")
            if m.key in seen:
                raise ValueError(f"Mode {self.mode} measures {m.task}/{m.variant} more than once.")
            seen.add(m.key)
        for f in failures:
            if not isinstance(f, Failure):
                raise ValueError(f"Mode {self.mode} has a failure that is not a Failure.")
            if f.key in seen:
                raise ValueError(f"Mode {self.mode} runs {f.task}/{f.variant} more than once.")
            seen.add(f.key)
        object.__setattr__(self, "measurements", measurements)
        object.__setattr__(self, "failures", failures)

    def by_key(self) -> dict[CommandId, Measurement]:
        """The measurements (the commands that succeeded) keyed by (task, variant)."""
        return {m.key: m for m in self.measurements}

    def attempted(self) -> set[CommandId]:
        """Every command the run tried: those that succeeded and those that failed."""
        return {m.key for m in self.measurements} | {f.key for f in self.failures}


class BandStats(TypedDict):
    """Inflation of one band: signed p50, absolute p95/p99 (None when empty), command count."""

    p50: float | None
    p95: float | None
    p99: float | None
    n: int


class FlipStats(TypedDict):
    """Flips of one gap class: flips / pairs (None without pairs), pairs and flips."""

    rate: float | None
    pairs: int
    flips: int


class FieldStats(TypedDict):
    """One region time over all regions: p50, p95 and max (None without regions), count."""

    p50: float | None
    p95: float | None
    max: float | None
    n: int


class RegionTimeStats(TypedDict):
    """Per-field statistics of all regions of a run, and how many ended uncleanly."""

    wait_s: FieldStats
    drain_s: FieldStats
    freeze_s: FieldStats
    duration_s: FieldStats
    unclean: int
    warnings: dict[str, int]


class ModeSummary(TypedDict):
    """A mode's throughput, wall time, command counts and memory waits in results.json.

    `commands` is every command the mode tried; `succeeded` + `failed` = `commands`.
    `failed_only_when_shared` failed here but succeeded in the exclusive run; `failed_alone`
    failed here and in the exclusive run too (they add up to `failed`). `failed_oom` is how
    many failures were device out-of-memory. `memory_wait_s` is over the succeeded commands
    with a krex report (n = 0 and None statistics without).
    """

    throughput_cmds_per_min: float
    throughput_all_cmds_per_min: float
    wall_s: float
    commands: int
    succeeded: int
    failed: int
    failed_oom: int
    failed_only_when_shared: int
    failed_alone: int
    memory_wait_s: FieldStats


class FailureRecord(TypedDict):
    """One failed command of one mode in results.json's "failures"."""

    task: str
    variant: str
    status: int | None
    oom: bool
    only_when_shared: bool
    reason: str
    attempts: int
    wall_s: float


class Results(TypedDict):
    """The results.json document that `summarize` builds."""

    machine: str
    date: str
    command: str
    concurrency: int
    modes: dict[str, ModeSummary]
    throughput_ratio_vs_exclusive: dict[str, float | None]
    throughput_ratio_all_vs_exclusive: dict[str, float | None]
    failures: dict[str, list[FailureRecord]]
    inflation_p95: dict[str, dict[str, float | None]]
    inflation: dict[str, dict[str, BandStats]]
    flip_rate: dict[str, dict[str, float | None]]
    flip_rate_pairs: dict[str, int]
    flip_rate_pairs_by_mode: dict[str, dict[str, int]]
    kendall_tau_median: dict[str, float | None]
    kendall_tau: dict[str, dict[str, float | None]]
    region_share_median: float | None
    region_share_median_by_mode: dict[str, float | None]
    region_times: dict[str, RegionTimeStats]


def quantile(values: Iterable[float], q: float) -> float:
    """The `q` quantile of `values` by linear interpolation, as numpy's default 'linear' method.

    Args:
        values: Finite numbers, in any order.
        q: The quantile, from 0 to 1 (0.95 is the 95th percentile).

    Returns:
        The interpolated value between the two order statistics around (n - 1) * q.

    Raises:
        ValueError: If `values` is empty or holds a NaN or infinity, or `q` is outside [0, 1].
    """
    data = sorted(_finite("A quantile's value", v) for v in values)
    if not data:
        raise ValueError("A quantile of no values is undefined.")
    q = _number("The quantile", q)
    if q > 1:
        raise ValueError(f"The quantile must be between 0 and 1, not {q!r}.")
    h = (len(data) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(data) - 1)
    t = h - lo
    a, b = data[lo], data[hi]
    # numpy's _lerp: interpolate from the nearer end, so that t = 1 gives b exactly.
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def _quantile_or_none(values: Sequence[float], q: float) -> float | None:
    """`quantile(values, q)`, or None for no values."""
    return quantile(values, q) if values else None


def _same_commands(
    run: ModeRun, other: ModeRun
) -> tuple[dict[CommandId, Measurement], dict[CommandId, Measurement]]:
    """The measurements of the commands that succeeded in both runs, keyed by command, from
    each run; raise unless the two runs tried the same commands (succeeded or failed)."""
    tried, other_tried = run.attempted(), other.attempted()
    if tried != other_tried:
        missing = sorted(other_tried - tried)
        extra = sorted(tried - other_tried)
        where = (
            f"lacks {'/'.join(missing[0])}" if missing else f"has the extra {'/'.join(extra[0])}"
        )
        raise ValueError(
            f"Mode {run.mode} and mode {other.mode} ran different commands ({run.mode} {where})."
        )
    a, b = run.by_key(), other.by_key()
    both = a.keys() & b.keys()
    return {k: a[k] for k in sorted(both)}, {k: b[k] for k in sorted(both)}


def throughput_cmds_per_min(run: ModeRun) -> float:
    """Commands that succeeded per minute of the mode's wall time.

    Args:
        run: One mode's run.

    Returns:
        len(run.measurements) / run.wall_s * 60 (0 when every command failed).

    Raises:
        ValueError: If `run` is not a ModeRun (a ModeRun cannot be empty or have a bad wall time).
    """
    if not isinstance(run, ModeRun):
        raise ValueError(f"Throughput needs a ModeRun, not {type(run).__name__}.")
    return len(run.measurements) / run.wall_s * 60.0


def throughput_all_cmds_per_min(run: ModeRun) -> float:
    """Commands run, whether they succeeded or failed, per minute of the mode's wall time.

    Args:
        run: One mode's run.

    Returns:
        (len(run.measurements) + len(run.failures)) / run.wall_s * 60.

    Raises:
        ValueError: If `run` is not a ModeRun.
    """
    if not isinstance(run, ModeRun):
        raise ValueError(f"Throughput needs a ModeRun, not {type(run).__name__}.")
    return (len(run.measurements) + len(run.failures)) / run.wall_s * 60.0


def only_when_shared(run: ModeRun, baseline: ModeRun) -> dict[CommandId, bool]:
    """For each command that failed in `run`: whether it succeeded in `baseline`.

    Args:
        run: The mode under test.
        baseline: The exclusive run.

    Returns:
        (task, variant) of each failure of `run` -> True when `baseline` measured it (it fails
        only when shared), False when it failed there too (it fails alone).

    Raises:
        ValueError: If the two runs tried different commands.
    """
    _same_commands(run, baseline)
    succeeded = baseline.by_key()
    return {f.key: f.key in succeeded for f in run.failures}


def inflation(run: ModeRun, baseline: ModeRun) -> dict[CommandId, float]:
    """Each command's timing inflation: its median over the baseline's median, minus 1.

    Args:
        run: The mode under test.
        baseline: The exclusive run.

    Returns:
        (task, variant) -> measured / baseline - 1 (0.0158 is 1.58 % slower; negative is faster).

    Raises:
        ValueError: If the two runs ran different commands.
    """
    measured, base = _same_commands(run, baseline)
    return {k: measured[k].median_ms / base[k].median_ms - 1.0 for k in sorted(measured)}


def inflation_percentiles(run: ModeRun, baseline: ModeRun) -> dict[str, BandStats]:
    """Inflation percentiles per nested band of the baseline median (`BANDS`).

    p50 is of the signed inflation (it shows a systematic shift); p95 and p99 are of the absolute
    inflation, because a command measured 3 % faster is as wrong as one measured 3 % slower.

    Args:
        run: The mode under test.
        baseline: The exclusive run; a command is in a band when its median there is above the
            band's threshold.

    Returns:
        band -> {"p50", "p95", "p99", "n"}; the percentiles are None when the band is empty.

    Raises:
        ValueError: If the two runs ran different commands.
    """
    infl = inflation(run, baseline)
    base = baseline.by_key()
    out: dict[str, BandStats] = {}
    for band, threshold_ms in BANDS.items():
        signed = [v for k, v in infl.items() if base[k].median_ms > threshold_ms]
        absolute = [abs(v) for v in signed]
        out[band] = {
            "p50": _quantile_or_none(signed, 0.5),
            "p95": _quantile_or_none(absolute, 0.95),
            "p99": _quantile_or_none(absolute, 0.99),
            "n": len(signed),
        }
    return out


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % at z = 1.96); (0, 1) without trials."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """A 95 % interval of k1/n1 - k2/n2 (Newcombe's hybrid score method, from two Wilson
    intervals): how far a flip-rate difference measured on few pairs can be from the true one."""
    p1, p2 = (k1 / n1 if n1 else 0.0), (k2 / n2 if n2 else 0.0)
    l1, u1 = wilson_interval(k1, n1)
    l2, u2 = wilson_interval(k2, n2)
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)


def gap_class(a_ms: float, b_ms: float) -> str:
    """The gap class of two medians: |a - b| / min(a, b) against 2 % and 5 % (both inclusive).

    Args:
        a_ms: One candidate's median (positive).
        b_ms: The other candidate's median (positive).

    Returns:
        "<2%" below 2 %, "2-5%" from 2 % to 5 % inclusive, ">5%" above 5 %.

    Raises:
        ValueError: If a median is not a positive finite number.
    """
    a = _number("A median", a_ms, positive=True)
    b = _number("A median", b_ms, positive=True)
    gap = abs(a - b) / min(a, b)
    if gap < _GAP_LOW:
        return GAP_CLASSES[0]
    return GAP_CLASSES[1] if gap <= _GAP_HIGH else GAP_CLASSES[2]


def _by_task(measurements: Mapping[CommandId, Measurement]) -> dict[str, list[str]]:
    """task -> its variants, both sorted."""
    tasks: dict[str, list[str]] = {}
    for task, variant in sorted(measurements):
        tasks.setdefault(task, []).append(variant)
    return tasks


def _sign(x: float) -> int:
    """-1, 0 or 1 as `x` is negative, zero or positive."""
    return (x > 0) - (x < 0)


def flip_rate(run: ModeRun, reference: ModeRun, order_by: ModeRun) -> dict[str, FlipStats]:
    """How often `run` orders a pair of candidates of one task differently from `reference`.

    Every unordered pair of variants within a task is classed by `order_by`'s medians
    (`gap_class`). The pair flips when the sign of the difference of its medians differs
    between `run` and `reference`: a tie on one side only is a flip, a tie on both is not.

    Args:
        run: The mode under test (native_repeat, shared, krex).
        reference: The order it is checked against (the exclusive run).
        order_by: The run whose medians decide each pair's gap class (the exclusive run).

    Returns:
        gap class -> {"rate": flips / pairs or None without pairs, "pairs", "flips"}.

    Raises:
        ValueError: If the three runs ran different commands.
    """
    got, ref = _same_commands(run, reference)
    _, order = _same_commands(run, order_by)
    # Only pairs whose both candidates succeeded in all three runs.
    common = {k: got[k] for k in got.keys() & order.keys()}
    pairs = dict.fromkeys(GAP_CLASSES, 0)
    flips = dict.fromkeys(GAP_CLASSES, 0)
    for task, variants in _by_task(common).items():
        for i, a in enumerate(variants):
            for b in variants[i + 1 :]:
                ka, kb = (task, a), (task, b)
                cls = gap_class(order[ka].median_ms, order[kb].median_ms)
                pairs[cls] += 1
                run_sign = _sign(got[ka].median_ms - got[kb].median_ms)
                ref_sign = _sign(ref[ka].median_ms - ref[kb].median_ms)
                flips[cls] += run_sign != ref_sign
    return {
        cls: {
            "rate": flips[cls] / pairs[cls] if pairs[cls] else None,
            "pairs": pairs[cls],
            "flips": flips[cls],
        }
        for cls in GAP_CLASSES
    }


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Kendall's tau-b of two paired sequences (ties corrected, as scipy's default).

    Args:
        xs: One ranking's values.
        ys: The other ranking's values, paired with `xs` by position.

    Returns:
        (concordant - discordant) / sqrt((pairs - x ties) * (pairs - y ties)), or None when there
        are fewer than 2 items or one side is all ties (the denominator is 0).

    Raises:
        ValueError: If the lengths differ or a value is NaN or infinite.
    """
    if len(xs) != len(ys):
        raise ValueError(f"Kendall tau needs paired values, not {len(xs)} and {len(ys)}.")
    for v in (*xs, *ys):
        _finite("A Kendall tau value", v)
    n = len(xs)
    concordant = discordant = x_ties = y_ties = 0
    for i in range(n):
        for j in range(i + 1, n):
            sx = _sign(xs[i] - xs[j])
            sy = _sign(ys[i] - ys[j])
            # A pair tied on both sides counts in both tie totals, as tau-b's n1 and n2 do.
            x_ties += sx == 0
            y_ties += sy == 0
            if sx * sy > 0:
                concordant += 1
            elif sx * sy < 0:
                discordant += 1
    total = n * (n - 1) // 2
    denominator = (total - x_ties) * (total - y_ties)
    if denominator == 0:
        return None
    tau = (concordant - discordant) / math.sqrt(denominator)
    # Rounding can leave |tau| a hair above 1; the true value cannot be.
    return max(-1.0, min(1.0, tau))


def kendall_tau_per_task(run: ModeRun, baseline: ModeRun) -> dict[str, float | None]:
    """Kendall tau-b of each task's variant medians in `run` against `baseline`.

    Args:
        run: The mode under test.
        baseline: The exclusive run.

    Returns:
        task -> tau-b, None for a task with one variant or all-tied medians on one side.

    Raises:
        ValueError: If the two runs ran different commands.
    """
    got, base = _same_commands(run, baseline)
    out: dict[str, float | None] = {}
    for task, variants in _by_task(got).items():
        xs = [base[(task, v)].median_ms for v in variants]
        ys = [got[(task, v)].median_ms for v in variants]
        out[task] = kendall_tau(xs, ys)
    return out


def kendall_tau_median(run: ModeRun, baseline: ModeRun) -> float | None:
    """The median over tasks of `kendall_tau_per_task`, skipping tasks where tau is undefined.

    Args:
        run: The mode under test.
        baseline: The exclusive run.

    Returns:
        The median tau-b, or None when no task has a defined tau.

    Raises:
        ValueError: If the two runs ran different commands.
    """
    taus = [t for t in kendall_tau_per_task(run, baseline).values() if t is not None]
    return _quantile_or_none(taus, 0.5)


def region_share_median(run: ModeRun) -> float | None:
    """The median over commands of the share of wall time spent inside regions.

    Commands without regions count with a share of 0; commands whose wall time was not recorded
    (wall_s == 0) are left out.

    Args:
        run: One mode's run.

    Returns:
        The median of region_s / wall_s, or None when no command had regions.

    Raises:
        ValueError: If `run` is not a ModeRun.
    """
    if not isinstance(run, ModeRun):
        raise ValueError(f"A region share needs a ModeRun, not {type(run).__name__}.")
    timed = [m for m in run.measurements if m.wall_s > 0]
    if not any(m.region_s > 0 or m.regions for m in timed):
        return None
    return quantile([m.region_s / m.wall_s for m in timed], 0.5)


def region_time_stats(run: ModeRun) -> RegionTimeStats:
    """Wait, drain, freeze and duration statistics over every region of a run.

    Args:
        run: One mode's run.

    Returns:
        {"wait_s", "drain_s", "freeze_s", "duration_s"} -> {"p50", "p95", "max", "n"} (None
        without regions), "unclean": how many regions did not end cleanly, and "warnings":
        how many regions carried each named warning.

    Raises:
        ValueError: If `run` is not a ModeRun.
    """
    if not isinstance(run, ModeRun):
        raise ValueError(f"Region times need a ModeRun, not {type(run).__name__}.")
    regions = [r for m in run.measurements for r in m.regions]

    def stats(field: str) -> FieldStats:
        values = [float(getattr(r, field)) for r in regions]
        return {
            "p50": _quantile_or_none(values, 0.5),
            "p95": _quantile_or_none(values, 0.95),
            "max": max(values) if values else None,
            "n": len(values),
        }

    return {
        "wait_s": stats("wait_s"),
        "drain_s": stats("drain_s"),
        "freeze_s": stats("freeze_s"),
        "duration_s": stats("duration_s"),
        "unclean": sum(not r.clean for r in regions),
        "warnings": dict(sorted(Counter(w for r in regions for w in r.warnings).items())),
    }


def memory_wait_stats(run: ModeRun) -> FieldStats:
    """p50, p95 and max of the device-memory wait of the commands that succeeded with a krex
    report (`Measurement.memory_wait_s`), and how many had one.

    Args:
        run: One mode's run.

    Returns:
        {"p50", "p95", "max", "n"}: None statistics and n = 0 when no command had a krex report.

    Raises:
        ValueError: If `run` is not a ModeRun.
    """
    if not isinstance(run, ModeRun):
        raise ValueError(f"Memory waits need a ModeRun, not {type(run).__name__}.")
    waits = [m.memory_wait_s for m in run.measurements if m.memory_wait_s is not None]
    return {
        "p50": _quantile_or_none(waits, 0.5),
        "p95": _quantile_or_none(waits, 0.95),
        "max": max(waits) if waits else None,
        "n": len(waits),
    }


def _mode_summary(run: ModeRun, base: ModeRun) -> ModeSummary:
    """One mode's entry of results.json's "modes"."""
    shared_only = only_when_shared(run, base)
    return {
        "throughput_cmds_per_min": throughput_cmds_per_min(run),
        "throughput_all_cmds_per_min": throughput_all_cmds_per_min(run),
        "wall_s": run.wall_s,
        "commands": len(run.measurements) + len(run.failures),
        "succeeded": len(run.measurements),
        "failed": len(run.failures),
        "failed_oom": sum(f.oom for f in run.failures),
        "failed_only_when_shared": sum(shared_only.values()),
        "failed_alone": sum(not v for v in shared_only.values()),
        "memory_wait_s": memory_wait_stats(run),
    }


def _failure_records(run: ModeRun, base: ModeRun) -> list[FailureRecord]:
    """results.json's "failures" of one mode, in the run's order."""
    shared_only = only_when_shared(run, base)
    return [
        {
            "task": f.task,
            "variant": f.variant,
            "status": f.status,
            "oom": f.oom,
            "only_when_shared": shared_only[f.key],
            "reason": f.reason,
            "attempts": f.attempts,
            "wall_s": f.wall_s,
        }
        for f in run.failures
    ]


def _ratio(value: float, base: float) -> float | None:
    """value / base, None when base is 0 (no command succeeded in the baseline)."""
    return value / base if base > 0 else None


def _pair_counts(order_by: ModeRun) -> dict[str, int]:
    """How many pairs of candidates each gap class holds, by `order_by`'s medians."""
    return {cls: s["pairs"] for cls, s in flip_rate(order_by, order_by, order_by).items()}


def summarize(
    runs: Mapping[str, ModeRun], *, machine: str, date: str, command: str, concurrency: int
) -> Results:
    """Build results.json from one `krex bench` run of several modes.

    The exclusive run is the baseline of throughput ratios, inflation and Kendall tau, and the
    reference and gap classifier of flip rates (so `flip_rate` has no exclusive entry). The
    top-level `region_share_median` is the krex mode's (None without it): that is the run whose
    regions KREX timed; every mode's is under `region_share_median_by_mode`.

    Failed commands count in `commands`, `failed` and `throughput_all_cmds_per_min`, and are
    listed under "failures"; inflation, flips and Kendall tau use only commands that succeeded
    in both runs compared. `throughput_ratio_vs_exclusive` is of commands that succeeded (None
    when none did in the exclusive run), `throughput_ratio_all_vs_exclusive` of all commands.
    `flip_rate_pairs` counts the exclusive run's pairs; `flip_rate_pairs_by_mode` the pairs each
    mode's flip rate is over (fewer where a candidate failed).

    Args:
        runs: mode -> its run; must hold "exclusive", and each key must equal its run's mode.
        machine: The machine's description.
        date: When the run was made (ISO 8601).
        command: The command line that made the run.
        concurrency: How many commands shared a GPU in the shared modes (at least 1).

    Returns:
        A JSON-serialisable dict: the results.json keys, modes in `MODES` order.

    Raises:
        ValueError: If the exclusive run is missing, a key does not match its run's mode, the
            runs ran different commands, or a field is empty or of the wrong type.
    """
    _check_runs(runs, machine=machine, date=date, command=command, concurrency=concurrency)
    base = runs[BASELINE]
    ordered = [runs[m] for m in MODES if m in runs]
    for run in ordered:
        _same_commands(run, base)
    return _summary(
        ordered, base, machine=machine, date=date, command=command, concurrency=concurrency
    )


def _check_runs(
    runs: Mapping[str, ModeRun], *, machine: str, date: str, command: str, concurrency: int
) -> None:
    """ValueError unless summarize's arguments are well formed (each run compared later)."""
    for key, run in runs.items():
        if not isinstance(run, ModeRun):
            raise ValueError(f"Run {key!r} is a {type(run).__name__}, not a ModeRun.")
        if key != run.mode:
            raise ValueError(f"Run {key!r} holds the results of mode {run.mode!r}.")
    if BASELINE not in runs:
        raise ValueError("The runs must include the exclusive mode, the baseline.")
    _name("machine", machine)
    _name("date", date)
    _name("command", command)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a positive integer, not {concurrency!r}.")


def _summary(
    ordered: list[ModeRun],
    base: ModeRun,
    *,
    machine: str,
    date: str,
    command: str,
    concurrency: int,
) -> Results:
    """results.json of checked runs (`ordered`: in `MODES` order, `base` the exclusive one)."""
    base_tp = throughput_cmds_per_min(base)
    base_all_tp = throughput_all_cmds_per_min(base)
    inflations = {r.mode: inflation_percentiles(r, base) for r in ordered}
    compared = [r for r in ordered if r.mode != BASELINE]
    flips = {r.mode: flip_rate(r, base, base) for r in compared}
    by_mode_share = {r.mode: region_share_median(r) for r in ordered}
    return {
        "machine": machine,
        "date": date,
        "command": command,
        "concurrency": concurrency,
        "modes": {r.mode: _mode_summary(r, base) for r in ordered},
        "throughput_ratio_vs_exclusive": {
            r.mode: _ratio(throughput_cmds_per_min(r), base_tp) for r in ordered
        },
        "throughput_ratio_all_vs_exclusive": {
            r.mode: _ratio(throughput_all_cmds_per_min(r), base_all_tp) for r in ordered
        },
        "failures": {r.mode: _failure_records(r, base) for r in ordered},
        "inflation_p95": {
            mode: {band: s["p95"] for band, s in bands.items()}
            for mode, bands in inflations.items()
        },
        "inflation": inflations,
        "flip_rate": {
            mode: {cls: s["rate"] for cls, s in classes.items()} for mode, classes in flips.items()
        },
        "flip_rate_pairs": _pair_counts(base),
        "flip_rate_pairs_by_mode": {
            mode: {cls: s["pairs"] for cls, s in classes.items()} for mode, classes in flips.items()
        },
        "kendall_tau_median": {r.mode: kendall_tau_median(r, base) for r in ordered},
        "kendall_tau": {r.mode: kendall_tau_per_task(r, base) for r in ordered},
        "region_share_median": by_mode_share.get("krex"),
        "region_share_median_by_mode": by_mode_share,
        "region_times": {r.mode: region_time_stats(r) for r in ordered},
    }
