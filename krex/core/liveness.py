"""The controller's liveness lock on its gates segment (docs/shim.md, "A dead
controller"; docs/security.md, case 6).

A daemon holds an open-file-description read lock on the first byte of its gates segment's
file (shim/krex_layout.h: KREX_LIVENESS_LOCK_*) for its whole life, and writes its pid in the
segment's header (`controller_pid`) once it holds it. The kernel drops the lock when the daemon
dies, however it dies (SIGKILL included; a zombie holds no files), so anyone can tell a dead
daemon from a live one without a pid that might be recycled:

- a thread of a tenant blocked at a closed gate asks (F_OFD_GETLK, which takes nothing) every
  0.2 s, and passes once no one holds it (shim/preload/gate.c);
- a `krex run` whose daemon connection ended reopens the gates it left closed and thaws what it
  froze (`orphaned`, `reopen`) under a write lock on that byte: no live daemon's read lock
  allows it, so a successor that starts meanwhile waits for it (`hold`) before it closes a
  gate or freezes anyone, and a client never undoes a successor's region.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from krex._native import lib
from krex.core.errors import KrexError
from krex.core.shm import Segment, SegmentError

_START = int(lib.KREX_LIVENESS_LOCK_START)
_LEN = int(lib.KREX_LIVENESS_LOCK_LEN)
# struct flock (Linux, 64-bit off_t): l_type, l_whence, l_start, l_len, l_pid, padding.
_FLOCK = struct.Struct("@hhqqi4x")
_HOLD_WAIT_S = 5.0  # for a reopener's write lock (it holds it for microseconds)


class LivenessError(SegmentError):
    """The liveness lock could not be taken (someone holds it for writing and keeps it)."""


def _lock(kind: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, _START, _LEN, 0)


def _path(name: str) -> Path:
    return Path("/dev/shm", name.lstrip("/"))


def hold(seg: Segment) -> int:
    """The daemon's side: take the read lock on seg's file for as long as the returned fd stays
    open (close it, or die), then declare ourselves in seg's header. Before any gate closes."""
    fd = os.open(_path(seg.name), os.O_RDONLY | os.O_CLOEXEC)
    deadline = time.monotonic() + _HOLD_WAIT_S
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock(fcntl.F_RDLCK))
            break
        except OSError as e:
            # Only a write lock conflicts with ours: a client reopening a dead predecessor's
            # gates, for microseconds.
            if time.monotonic() >= deadline:
                os.close(fd)
                raise LivenessError(
                    f"the liveness lock of {seg.name} stays held for writing: {e.strerror}"
                ) from None
            time.sleep(0.01)
    seg.set_controller(os.getpid())
    return fd


def alive(name: str) -> bool | None:
    """Whether a controller holds the liveness lock of segment `name` (None: no such file).
    Takes nothing: a starting daemon is never in its way."""
    try:
        fd = os.open(_path(name), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock(fcntl.F_WRLCK))
    finally:
        os.close(fd)
    return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)


class Claimed(KrexError):
    """A controller holds the segment's liveness lock: alive (a successor, or one stopping)."""


@contextlib.contextmanager
def orphaned(name: str) -> Iterator[Segment | None]:
    """A client's side, once its daemon is gone: while no controller holds segment `name`'s
    liveness lock, and none can take it (we hold it for writing), what to recover.

    Yields the segment mapped for writing when it is ours alone (our uid, writable by nobody
    else: what a daemon adopts, krex/core/shm.py) and a controller declared itself in it (layout
    2.1); None when it is not ours to write (another uid's daemon) or gone: then only the
    thaw is ours, unguarded, and the shim's own look opens the way past the gate. Raises
    Claimed when a controller holds the lock: it recovers, or has, on its own."""
    name = "/" + name.lstrip("/")
    path = _path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        yield None
        return
    seg: Segment | None = None
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock(fcntl.F_WRLCK))
            except OSError:
                raise Claimed(f"a controller holds {name}") from None
            with contextlib.suppress(SegmentError, OSError):
                seg = Segment.attach(name, owner=os.geteuid())
                if os.stat(path).st_ino != st.st_ino or not seg.controller_pid:
                    seg.close()
                    seg = None
        yield seg
    finally:
        if seg is not None:
            seg.close()
        os.close(fd)  # drops the write lock


def reopen(seg: Segment) -> int:
    """Open every gate of seg that is still closed; returns how many were."""
    closed = [g for g in range(seg.n_gpus) if seg.gate(g).owner]
    for g in closed:
        seg.gate_open(g)
    return len(closed)


def daemon_holds(fd: int) -> bool:
    """Whether a running daemon holds the exclusive flock it keeps on its gates segment for its
    life (docs/security.md, case 5); fd is that segment opened. When none does, fd holds the
    lock now, until it is closed."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False
