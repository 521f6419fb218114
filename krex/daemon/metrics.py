"""What the daemon counts for operators: recent-region statistics for `krex status`/`krex top`,
and, when asked for (`--metrics-port`, `[metrics] port`), a Prometheus endpoint.

The Prometheus names (prefix `krex_`), all labelled by `gpu`:

| metric | kind | what |
| --- | --- | --- |
| `krex_commands_admitted_total` | counter | commands given a slot |
| `krex_commands_finished_total` | counter | commands that left their slot |
| `krex_starts_total{pool}` | counter | commands started `warm` (in a pool worker) or `cold` |
| `krex_regions_total` | counter | regions ended |
| `krex_regions_unclean_total` | counter | of those, regions whose report says clean = false |
| `krex_regions_revoked_total` | counter | of those, regions revoked (time-out, daemon stopping) |
| `krex_region_wait_seconds` | histogram | from asking for a region to its grant |
| `krex_region_drain_seconds` | histogram | quiesce and drain of the siblings |
| `krex_region_freeze_seconds` | histogram | freezing the siblings |
| `krex_region_duration_seconds` | histogram | from grant to end |
| `krex_queue_length` | gauge | commands waiting for a slot |
| `krex_region_queue_length` | gauge | region requests waiting for the GPU |
| `krex_slots_used` | gauge | slots held |
| `krex_pool_idle_workers` | gauge | warm workers waiting for a command |

prometheus-client is optional (`pip install 'krex[metrics]'`): without it the endpoint cannot
be turned on, and everything else works.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from krex.core.errors import KrexError

WINDOW_S = 60.0  # what "recent" means in krex status / krex top
NAMES = (
    "krex_commands_admitted_total",
    "krex_commands_finished_total",
    "krex_starts_total",
    "krex_regions_total",
    "krex_regions_unclean_total",
    "krex_regions_revoked_total",
    "krex_region_wait_seconds",
    "krex_region_drain_seconds",
    "krex_region_freeze_seconds",
    "krex_region_duration_seconds",
    "krex_queue_length",
    "krex_region_queue_length",
    "krex_slots_used",
    "krex_pool_idle_workers",
)
# Regions last from well under a millisecond (setup) to minutes (a long do_bench).
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class MetricsError(KrexError):
    """The endpoint cannot be served; the message says why."""


@dataclass
class _Recent:
    """Regions of one GPU that ended within the window: (end time, record)."""

    ended: deque[tuple[float, Mapping[str, Any]]] = field(default_factory=deque)

    def add(self, rec: Mapping[str, Any]) -> None:
        self.ended.append((time.monotonic(), rec))
        self._trim()

    def _trim(self) -> None:
        cut = time.monotonic() - WINDOW_S
        while self.ended and self.ended[0][0] < cut:
            self.ended.popleft()

    def summary(self) -> dict[str, Any]:
        self._trim()
        recs = [r for _, r in self.ended]

        def ms(key: str, q: float) -> float | None:
            values = sorted(float(r[key]) for r in recs)
            if not values:
                return None
            if len(values) == 1:
                return 1000 * values[0]
            return 1000 * statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]

        return {
            "window_s": WINDOW_S,
            "regions": len(recs),
            "regions_per_min": len(recs) * 60.0 / WINDOW_S,
            "unclean": sum(not r["clean"] for r in recs),
            "wait_ms_p50": ms("wait_s", 50),
            "wait_ms_p95": ms("wait_s", 95),
            "drain_ms_p50": ms("drain_s", 50),
            "drain_ms_p95": ms("drain_s", 95),
        }


class Metrics:
    """The daemon's counters. `serve(port)` also exports them to Prometheus."""

    def __init__(self, n_gpus: int) -> None:
        self.recent = [_Recent() for _ in range(n_gpus)]
        self._prom: dict[str, Any] | None = None

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Start the Prometheus endpoint (a thread of prometheus-client's)."""
        try:
            import prometheus_client as pc
        except ImportError:
            raise MetricsError(
                "the metrics endpoint needs prometheus-client (pip install 'krex[metrics]')"
            ) from None
        reg = pc.CollectorRegistry()
        gpu = ("gpu",)
        m: dict[str, Any] = {}
        for key, kind, name, doc, labels in (
            ("admitted", pc.Counter, "krex_commands_admitted", "commands given a slot", gpu),
            (
                "finished",
                pc.Counter,
                "krex_commands_finished",
                "commands that left their slot",
                gpu,
            ),
            ("starts", pc.Counter, "krex_starts", "commands started warm or cold", (*gpu, "pool")),
            ("regions", pc.Counter, "krex_regions", "regions ended", gpu),
            ("unclean", pc.Counter, "krex_regions_unclean", "regions not clean", gpu),
            ("revoked", pc.Counter, "krex_regions_revoked", "regions revoked", gpu),
            ("queue", pc.Gauge, "krex_queue_length", "commands waiting for a slot", gpu),
            ("region_queue", pc.Gauge, "krex_region_queue_length", "region requests waiting", gpu),
            ("slots", pc.Gauge, "krex_slots_used", "slots held", gpu),
            ("idle", pc.Gauge, "krex_pool_idle_workers", "warm workers waiting", gpu),
        ):
            m[key] = kind(name, doc, labels, registry=reg)
        for key in ("wait", "drain", "freeze", "duration"):
            m[key] = pc.Histogram(
                f"krex_region_{key}_seconds",
                f"region {key} time",
                gpu,
                buckets=_BUCKETS,
                registry=reg,
            )
        # Every series exists from the start (a zero is news too: no unclean region yet).
        for g in map(str, range(len(self.recent))):
            for key, metric in m.items():
                if key == "starts":
                    metric.labels(g, "warm")
                    metric.labels(g, "cold")
                else:
                    metric.labels(g)
        try:
            pc.start_http_server(port, addr=address, registry=reg)
        except OSError as e:
            raise MetricsError(f"cannot serve metrics on {address}:{port}: {e.strerror}") from e
        self._prom = m

    # Events.
    def admitted(self, gpu: int) -> None:
        if self._prom:
            self._prom["admitted"].labels(str(gpu)).inc()

    def finished(self, gpu: int) -> None:
        if self._prom:
            self._prom["finished"].labels(str(gpu)).inc()

    def started(self, gpu: int, warm: bool) -> None:
        if self._prom:
            self._prom["starts"].labels(str(gpu), "warm" if warm else "cold").inc()

    def region(self, gpu: int, rec: Mapping[str, Any]) -> None:
        self.recent[gpu].add(rec)
        if not self._prom:
            return
        g = str(gpu)
        self._prom["regions"].labels(g).inc()
        if not rec["clean"]:
            self._prom["unclean"].labels(g).inc()
        if rec["revoked"]:
            self._prom["revoked"].labels(g).inc()
        for key in ("wait", "drain", "freeze", "duration"):
            self._prom[key].labels(g).observe(float(rec[f"{key}_s"]))

    def levels(self, gpu: int, *, queue: int, region_queue: int, slots: int, idle: int) -> None:
        if not self._prom:
            return
        g = str(gpu)
        self._prom["queue"].labels(g).set(queue)
        self._prom["region_queue"].labels(g).set(region_queue)
        self._prom["slots"].labels(g).set(slots)
        self._prom["idle"].labels(g).set(idle)
