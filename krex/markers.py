"""Region markers: `with krex.region():`, `@krex.region()` and `krex region -- CMD`.

Inside a tenant (`KREX_SOCKET` and `KREX_TENANT` set by `krex run`), the outermost region of a
thread opens a connection of its own to the daemon, sends `region_begin` and holds the
connection until `region_end` (docs/protocol.md); nested regions of that thread only count.
Outside krex every marker is a no-op that costs a cached look-up.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, ParamSpec, TypeVar

from krex import wire
from krex.errors import KrexError, ProtocolError
from krex.trust import TrustError, check_daemon

P = ParamSpec("P")
R = TypeVar("R")

CONNECT_RETRY_S = 5.0  # how long to retry connecting while the daemon comes up
DEFAULT_WAIT_S = 600.0  # KREX_REGION_WAIT_S when unset: the bound on waiting for a grant
END_REPLY_S = 60.0  # the bound on the reply to region_end (the daemon thaws and reopens)
WRAPPED_MARK = "__krex_region__"  # set on wrappers, so nothing gets wrapped twice

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


@functools.cache
def _environment() -> _Tenant | None:
    """The tenant this process runs as, or None outside krex (read once per process)."""
    path = os.environ.get("KREX_SOCKET", "")
    tenant = os.environ.get("KREX_TENANT", "")
    if not path or not tenant:
        return None
    if not tenant.isdigit() or int(tenant) <= 0:
        raise RegionError(f"KREX_TENANT must be a positive integer, not {tenant!r}")
    wait = os.environ.get("KREX_REGION_WAIT_S", "")
    try:
        wait_s = float(wait) if wait else DEFAULT_WAIT_S
    except ValueError:
        wait_s = -1.0
    if not 0 < wait_s < float("inf"):
        raise RegionError(f"KREX_REGION_WAIT_S must be a positive number of seconds, not {wait!r}")
    # "Forever" is 1e9 s (30 years): socket time-outs must fit in 64-bit nanoseconds.
    return _Tenant(path, int(tenant), min(wait_s, 1e9))


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.depth = 0
        self.conn: socket.socket | None = None
        self.grant: dict[str, Any] = {}  # the region_begin reply: its wait, drain, freeze times
        self.t_grant = 0.0  # time.monotonic() at the grant


_state = _ThreadState()
_lock = threading.Lock()
_open: set[socket.socket] = set()  # every thread's region connection, for the fork hook
_last: dict[str, Any] | None = None


def _forget_after_fork() -> None:
    # A forked child must not end its parent's region (region_end on the shared connection),
    # nor keep the connection open: the daemon learns the owner died from EOF.
    global _state, _lock
    _lock = threading.Lock()
    for conn in _open:
        conn.close()
    _open.clear()
    _state = _ThreadState()


os.register_at_fork(after_in_child=_forget_after_fork)


def region_depth() -> int:
    """How many regions this thread is inside now, nested (always 0 outside krex)."""
    return _state.depth


def last_region() -> dict[str, Any] | None:
    """The record of the region this process finished last (any thread), or None.

    Its keys are the daemon's: `wait_s`, `drain_s`, `freeze_s`, `duration_s`, `clean`, `revoked`,
    `problems` (every record has these), and on real GPUs the clock keys.
    """
    with _lock:
        return None if _last is None else dict(_last)


class Region:
    """One region marker: a re-entrant context manager and a decorator.

    It holds no state of its own (the depth and connection are per thread), so one instance
    serves every thread and every nesting level.
    """

    def __enter__(self) -> None:
        tenant = _environment()
        if tenant is None:
            return
        state = _state
        if state.depth:
            state.depth += 1
            return
        conn, state.grant = _begin(tenant)
        state.t_grant = time.monotonic()
        with _lock:
            _open.add(conn)
        state.conn = conn
        state.depth = 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _last
        if _environment() is None:
            return
        state = _state
        if state.depth == 0:  # entered before a fork, in the parent: not ours to end
            return
        state.depth -= 1
        if state.depth:
            return
        conn, state.conn = state.conn, None
        assert conn is not None
        with _lock:
            _open.discard(conn)
        try:
            record = _end(conn, state.grant, time.monotonic() - state.t_grant)
        except RegionError as error:
            if exc is None:
                raise
            # The body's own exception is the one the caller needs to see.
            print(f"krex: {error}", file=sys.stderr)
            return
        with _lock:
            _last = record

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate `fn` so that each call runs inside this region (a plain function: a
        generator or coroutine function would be inside only while it creates its object)."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return fn(*args, **kwargs)

        setattr(wrapper, WRAPPED_MARK, True)
        return wrapper


_REGION = Region()


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


def _exchange(conn: socket.socket, request: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """Send one request line and read one reply line, within `limit_s` seconds in all."""
    op = request["op"]
    deadline = time.monotonic() + limit_s
    buf = b""
    try:
        conn.settimeout(limit_s)
        conn.sendall(wire.encode(request))
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            conn.settimeout(remaining)
            chunk = conn.recv(4096)
            if not chunk:
                raise _Lost(f"the krex daemon closed the connection without answering {op}")
            buf += chunk
            if len(buf) > wire.MAX_LINE:
                raise RegionError(
                    f"the krex daemon's reply to {op} is longer than {wire.MAX_LINE // 1024} KiB"
                )
    except TimeoutError:
        what = "granted no region" if op == "region_begin" else f"did not answer {op}"
        hint = " (KREX_REGION_WAIT_S)" if op == "region_begin" else ""
        raise _Lost(f"the krex daemon {what} within {limit_s:g} s{hint}") from None
    except OSError as exc:
        raise _Lost(f"lost the connection to the krex daemon during {op}: {exc}") from None
    try:
        reply = wire.decode(buf.split(b"\n", 1)[0], request=False)
    except ProtocolError:
        raise RegionError(f"the krex daemon's reply to {op} is not a JSON object") from None
    if reply.get("ok") is not True:
        raise RegionError(f"the krex daemon refused {op}: {reply.get('error', 'no reason given')}")
    return reply


def _begin(tenant: _Tenant) -> tuple[socket.socket, dict[str, Any]]:
    """The region's own connection, and the grant."""
    conn = _connect(tenant.path)
    request = {"op": "region_begin", "tenant": tenant.tenant, "pid": os.getpid()}
    try:
        grant = _exchange(conn, request, tenant.wait_s)
    except BaseException:
        conn.close()  # EOF tells the daemon to give the grant up (or never give it)
        raise
    return conn, grant


def _end(conn: socket.socket, grant: dict[str, Any], held_s: float) -> dict[str, Any]:
    """End the region; its record, with every key of a normal one (_complete)."""
    try:
        reply = _exchange(conn, {"op": "region_end"}, END_REPLY_S)
    except _Lost as lost:
        # The daemon died or restarted under the region, which ended it then (a dead daemon
        # ends every region: docs/architecture.md, the region protocol). The measurement is
        # done and may be fine: say so and mark it, as for a revoked region, rather than fail
        # the program at its very end. The grant's times are known; the duration is ours.
        print(f"krex: {lost}: the region is recorded as revoked", file=sys.stderr)
        known: dict[str, Any] = {
            k: grant[k] for k in ("wait_s", "drain_s", "freeze_s") if k in grant
        }
        return _complete({**known, "duration_s": held_s, "revoked": True, "problems": [str(lost)]})
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
