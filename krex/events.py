"""Plain CUDA-event timing loops in regions (auto-regions, issue #18).

Many harnesses time with CUDA events and nothing else: `start.record(); fn(); end.record();
torch.cuda.synchronize(); start.elapsed_time(end)`, once around a loop or once per trial
(KernelBench's cuda_event timer is one of them). No named function marks that timing, so
auto-regions watch the events themselves: when a thread that is not in a region records a
`torch.cuda.Event` made with `enable_timing=True`, a region begins before the record; it ends
when that thread next reads `elapsed_time` (the measurement is then complete). One region per
trial for per-trial timing, one for a loop timed as a whole. Events made without timing (used
to order streams) never start one, nor does a record inside a region already open (do_bench's
own events) or during CUDA graph capture.

A thread that records timing events and never reads them would keep its region open: such a
region is ended at the thread's next timing record once it has lasted MAX_S, and the daemon
revokes any region after its time-out. Raw driver events (cupy, C++ harnesses) are not seen.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

from krex.markers import WRAPPED_MARK, in_region, region

MAX_S = 10.0
"""An event region still open this long is ended at the thread's next timing record."""

_TIMING = "_krex_timing"
_open = threading.local()  # .since: time.monotonic() when this thread's event region began


def install() -> None:
    """Wrap torch.cuda.Event's constructor, record and elapsed_time (once torch is imported)."""
    torch: Any = sys.modules.get("torch")
    event: Any = getattr(getattr(torch, "cuda", None), "Event", None)
    if event is None or getattr(event.record, WRAPPED_MARK, False):
        return
    new, record, elapsed = event.__new__, event.record, event.elapsed_time

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        obj = new(cls, *args, **kwargs)
        timing = kwargs.get("enable_timing", args[0] if args else False)
        with contextlib.suppress(AttributeError):  # no instance dict: never timing for us
            setattr(obj, _TIMING, bool(timing))
        return obj

    def wrapped_record(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, _TIMING, False):
            since = getattr(_open, "since", None)
            if since is not None and time.monotonic() - since > MAX_S:
                _close()  # never read: do not hold the GPU for the rest of the program
            if not in_region() and not _capturing(torch):
                region().__enter__()
                _open.since = time.monotonic()
        return record(self, *args, **kwargs)

    def wrapped_elapsed(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return elapsed(self, *args, **kwargs)
        finally:
            _close()

    for fn, orig in ((wrapped_record, record), (wrapped_elapsed, elapsed)):
        fn.__name__, fn.__doc__ = orig.__name__, orig.__doc__
        fn.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(fn, WRAPPED_MARK, True)
    event.__new__ = staticmethod(__new__)
    event.record = wrapped_record
    event.elapsed_time = wrapped_elapsed


def _close() -> None:
    """End this thread's event region, if it has one."""
    if getattr(_open, "since", None) is None:
        return
    _open.since = None
    region().__exit__(None, None, None)


def _capturing(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return False
