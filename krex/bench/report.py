"""The `krex bench` report: report.md and PNG plots, rendered from results.json alone.

results.json is `metrics.summarize(...)` (with its per-mode failure counts and `"failures"`)
plus `"commands"` (one `CommandRecord` per command that succeeded, per mode) and the optional
`"simulated"`, `"profile"` and `"targets"` (threshold overrides, see `target_values`).
Rendering reads nothing else, so `krex bench report DIR` can re-render a run.

Fractions stay fractions in the JSON (0.0158 is 1.58 %); only the report shows percentages.
matplotlib is optional: without it the report says the plots were skipped.
"""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict

from krex.bench.metrics import (
    BANDS,
    BASELINE,
    GAP_CLASSES,
    MODES,
    REGION_FIELDS,
    ModeRun,
    difference_interval,
)

TARGET_THROUGHPUT_RATIO = 3.4
"""krex throughput over exclusive must be at least this (the paper's H20 figure)."""

TARGET_THROUGHPUT_AIM = 6.0
"""What krex throughput over exclusive aims at; reported, not required."""

TARGET_INFLATION_P95: Mapping[str, float] = {">10ms": 0.0030, ">1ms": 0.0158, ">0.1ms": 0.0390}
"""Per band of `BANDS`: krex's p95 |inflation| must be at most this (fractions)."""

TARGET_EXCESS_P95 = 0.003
"""Per band: krex's p95 |inflation| may exceed the native repeat's by at most this (0.3 points).
The paper's figures judge krex and the GPU's own noise together; this judges krex's share: a
band the GPU itself moves by 9 % (a compute-bound matmul's power state) is missed against the
paper by any run, krex or not, and met here when krex adds nothing to it."""

TARGET_FLIP_MARGIN = 0.03
"""Per gap class: krex's flip rate may exceed native_repeat's by at most this (3 points)."""

KREX_MODES = ("krex", "krex-cold", "krex-settle", "krex-mps", "krex-serial")
"""The modes that run through krex: none of their commands may fail only because it shared."""

# Comparisons allow float noise far below the shown precision, so that a measured 1.58 % that
# prints as 1.58 % is not called missed because 1.0158 / 1 - 1 is 0.015800000000000036.
_EPS = 1e-9

PLOTS = ("throughput.png", "inflation_cdf.png", "time_split.png")
"""The plot files `render` writes when matplotlib is installed, in report order."""

NO_MATPLOTLIB = "plots skipped: matplotlib is not installed"

Status = Literal["met", "missed", "n/a"]


class CommandRecord(TypedDict):
    """One command's result in one mode, as results.json's "commands" lists it."""

    mode: str
    task: str
    variant: str
    median_ms: float
    wall_s: float
    region_s: float
    regions: int


class TargetValues(TypedDict):
    """The thresholds `targets` checks: the module's constants unless results.json overrides."""

    throughput_ratio: float
    throughput_aim: float
    inflation_p95: dict[str, float]
    inflation_excess: float
    flip_margin: float


class TargetRow(TypedDict):
    """One row of the Targets table: what, the goal as text, the measured value, the verdict."""

    target: str
    goal: str
    value: float | None
    shown: str
    status: Status


def command_records(runs: Iterable[ModeRun]) -> list[CommandRecord]:
    """results.json's "commands" for `runs`: one record per measurement, in run order."""
    return [
        {
            "mode": run.mode,
            "task": m.task,
            "variant": m.variant,
            "median_ms": m.median_ms,
            "wall_s": m.wall_s,
            "region_s": m.region_s,
            "regions": len(m.regions),
        }
        for run in runs
        for m in run.measurements
    ]


# --- reading results.json defensively -----------------------------------------------------------
# A re-render may meet a document from an older or interrupted run: a missing or mistyped key
# shows as n/a instead of failing the whole report.


def _map(value: object) -> Mapping[str, Any]:
    """`value` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _num(value: object) -> float | None:
    """`value` as a finite float, or None for anything else (None, bools, strings, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _modes(results: Mapping[str, Any]) -> list[str]:
    """The run's modes: those of `MODES` in its order, then any others sorted."""
    present = set(_map(results.get("modes")))
    return [m for m in MODES if m in present] + sorted(present - set(MODES))


def _commands(results: Mapping[str, Any]) -> list[CommandRecord]:
    """The well-formed records of results["commands"] (others are skipped)."""
    raw = results.get("commands")
    out: list[CommandRecord] = []
    if not isinstance(raw, list):
        return out
    for rec in raw:
        r = _map(rec)
        median, wall, region = (
            _num(r.get("median_ms")),
            _num(r.get("wall_s")),
            _num(r.get("region_s")),
        )
        regions = r.get("regions", 0)
        names = [r.get(k) for k in ("mode", "task", "variant")]
        if median is None or not all(isinstance(n, str) for n in names):
            continue
        out.append(
            {
                "mode": str(names[0]),
                "task": str(names[1]),
                "variant": str(names[2]),
                "median_ms": median,
                "wall_s": wall or 0.0,
                "region_s": region or 0.0,
                "regions": regions if isinstance(regions, int) else 0,
            }
        )
    return out


# --- targets -------------------------------------------------------------------------------------


def target_values(results: Mapping[str, Any]) -> TargetValues:
    """The thresholds to check: the module's constants, overridden by results["targets"].

    Recognised override keys (fractions, like the rest of results.json): "throughput_ratio",
    "throughput_aim", "inflation_p95" (band -> fraction), "inflation_excess" and "flip_margin".
    Others are ignored.

    Raises:
        ValueError: If an override is not a positive finite number.
    """
    over = _map(results.get("targets"))

    def pick(key: str, default: float, given: object) -> float:
        if given is None:
            return default
        value = _num(given)
        if value is None or value <= 0:
            raise ValueError(f"Target {key} must be a positive number, not {given!r}.")
        return value

    bands = _map(over.get("inflation_p95"))
    return {
        "throughput_ratio": pick(
            "throughput_ratio", TARGET_THROUGHPUT_RATIO, over.get("throughput_ratio")
        ),
        "throughput_aim": pick("throughput_aim", TARGET_THROUGHPUT_AIM, over.get("throughput_aim")),
        "inflation_p95": {
            band: pick(f"inflation_p95[{band}]", limit, bands.get(band))
            for band, limit in TARGET_INFLATION_P95.items()
        },
        "inflation_excess": pick(
            "inflation_excess", TARGET_EXCESS_P95, over.get("inflation_excess")
        ),
        "flip_margin": pick("flip_margin", TARGET_FLIP_MARGIN, over.get("flip_margin")),
    }


def _verdict(value: float | None, limit: float, *, at_least: bool = False) -> Status:
    """n/a without a value, else met when `value` is at most (or at least) `limit`."""
    if value is None:
        return "n/a"
    ok = value >= limit - _EPS if at_least else value <= limit + _EPS
    return "met" if ok else "missed"


def targets(results: Mapping[str, Any]) -> list[TargetRow]:
    """The krex mode checked against the targets: throughput, p95 inflation per band, flips.

    A row is "n/a" when its measurement is missing (no krex run, an empty band, no pairs in a
    gap class, no native_repeat run). The flip rate is one-sided: flipping less often than the
    native repeat is never a miss.

    Args:
        results: A results.json document (or `summarize` output).

    The failures row is met when no command of a krex mode present (`KREX_MODES`) failed
    only when shared (it succeeded in the exclusive run), n/a when no krex mode ran or the
    results do not count failures.

    Each band has two rows: against the paper's figure, and krex's excess over the native
    repeat (`TARGET_EXCESS_P95`), which separates krex's own error from the GPU's noise.

    Returns:
        One `TargetRow` per target: throughput, then each band of `BANDS` (both rows), then
        each gap class, then the failures row.

    Raises:
        ValueError: If results["targets"] holds a bad threshold.
    """
    goal = target_values(results)
    return [
        _throughput_row(results, goal),
        *_inflation_rows(results, goal),
        *_flip_rows(results, goal),
        _shared_failures_row(results),
    ]


def _throughput_row(results: Mapping[str, Any], goal: TargetValues) -> TargetRow:
    """The krex mode's throughput against the exclusive run's, with the aim beside the goal."""
    ratio = _num(_map(results.get("throughput_ratio_vs_exclusive")).get("krex"))
    aim = goal["throughput_aim"]
    note = "" if ratio is None else ("; aim reached" if ratio >= aim - _EPS else "; below aim")
    return {
        "target": "throughput ratio vs exclusive",
        "goal": f">= {goal['throughput_ratio']:.2f}x (aim {aim:.2f}x)",
        "value": ratio,
        "shown": "n/a" if ratio is None else f"{ratio:.2f}x{note}",
        "status": _verdict(ratio, goal["throughput_ratio"], at_least=True),
    }


def _inflation_rows(results: Mapping[str, Any], goal: TargetValues) -> list[TargetRow]:
    """Per band, the p95 inflation against the paper's figure and against the native repeat."""
    p95 = _map(_map(results.get("inflation_p95")).get("krex"))
    p95_native = _map(_map(results.get("inflation_p95")).get("native_repeat"))
    excess = goal["inflation_excess"]
    rows: list[TargetRow] = []
    for band, limit in goal["inflation_p95"].items():
        value = _num(p95.get(band))
        rows.append(
            {
                "target": f"p95 inflation {band}",
                "goal": f"<= {_pct(limit)}",
                "value": value,
                "shown": _pct(value),
                "status": _verdict(value, limit),
            }
        )
        floor = _num(p95_native.get(band))
        gap = None if value is None or floor is None else value - floor
        rows.append(
            {
                "target": f"p95 inflation {band} vs native_repeat",
                "goal": f"<= native_repeat + {excess * 100:.2f} points",
                "value": gap,
                "shown": "n/a"
                if gap is None
                else f"{gap * 100:+.2f} points ({_pct(value)} vs {_pct(floor)})",
                "status": _verdict(gap, excess),
            }
        )
    return rows


def _flip_rows(results: Mapping[str, Any], goal: TargetValues) -> list[TargetRow]:
    """Per gap class, the krex mode's flip rate against the native repeat's (one-sided)."""
    flips = _map(results.get("flip_rate"))
    krex, native = _map(flips.get("krex")), _map(flips.get("native_repeat"))
    margin = goal["flip_margin"]
    rows: list[TargetRow] = []
    for cls in GAP_CLASSES:
        k, n = _num(krex.get(cls)), _num(native.get(cls))
        diff = None if k is None or n is None else k - n
        rows.append(
            {
                "target": f"flip rate {cls} vs native_repeat",
                "goal": f"<= native_repeat + {margin * 100:.2f} points",
                "value": diff,
                "shown": _flip_shown(results, cls, k, n),
                "status": _verdict(diff, margin),
            }
        )
    return rows


def _flip_shown(results: Mapping[str, Any], cls: str, k: float | None, n: float | None) -> str:
    """'+2.00 points (4.00 % vs 2.00 %; 50 pairs, 95 % interval -5 to +9 points)', or n/a."""
    if k is None or n is None:
        return "n/a"
    shown = f"{(k - n) * 100:+.2f} points ({_pct(k)} vs {_pct(n)}"
    mk, mn = _pairs(results, "krex", cls), _pairs(results, "native_repeat", cls)
    if mk is not None and mn is not None and mk >= 1 and mn >= 1:
        # Few pairs resolve little: say how wide the difference could be.
        lo, hi = difference_interval(round(k * mk), mk, round(n * mn), mn)
        counted = f"{mk} pairs" if mk == mn else f"{mk} and {mn} pairs"
        shown += f"; {counted}, 95 % interval {lo * 100:+.0f} to {hi * 100:+.0f} points"
    return shown + ")"


def _pairs(results: Mapping[str, Any], mode: str, cls: str) -> int | None:
    """How many pairs `mode`'s flip rate of gap class `cls` is over: its own count where the
    results have one (fewer than the exclusive run's where a candidate failed), else the
    exclusive run's."""
    own = _num(_map(_map(results.get("flip_rate_pairs_by_mode")).get(mode)).get(cls))
    count = own if own is not None else _num(_map(results.get("flip_rate_pairs")).get(cls))
    return None if count is None else int(count)


def _shared_failures_row(results: Mapping[str, Any]) -> TargetRow:
    """The target that no command of a krex mode fails only because it shared the GPU."""
    info = _map(results.get("modes"))
    counts = {
        m: _num(_map(info.get(m)).get("failed_only_when_shared")) for m in KREX_MODES if m in info
    }
    total = sum(v for v in counts.values() if v is not None)
    status: Status = "n/a"
    value: float | None = None
    if total > 0:
        status, value = "missed", total
    elif counts and all(v is not None for v in counts.values()):
        status, value = "met", 0.0
    shown = "n/a"
    if any(v is not None for v in counts.values()):
        shown = ", ".join(f"{m} {_fmt(v, '.0f')}" for m, v in counts.items())
    return {
        "target": "no command fails only because it shared (krex)",
        "goal": "0 failed only when shared",
        "value": value,
        "shown": shown,
        "status": status,
    }


# --- formatting ----------------------------------------------------------------------------------


def _pct(value: float | None, signed: bool = False) -> str:
    """A fraction as a percentage with 2 decimals, or n/a."""
    if value is None:
        return "n/a"
    return f"{value * 100:+.2f} %" if signed else f"{value * 100:.2f} %"


def _fmt(value: float | None, spec: str) -> str:
    """`value` formatted by `spec`, or n/a."""
    return "n/a" if value is None else format(value, spec)


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _title_suffix(results: Mapping[str, Any]) -> str:
    """' (simulated GPU)' for a simulated run, for plot titles."""
    return " (simulated GPU)" if results.get("simulated") is True else ""


# --- report.md sections --------------------------------------------------------------------------


def _header(results: Mapping[str, Any]) -> list[str]:
    """Title and run facts; the SIMULATED line first thing after the title when simulated."""
    command = str(results.get("command", "n/a"))
    shown = f"`{command}`" if "`" not in command else command
    lines = ["# KREX bench report", ""]
    if results.get("simulated") is True:
        lines += [
            "SIMULATED GPU: these numbers come from the GPU simulator, not a real GPU; they "
            "exercise the pipeline and say nothing about KREX's real performance.",
            "",
        ]
    lines += [
        f"- Machine: {results.get('machine', 'n/a')}",
        f"- Date: {results.get('date', 'n/a')}",
        f"- Command: {shown}",
        f"- Profile: {results.get('profile', 'n/a')}",
        f"- Concurrency: {results.get('concurrency', 'n/a')}",
    ]
    for mode, on in _map(results.get("mps")).items():
        # krex-mps without MPS (the simulated GPU ignores it) is plain krex: say so.
        lines.append(f"- {mode}: MPS {'in effect' if on is True else 'not in effect'}")
    return lines


def _count(value: object) -> str:
    """A count from results.json, or n/a."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "n/a"


def _throughput(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Throughput per mode: commands tried, succeeded, failed (of which out of memory), failed
    only when shared, wall, cmds/min of commands that succeeded and of all, ratio vs exclusive
    (of commands that succeeded)."""
    info, ratios = _map(results.get("modes")), _map(results.get("throughput_ratio_vs_exclusive"))
    rows = []
    for mode in modes:
        m = _map(info.get(mode))
        failed = _count(m.get("failed"))
        if failed != "n/a":
            failed += f" ({_count(m.get('failed_oom'))})"
        ratio = _num(ratios.get(mode))
        rows.append(
            [
                mode,
                _count(m.get("commands")),
                _count(m.get("succeeded")),
                failed,
                _count(m.get("failed_only_when_shared")),
                _fmt(_num(m.get("wall_s")), ".1f"),
                _fmt(_num(m.get("throughput_cmds_per_min")), ".2f"),
                _fmt(_num(m.get("throughput_all_cmds_per_min")), ".2f"),
                _fmt(ratio, ".2f") + ("x" if ratio is not None else ""),
            ]
        )
    header = [
        "mode",
        "commands",
        "succeeded",
        "failed (out of memory)",
        "failed only when shared",
        "wall (s)",
        "cmds/min",
        "cmds/min (all)",
        "vs exclusive",
    ]
    return [
        "## Throughput",
        "",
        "cmds/min counts the commands that succeeded, cmds/min (all) every command run; "
        "vs exclusive is of commands that succeeded. Failed only when shared: failed here, "
        "succeeded in the exclusive run.",
        "",
        *_table(header, rows),
    ]


def _failures(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Every failed command: mode, command, status, out of memory, only when shared, reason."""
    lines = ["## Failures", ""]
    raw = results.get("failures")
    if not isinstance(raw, Mapping):
        return [*lines, "n/a: these results do not record failures."]
    order = [*modes, *sorted(set(raw) - set(modes))]
    rows = []
    for mode in order:
        listed = raw.get(mode)
        for rec in listed if isinstance(listed, list) else []:
            f = _map(rec)
            status = f.get("status", "n/a")
            rows.append(
                [
                    mode,
                    f"{f.get('task', '?')}/{f.get('variant', '?')}",
                    "time-out" if status is None else str(status),
                    _yes_no(f.get("oom")),
                    _yes_no(f.get("only_when_shared")),
                    _count(f.get("attempts")),
                    str(f.get("reason", "")),
                ]
            )
    if not rows:
        return [*lines, "none: every command succeeded in every mode."]
    header = [
        "mode",
        "command",
        "status",
        "out of memory",
        "only when shared",
        "earlier krex attempts",
        "reason",
    ]
    return [*lines, *_table(header, rows)]


def _choices(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Candidates that pick their own kernel (an autotuner's winner, the `choice` their JSON
    line reports): each mode's choice against the exclusive run's. Empty when none reports one."""
    picked: dict[str, dict[str, str]] = {}  # task/variant -> mode -> choice
    ms: dict[str, dict[str, float]] = {}  # task/variant -> mode -> median
    raw = results.get("commands")
    for rec in raw if isinstance(raw, list) else []:
        r = _map(rec)
        choice = _map(r.get("output")).get("choice")
        names = [r.get(k) for k in ("mode", "task", "variant")]
        if isinstance(choice, str) and all(isinstance(n, str) for n in names):
            cmd = f"{names[1]}/{names[2]}"
            picked.setdefault(cmd, {})[str(names[0])] = choice
            median = r.get("median_ms")
            if isinstance(median, (int, float)) and median > 0:
                ms.setdefault(cmd, {})[str(names[0])] = float(median)
    if not picked:
        return []
    others = [m for m in modes if m != "exclusive"]
    rows, same, counted = [], dict.fromkeys(others, 0), dict.fromkeys(others, 0)
    for cmd, by in sorted(picked.items()):
        ex = by.get("exclusive")
        row = [cmd, ex or "n/a"]
        for m in others:
            got = by.get(m)
            if got is None or ex is None:
                row.append("n/a")
                continue
            counted[m] += 1
            same[m] += got == ex
            cell = "same" if got == ex else got
            times = ms.get(cmd, {})
            if m in times and "exclusive" in times:  # the pick's timing beside it
                cell += f" ({_pct(times[m] / times['exclusive'] - 1, signed=True)})"
            row.append(cell)
        rows.append(row)
    summary = ", ".join(f"{m} {same[m]} of {counted[m]}" for m in others if counted[m])
    return [
        "## Autotuners' choices",
        "",
        "The kernel each self-tuning candidate picked (its JSON line's `choice`), per mode against "
        "the exclusive run's, with that mode's timing of it against the exclusive run's "
        f"(inflation). The same as exclusive: {summary or 'n/a'}.",
        "",
        *_table(["command", "exclusive", *others], rows),
    ]


def _yes_no(value: object) -> str:
    """yes / no for a bool, n/a for anything else."""
    return ("yes" if value else "no") if isinstance(value, bool) else "n/a"


def _memory_waits(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Per mode, the device-memory wait of the commands that succeeded with a krex report."""
    lines = ["## Memory waits", ""]
    info = _map(results.get("modes"))
    rows = []
    for mode in modes:
        w = _map(_map(info.get(mode)).get("memory_wait_s"))
        n = w.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            continue
        rows.append(
            [
                mode,
                _fmt(_num(w.get("p50")), ".3f"),
                _fmt(_num(w.get("p95")), ".3f"),
                _fmt(_num(w.get("max")), ".3f"),
                str(n),
            ]
        )
    if not rows:
        return [*lines, "n/a: no krex report with memory figures."]
    return [
        *lines,
        "Time a command waited for device memory (its krex report's `memory.wait_s`), over the "
        "commands that succeeded.",
        "",
        *_table(["mode", "p50 (s)", "p95 (s)", "max (s)", "commands"], rows),
    ]


def _inflation(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Inflation per mode and band: signed p50, absolute p95/p99, n."""
    infl = _map(results.get("inflation"))
    rows = []
    for mode in modes:
        for band in BANDS:
            s = _map(_map(infl.get(mode)).get(band))
            rows.append(
                [
                    mode,
                    band,
                    _pct(_num(s.get("p50")), signed=True),
                    _pct(_num(s.get("p95"))),
                    _pct(_num(s.get("p99"))),
                    str(s.get("n", 0)),
                ]
            )
    return [
        "## Timing inflation vs exclusive",
        "",
        "Median over exclusive median, minus 1; p50 signed, p95/p99 of the absolute value. "
        "Bands by the exclusive median and nested.",
        "",
        *_table(["mode", "band", "p50", "p95 (abs)", "p99 (abs)", "n"], rows),
    ]


def _flips(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Flip rate per gap class (rows) and mode (columns), with flips/pairs."""
    rates, pairs = _map(results.get("flip_rate")), _map(results.get("flip_rate_pairs"))
    # native_repeat first, so every other mode sits next to the floor it is judged against.
    compared = sorted((m for m in modes if m in rates), key=lambda m: m != "native_repeat")
    if not compared:
        return ["## Ranking flips vs exclusive", "", "n/a: no mode besides exclusive."]
    rows = []
    for cls in GAP_CLASSES:
        n = pairs.get(cls)
        count = n if isinstance(n, int) and not isinstance(n, bool) else 0
        row = [cls, str(count)]
        for mode in compared:
            rate = _num(_map(rates.get(mode)).get(cls))
            # results.json keeps rates and pair counts; flips = rate * pairs is exact up to float.
            own = _pairs(results, mode, cls)
            m = count if own is None else own
            row.append("n/a" if rate is None else f"{_pct(rate)} ({round(rate * m)}/{m})")
        rows.append(row)
    return [
        "## Ranking flips vs exclusive",
        "",
        "Share of same-task candidate pairs ordered differently from exclusive, by exclusive gap "
        "(pairs: the exclusive run's; a mode's own count is fewer where a candidate failed).",
        "",
        *_table(["gap class", "pairs", *compared], rows),
    ]


def _tau(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Median Kendall tau-b per mode, with how many tasks define it."""
    medians, per_task = _map(results.get("kendall_tau_median")), _map(results.get("kendall_tau"))
    rows = []
    for mode in modes:
        tasks = _map(per_task.get(mode))
        defined = sum(_num(t) is not None for t in tasks.values())
        rows.append([mode, _fmt(_num(medians.get(mode)), ".3f"), f"{defined}/{len(tasks)}"])
    return [
        "## Ranking fidelity (Kendall tau-b vs exclusive)",
        "",
        *_table(["mode", "median tau-b", "tasks with tau"], rows),
    ]


def _region_share(results: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
    """Median region share of wall time per mode."""
    shares = _map(results.get("region_share_median_by_mode"))
    rows = [[mode, _pct(_num(shares.get(mode)))] for mode in modes]
    return [
        "## Region share of wall time",
        "",
        f"krex: {_pct(_num(results.get('region_share_median')))} (median over commands).",
        "",
        *_table(["mode", "median region share"], rows),
    ]


def _region_times(results: Mapping[str, Any]) -> list[str]:
    """krex's region wait/drain/freeze/duration p50/p95/max in ms, and the unclean count."""
    lines = ["## Region times (krex)", ""]
    stats = _map(_map(results.get("region_times")).get("krex"))
    if not stats:
        return [*lines, "n/a: no krex run."]

    def ms(v: object) -> str:
        value = _num(v)
        return _fmt(None if value is None else value * 1000, ".3f")

    rows = []
    for field in REGION_FIELDS:
        s = _map(stats.get(field))
        name = field.removesuffix("_s")
        rows.append(
            [name, ms(s.get("p50")), ms(s.get("p95")), ms(s.get("max")), str(s.get("n", 0))]
        )
    return [
        *lines,
        *_table(["field", "p50 (ms)", "p95 (ms)", "max (ms)", "regions"], rows),
        "",
        f"Unclean regions: {stats.get('unclean', 'n/a')}",
        "",
        "Region warnings (clean regions whose GPU was power-capped, after heavy work, or shared "
        "its memory; docs/user-guide.md): "
        + (", ".join(f"{k} {v}" for k, v in _map(stats.get("warnings")).items()) or "none"),
    ]


def _targets(rows: Sequence[TargetRow]) -> list[str]:
    """The Targets table."""
    return [
        "## Targets (krex)",
        "",
        *_table(
            ["target", "goal", "measured", "status"],
            [[r["target"], r["goal"], r["shown"], r["status"]] for r in rows],
        ),
    ]


# --- plots ---------------------------------------------------------------------------------------


def _matplotlib() -> tuple[Any, Any] | None:
    """(matplotlib.figure.Figure, FigureCanvasAgg), or None when matplotlib is not installed.

    Imported by name, typed Any: matplotlib is an optional dependency, and this way mypy passes
    whether or not it is installed. The Agg canvas is used directly, not pyplot, so rendering
    neither changes a global backend nor keeps figures alive in pyplot's registry.
    """
    try:
        figure = importlib.import_module("matplotlib.figure")
        agg = importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError:
        return None
    return figure.Figure, agg.FigureCanvasAgg


def _save(mpl: tuple[Any, Any], fig: Any, path: Path) -> Path:
    """Draw `fig` with Agg and save it as PNG at `path`."""
    mpl[1](fig)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    return path


def _plot_throughput(
    mpl: tuple[Any, Any], results: Mapping[str, Any], modes: Sequence[str], path: Path
) -> Path:
    """Bars of cmds/min per mode, each labelled with its ratio vs exclusive."""
    info, ratios = _map(results.get("modes")), _map(results.get("throughput_ratio_vs_exclusive"))
    values = [_num(_map(info.get(m)).get("throughput_cmds_per_min")) or 0.0 for m in modes]
    every = [_num(_map(info.get(m)).get("throughput_all_cmds_per_min")) for m in modes]
    fig = mpl[0](figsize=(7, 4))
    ax = fig.add_subplot()
    if any(a is not None and a > v for a, v in zip(every, values, strict=True)):
        # Where commands failed: all commands run, behind those that succeeded.
        ax.bar(modes, [a or 0.0 for a in every], color="tab:gray", alpha=0.4, label="all run")
    bars = ax.bar(modes, values, color="tab:blue", label="succeeded")
    labels = [_fmt(_num(ratios.get(m)), ".2f") + "x" for m in modes]
    ax.bar_label(bars, labels=labels, padding=2)
    if len(ax.patches) > len(modes):
        ax.legend(fontsize="small")
    ax.set_ylabel("commands / min")
    ax.set_title("Throughput per mode (label: vs exclusive)" + _title_suffix(results))
    ax.margins(y=0.15)
    return _save(mpl, fig, path)


def _abs_inflation(commands: Sequence[CommandRecord]) -> dict[str, dict[str, list[float]]]:
    """mode -> band -> |inflation| per command against the exclusive median, sorted."""
    base = {(c["task"], c["variant"]): c["median_ms"] for c in commands if c["mode"] == BASELINE}
    out: dict[str, dict[str, list[float]]] = {}
    for c in commands:
        ref = base.get((c["task"], c["variant"]))
        if c["mode"] == BASELINE or ref is None or ref <= 0:
            continue
        bands = out.setdefault(c["mode"], {band: [] for band in BANDS})
        for band, threshold_ms in BANDS.items():
            if ref > threshold_ms:
                bands[band].append(abs(c["median_ms"] / ref - 1.0))
    for bands in out.values():
        for values in bands.values():
            values.sort()
    return out


def _plot_inflation_cdf(
    mpl: tuple[Any, Any], results: Mapping[str, Any], modes: Sequence[str], path: Path
) -> Path:
    """One panel per band: the CDF of |inflation| (%) of each mode, symlog x."""
    data = _abs_inflation(_commands(results))
    fig = mpl[0](figsize=(12, 4))
    axes = fig.subplots(1, len(BANDS), sharey=True)
    for ax, band in zip(axes, BANDS, strict=True):
        drawn = False
        for mode in modes:
            values = data.get(mode, {}).get(band, [])
            if not values:
                continue
            # Start each curve at (smallest, 0) so the first step is drawn, not just its top.
            pct = [values[0] * 100] + [v * 100 for v in values]
            ys = [i / len(values) for i in range(len(values) + 1)]
            ax.step(pct, ys, where="post", label=f"{mode} (n={len(values)})")
            drawn = True
        # symlog, not log: a command that reproduces its exclusive median exactly has 0 %.
        ax.set_xscale("symlog", linthresh=0.01)
        # A little left of 0, so that a curve standing at exactly 0 % is not hidden by the axis.
        ax.set_xlim(left=-0.002)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"baseline median {band}")
        ax.set_xlabel("|inflation| vs exclusive (%)")
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize="small", loc="best")
        else:
            ax.text(0.5, 0.5, "n/a: no commands", ha="center", transform=ax.transAxes)
    axes[0].set_ylabel("share of commands")
    fig.suptitle("Timing inflation CDF" + _title_suffix(results))
    return _save(mpl, fig, path)


def _median_split(commands: Sequence[CommandRecord], mode: str) -> tuple[float, float] | None:
    """(region, rest) seconds of the median wall time of `mode`'s timed commands."""
    timed = [c for c in commands if c["mode"] == mode and c["wall_s"] > 0]
    if not timed:
        return None
    wall = statistics.median(c["wall_s"] for c in timed)
    # Medians of wall and region time need not add up; split the median wall by the median share.
    share = min(1.0, statistics.median(c["region_s"] / c["wall_s"] for c in timed))
    return wall * share, wall * (1 - share)


def _plot_time_split(
    mpl: tuple[Any, Any], results: Mapping[str, Any], modes: Sequence[str], path: Path
) -> Path:
    """Left: per mode, median wall split into region time and the rest. Right: krex's regions."""
    commands = _commands(results)
    krex = _map(_map(results.get("region_times")).get("krex"))
    per_region = {f: _num(_map(krex.get(f)).get("p50")) for f in REGION_FIELDS}
    has_regions = any(v is not None for v in per_region.values())
    fig = mpl[0](figsize=(11 if has_regions else 7, 4))
    axes = fig.subplots(1, 2 if has_regions else 1, squeeze=False)[0]

    ax = axes[0]
    splits = {m: _median_split(commands, m) for m in modes}
    shown = [m for m in modes if splits[m] is not None]
    region = [s[0] for m in shown if (s := splits[m]) is not None]
    rest = [s[1] for m in shown if (s := splits[m]) is not None]
    ax.bar(shown, region, label="in regions", color="tab:red")
    ax.bar(shown, rest, bottom=region, label="rest", color="tab:gray")
    ax.set_ylabel("median command wall (s)")
    ax.set_title("Where a command's time goes")
    ax.legend(fontsize="small")
    if not shown:
        ax.text(0.5, 0.5, "n/a: no wall times", ha="center", transform=ax.transAxes)

    if has_regions:
        ax = axes[1]
        bottom = 0.0
        colors = ("tab:orange", "tab:purple", "tab:cyan", "tab:red")
        for field, color in zip(REGION_FIELDS, colors, strict=True):
            ms = (per_region[field] or 0.0) * 1000
            ax.bar(
                ["krex region (p50)"],
                [ms],
                bottom=bottom,
                label=field.removesuffix("_s"),
                color=color,
            )
            bottom += ms
        ax.set_ylabel("ms per region (p50 of each part)")
        ax.set_title("krex region: wait / drain / freeze / duration")
        ax.legend(fontsize="small")
    fig.suptitle("Time split" + _title_suffix(results))
    return _save(mpl, fig, path)


# --- render --------------------------------------------------------------------------------------


def render(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write out_dir/report.md and, when matplotlib is installed, the `PLOTS`.

    Args:
        results: A results.json document: `summarize` output plus "commands" and the optional
            "simulated", "profile" and "targets". Only this is read.
        out_dir: Where to write; created if missing. Existing files of the same names are replaced.

    Returns:
        The written paths: report.md first, then the plots.

    Raises:
        ValueError: If `results` is not a mapping or results["targets"] holds a bad threshold.
    """
    if not isinstance(results, Mapping):
        raise ValueError(f"Results must be a mapping, not {type(results).__name__}.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    modes = _modes(results)
    rows = targets(results)

    plots: list[Path] = []
    notes: list[str] = []
    mpl = _matplotlib()
    if mpl is None:
        notes.append(NO_MATPLOTLIB)
    else:
        plots.append(_plot_throughput(mpl, results, modes, out_dir / PLOTS[0]))
        if _commands(results):
            plots.append(_plot_inflation_cdf(mpl, results, modes, out_dir / PLOTS[1]))
            plots.append(_plot_time_split(mpl, results, modes, out_dir / PLOTS[2]))
        else:
            notes.append(f"{PLOTS[1]} and {PLOTS[2]} skipped: results have no per-command records")

    sections = [
        _header(results),
        _throughput(results, modes),
        _failures(results, modes),
        _inflation(results, modes),
        _choices(results, modes),
        _flips(results, modes),
        _tau(results, modes),
        _region_share(results, modes),
        _region_times(results),
        _memory_waits(results, modes),
        _targets(rows),
        [
            "## Plots",
            "",
            # Blank lines between images, so each renders as its own paragraph.
            "\n\n".join([*(f"![{p.stem}]({p.name})" for p in plots), *(f"{n}." for n in notes)]),
        ],
    ]
    report = out_dir / "report.md"
    text = "\n\n".join("\n".join(s) for s in sections if s)  # a section with nothing to say: none
    report.write_text(text + "\n", encoding="utf-8")
    return [report, *plots]
