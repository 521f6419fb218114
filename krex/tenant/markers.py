"""Region markers: `with krex.region():`, `@krex.region()` and `krex region -- CMD`.

Inside a tenant (`KREX_SOCKET` and `KREX_TENANT` set by `krex run`), the outermost region of a
thread opens a connection of its own to the daemon, sends `region_begin` and holds the
connection until `region_end` (docs/protocol.md); nested regions of that thread only count.
Outside krex every marker is a no-op that costs a cached look-up.

Auto-regions (krex/tenant/autoregions.py) end lazily: an `auto_region()` left by its thread stays
held for KREX_REGION_LINGER_S (default 5 ms), and a region the thread begins in that time continues
it, with no new drain or freeze. An autotuner's configurations, timed one after another, and a
harness's trials, each between its own CUDA events, are so timed in one region, under the same
conditions, with no sibling work between them. A held region nobody continues is ended by a
reaper thread, by flush(), or at exit.

Retakes: a timing call that can simply be made again (the timers auto-regions know:
`Region(retakes=True)`) asks for its region with `retake`. If the daemon revokes that region
because its owner waited for device memory its frozen siblings hold (docs/memory.md), it says
so on the region's connection; once the call returns, its result (timed partly unprotected) is
dropped and the call is made again, once, in a new region (`retaken`), where the memory the
first call waited for is already the command's. Only that call's time is lost, where otherwise
the whole command would run again.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, ParamSpec, TypeVar

from krex.core import messages, wire
from krex.core.errors import KrexError, ProtocolError
from krex.core.trust import TrustError, check_daemon

P = ParamSpec("P")
R = TypeVar("R")

CONNECT_RETRY_S = 5.0  # how long to retry connecting while the daemon comes up
DEFAULT_WAIT_S = 600.0  # KREX_REGION_WAIT_S when unset: the bound on waiting for a grant
# KREX_REGION_LINGER_S when unset: how long an auto-region is held after its call returns. It
# bridges the gaps between consecutive timings (well under 1 ms: a loop's next step, an L2 flush
# launched, the next config's call) and costs the siblings at most this much per region.
DEFAULT_LINGER_S = 0.005
MAX_LINGER_S = 1.0
END_REPLY_S = 60.0  # the bound on the reply to region_end (the daemon thaws and reopens)
WRAPPED_MARK = "__krex_region__"  # set on wrappers, so nothing gets wrapped twice
REGION_LABEL = "krex.region"  # what `calls` names a region() by (an auto-region by its target)

# The daemon is not listening yet (no socket file, or nobody accepting): worth retrying.
_RETRY_ERRNOS = {errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN}


class RegionError(KrexError):
    """A region could not begin or end: daemon unreachable, refused, silent, or bad env."""


class _Lost(RegionError):
    """The connection broke, or the daemon fell silent."""


@dataclass(frozen=True)
class _Tenant:
    path: str
    tenant: int
    wait_s: float
    linger_s: float


def _seconds(name: str, default: float) -> tuple[str, float]:
    """Variable `name` as it is set and as seconds: `default` when unset, -1 when not a number
    (which every bound refuses)."""
    text = os.environ.get(name, "")
    try:
        return text, float(text) if text else default
    except ValueError:
        return text, -1.0


@functools.cache
def _environment() -> _Tenant | None:
    """The tenant this process runs as, or None outside krex (read once per process)."""
    path = os.environ.get("KREX_SOCKET", "")
    tenant = os.environ.get("KREX_TENANT", "")
    if not path or not tenant:
        return None
    if not tenant.isdigit() or int(tenant) <= 0:
        raise RegionError(f"KREX_TENANT must be a positive integer, not {tenant!r}")
    wait, wait_s = _seconds("KREX_REGION_WAIT_S", DEFAULT_WAIT_S)
    if not 0 < wait_s < float("inf"):
        raise RegionError(f"KREX_REGION_WAIT_S must be a positive number of seconds, not {wait!r}")
    linger, linger_s = _seconds("KREX_REGION_LINGER_S", DEFAULT_LINGER_S)
    if not 0 <= linger_s <= MAX_LINGER_S:
        raise RegionError(
            f"KREX_REGION_LINGER_S must be between 0 and {MAX_LINGER_S:g} seconds, not {linger!r}"
        )
    # "Forever" is 1e9 s (30 years): socket time-outs must fit in 64-bit nanoseconds.
    return _Tenant(path, int(tenant), min(wait_s, 1e9), linger_s)


class _Held:
    """One granted region: its connection and grant. A plain object, not thread-local, so
    that the reaper thread can end it for the thread that held it."""

    __slots__ = (
        "calls", "candidate", "conn", "ended", "grant", "retake", "revoked", "t_grant", "until"
    )  # fmt: skip

    def __init__(
        self, conn: socket.socket, grant: dict[str, Any], candidate: bool, retake: bool = False
    ) -> None:
        self.conn = conn
        self.grant = grant  # the region_begin reply: its wait, drain, freeze times
        self.candidate = candidate  # an autotuner's candidate benchmark began it
        self.retake = retake  # begun with `retake`: the daemon tells it when revoked
        self.revoked = False  # told so (revoked())
        self.t_grant = time.monotonic()
        self.until = 0.0  # while lingering: when the reaper ends it (time.monotonic())
        self.ended = False  # taken by the reaper or flush() (under _lock)
        # Each marker's label, with how many times it began or continued the region (its
        # outermost entries): the record's `calls`, which says what held the GPU.
        self.calls: dict[str, int] = {}

    def count(self, label: str) -> None:
        wire.add_call(self.calls, label)


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.depth = 0
        self.held: _Held | None = None  # this thread's region, inside it or lingering
        self.candidates = 0  # inside candidates(): the regions it begins are candidates'
        self.retaking = False  # the next region it begins times a call again (`retaken`)


_state = _ThreadState()
_lock = threading.Lock()
_reaped = threading.Condition(_lock)  # notified when a region starts lingering
_open: set[socket.socket] = set()  # every thread's region connection, for the fork hook
_lingering: set[_Held] = set()  # regions left by their threads, held until `until`
# Regions the reaper took and is ending (region_end in flight): whoever needs them ended (exit,
# a record asked for) waits for them on _ended, at most ENDING_WAIT_S.
_reaping: set[_Held] = set()
_ended = threading.Condition(_lock)
ENDING_WAIT_S = 10.0
_reaper: threading.Thread | None = None
_last: dict[str, Any] | None = None


def _forget_after_fork() -> None:
    # A forked child must not end its parent's region (region_end on the shared connection),
    # nor keep the connection open: the daemon learns the owner died from EOF.
    global _state, _lock, _reaped, _ended, _reaper
    _lock = threading.Lock()
    _reaped = threading.Condition(_lock)
    _ended = threading.Condition(_lock)
    _reaper = None
    _reaping.clear()
    for conn in _open:
        conn.close()
    _open.clear()
    _lingering.clear()
    _state = _ThreadState()


os.register_at_fork(after_in_child=_forget_after_fork)


def region_depth() -> int:
    """How many regions this thread is inside now, nested (always 0 outside krex)."""
    return _state.depth


def last_region() -> dict[str, Any] | None:
    """The record of the region this process finished last (any thread), or None.

    Its keys are the daemon's: `wait_s`, `drain_s`, `freeze_s`, `duration_s`, `clean`, `revoked`,
    `problems` (every record has these), and on real GPUs the clock keys. A lingering
    auto-region of this thread is ended first: asking for its record says the timing is over.
    """
    end_lingering()
    with _lock:
        return None if _last is None else dict(_last)


def end_lingering() -> None:
    """End this thread's lingering auto-region now, if it has one and is not inside a region:
    what the thread does next (a compile, say) must not hold the GPU closed to the siblings."""
    held = _state.held
    if held is not None and _state.depth == 0:
        with _lock:
            mine = held in _lingering
            if mine:
                _take(held)
            else:  # the reaper may be ending it: its record is complete once it has
                _ended.wait_for(lambda: held not in _reaping, ENDING_WAIT_S)
        if mine:
            _state.held = None
            _end_quietly(held)


class Region:
    """One region marker: a re-entrant context manager and a decorator.

    It holds no state of its own (the depth and connection are per thread), so one instance
    serves every thread and every nesting level. A lingering one (auto_region()) is held
    KREX_REGION_LINGER_S after its outermost exit, for the thread's next region to continue
    (a timing does not continue an autotuner's candidate region). Its label names it in the
    record's `calls`.
    """

    def __init__(
        self,
        *,
        lingers: bool = False,
        label: str = REGION_LABEL,
        candidate: bool = False,
        retakes: bool = False,
    ) -> None:
        self.lingers = lingers
        self.label = label[: wire.MAX_CALL_NAME] or REGION_LABEL
        self.candidate = candidate  # an autotuner's candidate benchmark (candidates())
        self.retakes = retakes  # its calls are timings made again if revoked (call())

    def __enter__(self) -> None:
        tenant = _environment()
        if tenant is None:
            return
        state = _state
        if state.depth:
            state.depth += 1
            return
        candidate = self.candidate or state.candidates > 0
        held = state.held
        take = False
        if held is not None:
            with _lock:
                if not held.ended:
                    # Still lingering: continue it, unless it was revoked meanwhile (what comes
                    # next would not be protected) or this timing follows candidates.
                    if not _revoked(held) and (candidate or not held.candidate):
                        _lingering.discard(held)
                        held.count(self.label)
                        state.depth = 1
                        return
                    _take(held)
                    take = True
            state.held = None  # the reaper is ending it, or we do
            if take:
                # A timing right after an autotuner's candidates (a Triton kernel's first call,
                # then do_bench): its own region, so that the daemon's settle rules, which leave
                # candidates out, see the number the command reports (docs/user-guide.md).
                _end_quietly(held)
        retaken, state.retaking = state.retaking, False
        retake = self.retakes and not retaken  # a call is timed again once at most
        conn, grant = _begin(tenant, candidate, retake, retaken)
        with _lock:
            _open.add(conn)
        state.held = _Held(conn, grant, candidate, retake)
        state.held.count(self.label)
        state.depth = 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tenant = _environment()
        if tenant is None:
            return
        state = _state
        if state.depth == 0:  # entered before a fork, in the parent: not ours to end
            return
        state.depth -= 1
        if state.depth:
            return
        held = state.held
        assert held is not None
        if self.lingers and tenant.linger_s > 0:
            _linger(held, tenant.linger_s)
            return
        state.held = None
        with _lock:
            _take(held)
        try:
            _finish(held)
        except RegionError as error:
            if exc is None:
                raise
            # The body's own exception is the one the caller needs to see.
            print(f"krex: {error}", file=sys.stderr)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate `fn` so that each call runs inside this region (a plain function: a
        generator or coroutine function would be inside only while it creates its object)."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return self.call(fn, *args, **kwargs)

        setattr(wrapper, WRAPPED_MARK, True)
        return wrapper

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """fn(*args, **kwargs) inside this region. For a region that retakes (its calls are
        timings that can be made again), an outermost call whose region the daemon revoked
        for memory while it ran is made again, once, in a new region: its result is that
        call's (the module's text, "Retakes")."""
        if not self.retakes or _state.depth or _environment() is None:
            with self:
                return fn(*args, **kwargs)
        with self:
            held = _state.held
            result = fn(*args, **kwargs)
            revoked = held is not None and _revoked(held)
        if not revoked:
            return result
        _state.retaking = True
        try:
            with self:
                return fn(*args, **kwargs)
        finally:
            _state.retaking = False


def _revoked(held: _Held) -> bool:
    """Whether the daemon said `held` was revoked for memory (only a region begun with
    `retake` is told): its event, the one line it sends unasked, is looked at without being
    read (a reply's reader skips it) and without waiting."""
    if held.revoked or not held.retake:
        return held.revoked
    try:
        # poll, not select (any descriptor number); a socket with a time-out waits in recv
        # whatever its flags, so it is asked only once something is there.
        ready = select.poll()
        ready.register(held.conn, select.POLLIN)
        if not ready.poll(0):
            return False
        data = held.conn.recv(wire.MAX_LINE, socket.MSG_PEEK)
    except OSError:
        return False  # gone: region_end will say so
    line, newline, _ = data.partition(b"\n")
    if not newline:
        return False  # not all there yet
    try:
        event = wire.decode(line, request=False)
    except ProtocolError:
        return False
    held.revoked = messages.is_event(event) and event.get("event") == messages.REVOKED_EVENT
    return held.revoked


def _take(held: _Held) -> None:
    """Take `held` off its thread, to be ended by the caller (who holds _lock): no longer
    lingering, its connection no longer the fork hook's to close."""
    _lingering.discard(held)
    _open.discard(held.conn)
    held.ended = True


def _finish(held: _Held) -> None:
    """End a region taken off its thread (held.ended set): region_end, and its record."""
    global _last
    record = _end(held.conn, held.grant, time.monotonic() - held.t_grant, held.calls)
    with _lock:
        _last = record


def _linger(held: _Held, linger_s: float) -> None:
    """Hold `held` for linger_s more, then have the reaper end it unless it is continued."""
    global _reaper
    with _lock:
        held.until = time.monotonic() + linger_s
        _lingering.add(held)
        if _reaper is None:
            _reaper = threading.Thread(target=_reap, name="krex-region-reaper", daemon=True)
            _reaper.start()
        _reaped.notify()


def _reap() -> None:
    """The reaper thread: ends each lingering region when its time is up."""
    while True:
        with _lock:
            now = time.monotonic()
            due = [h for h in _lingering if h.until <= now]
            if not due:
                nearest = min((h.until for h in _lingering), default=now + 3600.0)
                _reaped.wait(nearest - now)
                continue
            for held in due:
                _take(held)
                _reaping.add(held)
        for held in due:
            try:
                _end_quietly(held)
            finally:
                with _lock:
                    _reaping.discard(held)
                    _ended.notify_all()


def _end_quietly(held: _Held) -> None:
    try:
        _finish(held)
    except RegionError as error:  # nobody to raise to: the thread has moved on
        print(f"krex: {error}", file=sys.stderr)


def flush() -> None:
    """End now every region of this process that lingers (auto-regions whose calls returned),
    so that their records are complete: at a command's end, and at exit. Those the reaper is
    ending already are waited for (at exit, its daemon thread would otherwise be stopped
    half-way, and the region end by EOF instead of region_end)."""
    with _lock:
        due = list(_lingering)
        for held in due:
            _take(held)
    for held in due:
        _end_quietly(held)
    with _lock:
        _ended.wait_for(lambda: not _reaping, ENDING_WAIT_S)


atexit.register(flush)


_REGION = Region()
_AUTO_LABEL = "auto-region"


def region() -> Region:
    """A region: `with krex.region(): ...` or `@krex.region()`.

    The GPU is this command's alone between entry and exit (siblings gated, drained and
    frozen). Re-entrant within a thread; a no-op outside krex.

    A daemon lost during the region (it died or restarted, which ended the region) is not an
    error on exit: one `krex:` line on stderr, and last_region() says revoked and not clean.

    Raises:
        RegionError: on entry, when the daemon cannot be reached, refuses, or grants nothing
            within KREX_REGION_WAIT_S; on exit, when it refuses region_end.
    """
    return _REGION


@functools.cache
def auto_region(label: str = _AUTO_LABEL, candidate: bool = False, retakes: bool = False) -> Region:
    """A region for auto-regions: like region(), but held KREX_REGION_LINGER_S after its
    outermost exit, so that the thread's next timing continues it (see the module's text).
    `label` (the wrapped target's dotted name) names it in the record's `calls`; `candidate`:
    the target is an autotuner's candidate benchmark (candidates()); `retakes`: the target is a
    timer, whose call is made again if its region is revoked for memory (Region.call)."""
    return Region(lingers=True, label=label, candidate=candidate, retakes=retakes)


@contextlib.contextmanager
def candidates() -> Iterator[None]:
    """Inside it, a region this thread begins is an autotuner's candidate benchmark: the
    daemon spends no power-capped settle on it (regions.capped_settle_s; a comparison of
    candidates timed alike, not a time the command reports). For an autotuner whose timing
    calls a marker shared with user timings (Triton's `Autotuner._bench` calls `do_bench`)."""
    _state.candidates += 1
    try:
        yield
    finally:
        _state.candidates = max(0, _state.candidates - 1)  # a forked child's state starts at 0


def _connect(path: str) -> socket.socket:
    deadline = time.monotonic() + CONNECT_RETRY_S
    delay = 0.01
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.01))
            conn.connect(path)
        except OSError as exc:
            conn.close()
            why = exc.strerror or str(exc)
            if exc.errno not in _RETRY_ERRNOS:
                raise RegionError(f"cannot connect to the krex daemon at {path}: {why}") from None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RegionError(
                    f"cannot connect to the krex daemon at {path}: {why} "
                    f"(retried for {CONNECT_RETRY_S:g} s; is the daemon running?)"
                ) from None
            # The socket appears when the daemon starts: there is nothing to block on.
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)
            continue
        try:
            check_daemon(conn, Path(path))  # someone else's listener grants no region
        except TrustError as e:
            conn.close()
            raise RegionError(str(e)) from None
        return conn


def _exchange(conn: socket.socket, request: messages.Message, limit_s: float) -> dict[str, Any]:
    """Send one request line and read one reply line, within `limit_s` seconds in all (an
    event the daemon sent before it, a region's `revoked`, is skipped)."""
    op = request.OP
    deadline = time.monotonic() + limit_s
    try:
        conn.settimeout(limit_s)
        conn.sendall(wire.encode(request.to_wire()))
        while True:
            line = _line(conn, deadline, op)
            try:
                reply = wire.decode(line, request=False)
            except ProtocolError:
                raise RegionError(f"the krex daemon's reply to {op} is not a JSON object") from None
            if not messages.is_event(reply):
                break
    except TimeoutError:
        what = "granted no region" if op == "region_begin" else f"did not answer {op}"
        hint = " (KREX_REGION_WAIT_S)" if op == "region_begin" else ""
        raise _Lost(f"the krex daemon {what} within {limit_s:g} s{hint}") from None
    except OSError as exc:
        raise _Lost(f"lost the connection to the krex daemon during {op}: {exc}") from None
    if reply.get("ok") is not True:
        raise RegionError(f"the krex daemon refused {op}: {reply.get('error', 'no reason given')}")
    return reply


def _line(conn: socket.socket, deadline: float, op: str) -> bytes:
    """The next line from the daemon, read to its newline and no further: what follows (the
    `revoked` event after a grant) stays in the socket for _revoked() to see."""
    buf = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        conn.settimeout(remaining)
        chunk = conn.recv(4096, socket.MSG_PEEK)
        if not chunk:
            raise _Lost(f"the krex daemon closed the connection without answering {op}")
        end = chunk.find(b"\n")
        buf += conn.recv(len(chunk) if end < 0 else end + 1)
        if len(buf) > wire.MAX_LINE:
            raise RegionError(
                f"the krex daemon's reply to {op} is longer than {wire.MAX_LINE // 1024} KiB"
            )
        if end >= 0:
            return buf[:-1]


def _begin(
    tenant: _Tenant, candidate: bool = False, retake: bool = False, retaken: bool = False
) -> tuple[socket.socket, dict[str, Any]]:
    """The region's own connection, and the grant."""
    conn = _connect(tenant.path)
    request = messages.RegionBegin(tenant.tenant, os.getpid(), candidate, retake, retaken)
    try:
        grant = _exchange(conn, request, tenant.wait_s)
    except BaseException:
        conn.close()  # EOF tells the daemon to give the grant up (or never give it)
        raise
    return conn, grant


def _end(
    conn: socket.socket, grant: dict[str, Any], held_s: float, calls: dict[str, int]
) -> dict[str, Any]:
    """End the region; its record, with every key of a normal one (_complete)."""
    named: dict[str, Any] = {"calls": dict(calls)} if calls else {}
    try:
        reply = _exchange(conn, messages.RegionEnd(dict(calls)), END_REPLY_S)
    except _Lost as lost:
        # The daemon died or restarted under the region, which ended it then (a dead daemon
        # ends every region: docs/architecture.md, the region protocol). The measurement is
        # done and may be fine: say so and mark it, as for a revoked region, rather than fail
        # the program at its very end. The grant's times are known; the duration is ours.
        print(f"krex: {lost}: the region is recorded as revoked", file=sys.stderr)
        known: dict[str, Any] = {
            k: grant[k] for k in ("wait_s", "drain_s", "freeze_s") if k in grant
        }
        return _complete(
            {**known, "duration_s": held_s, "revoked": True, "problems": [str(lost)], **named}
        )
    finally:
        conn.close()
    record = reply.get("region")
    return _complete(record if isinstance(record, dict) else {})


def _complete(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with every key of the daemon's region record (docs/user-guide.md, "The
    report"), which harnesses index without checking: one the daemon could not send (it was
    lost) or sent short gets the missing ones, and is unclean."""
    base: dict[str, Any] = {
        "wait_s": 0.0,
        "drain_s": 0.0,
        "freeze_s": 0.0,
        "duration_s": 0.0,
        "clean": False,
        "revoked": False,
        "problems": [],
        "warnings": [],
    }
    return {**base, **record}


def _why_not_runnable(command: str) -> str:
    if "/" not in command:
        return "command not found"
    if not os.path.exists(command):
        return "no such file or directory"
    if os.path.isdir(command):
        return "is a directory"
    return "permission denied"


def _wait(proc: subprocess.Popen[bytes]) -> int:
    """Wait for `proc` as a shell would: the terminal's Ctrl-C and Ctrl-\\ are for the command
    (the whole foreground group gets them), and a TERM or HUP sent to us is passed on to it."""
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def forward(signum: int, frame: FrameType | None) -> None:
            proc.send_signal(signum)

        for signum in (signal.SIGINT, signal.SIGQUIT):
            previous[signum] = signal.signal(signum, signal.SIG_IGN)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, forward)
    try:
        status = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - status if status < 0 else status


def run_in_region(argv: Sequence[str]) -> int:
    """Run `argv` as one region (`krex region -- CMD`) and return its exit status.

    The status is the command's own (killed by signal N: 128 + N); 127 when it cannot start,
    125 when the region cannot begin. Messages go to stderr, one line each.
    """
    args = list(argv)
    if not args:
        print("krex region: no command given (krex region -- CMD ...)", file=sys.stderr)
        return 2
    # Checked before the region: a typo should not close the GPU to everyone else.
    if shutil.which(args[0]) is None:
        print(f"krex region: cannot run {args[0]}: {_why_not_runnable(args[0])}", file=sys.stderr)
        return 127
    try:
        _REGION.__enter__()
    except RegionError as exc:
        print(f"krex region: {exc}", file=sys.stderr)
        return 125
    status = 127
    try:
        try:
            proc = subprocess.Popen(args)
        except OSError as exc:
            print(f"krex region: cannot run {args[0]}: {exc.strerror or exc}", file=sys.stderr)
        else:
            status = _wait(proc)
    finally:
        try:
            _REGION.__exit__(None, None, None)
        except RegionError as exc:
            print(f"krex region: {exc}", file=sys.stderr)
    return status
