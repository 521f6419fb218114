"""Plain CUDA-event timing loops in regions (auto-regions: docs/user-guide.md).

Many harnesses time with CUDA events and nothing else: `start.record(); fn(); end.record();
torch.cuda.synchronize(); start.elapsed_time(end)`, once around a loop or once per trial
(KernelBench's cuda_event timer is one of them). No named function marks that timing, so
auto-regions watch the events themselves: when a thread that is not in a region records a
`torch.cuda.Event` made with `enable_timing=True`, a region begins before the record; it ends
when that thread next reads `elapsed_time` (the measurement is then complete). Like every
auto-region it lingers (krex/tenant/markers.py): the next trial's record, well within
KREX_REGION_LINGER_S, continues it, so a per-trial loop is one region with no sibling work
between its trials, as a loop timed as a whole is. Events made without timing (used
to order streams) never start one, nor does a record inside a region already open (do_bench's
own events) or during CUDA graph capture.

Cost inside the timed interval, where it would count: none. Only timing events made outside a
region get the watching `record` (an attribute of the event, not of the class: events made
inside a region, as do_bench's and Inductor's are, keep torch's own), and while this thread's
event region is open the events it watched record through torch's own `record` again.

A thread that records timing events and never reads them would keep its region open: such a
region is ended when the thread makes its next timing event, once it has lasted MAX_S (events
are made outside timed intervals; records inside them are left alone), and the daemon revokes
any region after its time-out. Raw driver events (cupy, C++ harnesses) are not seen.
"""

from __future__ import annotations

import contextlib
import threading
import time
import types
import weakref
from typing import Any

from krex.tenant.markers import WRAPPED_MARK, auto_region, region_depth

MAX_S = 10.0
"""An event region still open this long is ended when the thread makes its next timing event."""


class _Thread(threading.local):
    def __init__(self) -> None:
        self.since: float | None = None  # time.monotonic() when this thread's region began
        self.watched: weakref.WeakSet[Any] = weakref.WeakSet()


_thread = _Thread()
LABEL = "torch.cuda.Event (timing)"  # its regions' name in the record's `calls`


def install(torch: Any) -> None:
    """Watch torch.cuda.Event's timing events (called with torch once it is imported)."""
    event: Any = getattr(getattr(torch, "cuda", None), "Event", None)
    if event is None or getattr(event.__new__, WRAPPED_MARK, False):
        return
    new, record, elapsed = event.__new__, event.record, event.elapsed_time

    def watched_record(self: Any, *args: Any, **kwargs: Any) -> Any:
        if region_depth() == 0 and not _capturing(torch):
            auto_region(LABEL).__enter__()
            _thread.since = time.monotonic()
            for ev in list(_thread.watched):  # torch's own record while the region is open
                ev.__dict__.pop("record", None)
        return record(self, *args, **kwargs)

    def watched_elapsed(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return elapsed(self, *args, **kwargs)
        finally:
            end()

    def end() -> None:
        """End this thread's event region and watch its events' records again."""
        if _thread.since is None:
            return
        _thread.since = None
        auto_region(LABEL).__exit__(None, None, None)
        for ev in list(_thread.watched):
            ev.record = types.MethodType(watched_record, ev)

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        obj = new(cls, *args, **kwargs)
        if not kwargs.get("enable_timing", args[0] if args else False):
            return obj
        since = _thread.since
        if since is not None and region_depth() == 1 and time.monotonic() - since > MAX_S:
            end()  # never read: do not hold the GPU for the rest of the program
        if region_depth() == 0:
            with contextlib.suppress(AttributeError, TypeError):  # no dict or no weakref
                obj.record = types.MethodType(watched_record, obj)
                obj.elapsed_time = types.MethodType(watched_elapsed, obj)
                _thread.watched.add(obj)
        return obj

    setattr(__new__, WRAPPED_MARK, True)
    event.__new__ = staticmethod(__new__)


def _capturing(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return False
