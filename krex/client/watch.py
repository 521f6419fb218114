"""Frozen siblings never outlive their controller (docs/security.md, case 6).

While `krex run`'s command runs, its connection to the daemon stays open. When the daemon dies,
the connection ends (EOF) at once, and whatever the daemon had frozen (the siblings of the
region it held, idle pool workers) stays frozen until someone thaws it, and the gate it had
closed stays closed. Every client therefore watches its connection: at EOF, unless another
daemon already answers at the socket (a restarted one recovers on its own), it reopens the
gates the daemon left closed (`liveness.reopen_orphaned`: only when no daemon holds the
segment's liveness lock) and thaws every group under the daemon's root (`tenants.recover`), its
own included. Any client that notices first does it; the others find nothing left to do. Should
the clients die with the daemon, the shim's own look at the liveness lock lets blocked threads
pass (docs/shim.md, "A dead controller"); what stays frozen then waits for the next daemon.
Where another daemon answers, the client says so: the command goes on, but that daemon did not
admit it and refuses its regions.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from krex.core import messages, wire
from krex.core.errors import ProtocolError
from krex.core.liveness import Claimed, orphaned, reopen
from krex.core.tenants import TenantsError, recover

_POLL_S = 0.2
_ANSWER_S = 2.0  # for a successor's hello
_CLAIMED_S = 10.0  # for a dying daemon's liveness lock to go (krex/core/liveness.py)


class DaemonWatch:
    """A thread that notices the daemon's connection ending and thaws what it left frozen."""

    def __init__(self, sock: socket.socket, path: Path, root: str) -> None:
        self.sock = sock
        self.path = path
        self.root = root
        self._stop = threading.Event()
        # stop() writes here so that the thread's poll returns at once: waiting out its time-out
        # delayed every `krex run`'s Finished, and so the daemon's freeing of its slot, by up
        # to 0.2-0.4 s (most of the wall of a short command).
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._run, name="krex-daemon-watch", daemon=True)
        self.thawed: int | None = None  # set when it acted
        self.reopened = 0  # gates it found closed and opened
        self.daemon_pid = _peer_pid(sock)  # the daemon that admitted the command

    def start(self) -> DaemonWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before the client's own last exchange (its EOF afterwards is no death)."""
        self._stop.set()
        with contextlib.suppress(OSError):  # already woken (the pipe is full: never)
            os.write(self._wake_w, b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * _POLL_S)
        if not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    def _run(self) -> None:
        # The connection's end is a hang-up (POLLRDHUP, POLLHUP), seen without reading: the
        # client's own replies stay where it reads them, and no read here can block (a peek on
        # a socket with a time-out waits for data when the client took what was there).
        poller = select.poll()
        try:
            sock = self.sock.fileno()
            poller.register(sock, select.POLLRDHUP)
            poller.register(self._wake_r, select.POLLIN)
        except (OSError, ValueError):
            return  # closed already: the client is done with it
        while not self._stop.is_set():
            try:
                events = dict(poller.poll(_POLL_S * 1000))
            except OSError:
                return
            ev = events.get(sock, 0)
            if self._stop.is_set() or ev & select.POLLNVAL:
                return  # stopped, or closed under us: the client is done with it
            if ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
                self._daemon_gone()
                return

    def _daemon_gone(self) -> None:
        if (pid := answering(self.path)) is not None:
            self._replaced(pid)  # a successor: it reopens the gates and thaws on its own
            return
        # The liveness lock held: our daemon still dying (the kernel closes its files one by
        # one, our connection's may go first), or stopping (it opens and thaws all itself), or
        # a successor (it reopened and thawed as it started, and answers soon).
        claimed_until = time.monotonic() + _CLAIMED_S
        try:
            while True:
                try:
                    with orphaned(self.root) as seg:
                        if seg is not None:
                            self.reopened = reopen(seg)
                        self.thawed = recover(self.root)
                    break
                except Claimed:
                    if time.monotonic() >= claimed_until:
                        return  # a live controller keeps it: a successor, nothing of ours
                    self._stop.wait(_POLL_S / 4)
                    if os.path.exists(self.path) and (pid := answering(self.path)) is not None:
                        self._replaced(pid)
                        return
        except TenantsError as e:
            print(f"krex run: the krex daemon died, and thawing failed: {e}", file=sys.stderr)
            return
        if not os.path.exists(self.path) and not self.thawed and not self.reopened:
            # A daemon that stops removes its socket, having thawed and opened all itself.
            self._stopped()
            return
        gates = f"reopened {self.reopened} gate(s) and " if self.reopened else ""
        print(
            f"krex run: the krex daemon at {self.path} died; {gates}thawed the {self.thawed} "
            "group(s) it had frozen (the command goes on, unprotected)",
            file=sys.stderr,
        )

    def _replaced(self, pid: int) -> None:
        """Another daemon answers at the socket (ours ended our connection and may live on:
        then nothing is said)."""
        if pid == self.daemon_pid and pid > 0:
            return
        print(
            f"krex run: the krex daemon at {self.path} that admitted this command is gone; "
            f"another (pid {pid or 'unknown'}) answers there and refuses this command's regions "
            "(the command goes on, unprotected: run it again)",
            file=sys.stderr,
        )

    def _stopped(self) -> None:
        print(
            f"krex run: the krex daemon at {self.path} stopped (the command goes on, unprotected)",
            file=sys.stderr,
        )


def answers(path: Path) -> bool:
    """Whether a daemon answers a hello at path."""
    return answering(path) is not None


def answering(path: Path) -> int | None:
    """The pid of the daemon that answers a hello at path (0 where it gives none), or None.
    Connecting is not enough: a dying daemon may close our connection before its listening
    socket (the kernel closes a process's files one by one), and a connection queued on that
    socket is accepted by nobody."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(_ANSWER_S)
    with contextlib.closing(s):
        try:
            s.connect(str(path))
            s.sendall(wire.encode(messages.Hello().to_wire()))
            reply = s.makefile("rb").readline(wire.MAX_LINE)
        except OSError:
            return None
    try:
        said = wire.decode(reply, request=False) if reply else {}
    except ProtocolError:
        return None
    if said.get("ok") is not True:
        return None
    pid = said.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else 0


def _peer_pid(sock: socket.socket) -> int:
    """The pid at the other end of a Unix socket (SO_PEERCRED), 0 where it cannot be read."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("3i", creds)[0])
