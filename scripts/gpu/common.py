"""Helpers for the GPU check programs: read this process's own KREX slot, print one JSON result.

Each check program runs under LD_PRELOAD=libkrex.so with KREX_SHM/KREX_TENANT/KREX_GPU set by
scripts/gpu/check.py; it counts what the shim intercepted around a loop whose number of
work-submitting driver calls is known independently (a loop count or the torch profiler).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from krex.core.shm import Segment

_seg: Segment | None = None
results: list[dict[str, Any]] = []


def counts() -> tuple[int, int]:
    """(intercepted, unmatched) of this process's slot; (0, 0) before its first call."""
    global _seg
    if _seg is None:
        _seg = Segment.attach(os.environ["KREX_SHM"])
    mine = [s for s in _seg.slots_of(os.getpid()) if s.alive]
    if not mine:
        return 0, 0
    return mine[0].intercepted, mine[0].unmatched


def measure(body: Callable[[], Any], sync: Callable[[], Any]) -> int:
    """Calls the shim intercepted while body ran (synchronised before and after)."""
    sync()
    c0, _ = counts()
    body()
    sync()
    return counts()[0] - c0


def expect(name: str, expected: int, got: int) -> None:
    """Record whether the shim counted exactly the independently known number of calls."""
    results.append({"check": name, "expected": expected, "intercepted": got, "ok": got == expected})


def window(name: str, expected: int, body: Callable[[], Any], sync: Callable[[], Any]) -> None:
    """Run body and record whether the shim counted exactly `expected` calls."""
    expect(name, expected, measure(body, sync))


def check(name: str, ok: bool, **detail: Any) -> None:
    """Record a correctness check."""
    results.append({"check": name, "ok": bool(ok), **detail})


def finish(program: str) -> int:
    """Print the program's results as one JSON line; exit status 0 only if all passed."""
    _, unmatched = counts()
    ok = all(r["ok"] for r in results) and unmatched == 0
    print(json.dumps({"program": program, "ok": ok, "unmatched": unmatched, "results": results}))
    sys.stdout.flush()
    return 0 if ok else 1
