"""Frozen siblings never outlive their controller (docs/security.md, case 6).

While `krex run`'s command runs, its connection to the daemon stays open. When the daemon dies,
the connection ends (EOF) at once, and whatever the daemon had frozen (the siblings of the
region it held, idle pool workers) stays frozen until someone thaws it. Every client therefore
watches its connection: at EOF, unless another daemon already answers at the socket (a
restarted one recovers on its own), it thaws every group under the daemon's root
(`tenants.recover`), its own included. Any client that notices first does it; the others find
nothing left frozen.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading
from pathlib import Path

from krex import wire
from krex.errors import ProtocolError
from krex.tenants import TenantsError, recover

_POLL_S = 0.2
_ANSWER_S = 2.0  # for a successor's hello


class DaemonWatch:
    """A thread that notices the daemon's connection ending and thaws what it left frozen."""

    def __init__(self, sock: socket.socket, path: Path, root: str) -> None:
        self.sock = sock
        self.path = path
        self.root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="krex-daemon-watch", daemon=True)
        self.thawed: int | None = None  # set when it acted

    def start(self) -> DaemonWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before the client's own last exchange (its EOF afterwards is no death)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * _POLL_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select([self.sock], [], [], _POLL_S)
                if not readable or self._stop.is_set():
                    continue
                data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except (OSError, ValueError):
                return  # closed under us: the client is done with it
            if data:
                # A reply the client is about to read itself: not ours to consume.
                self._stop.wait(_POLL_S / 4)
                continue
            if not self._stop.is_set():
                self._daemon_gone()
            return

    def _daemon_gone(self) -> None:
        if _answers(self.path):
            return  # a successor: it reopens the gates and thaws on its own
        try:
            self.thawed = recover(self.root)
        except TenantsError as e:
            print(f"krex run: the krex daemon died, and thawing failed: {e}", file=sys.stderr)
            return
        if not os.path.exists(self.path) and not self.thawed:
            # A daemon that stops removes its socket, having thawed and opened all itself.
            print(
                f"krex run: the krex daemon at {self.path} stopped (the command goes on, "
                "unprotected)",
                file=sys.stderr,
            )
            return
        print(
            f"krex run: the krex daemon at {self.path} died; thawed the {self.thawed} group(s) "
            "it had frozen (the command goes on, unprotected)",
            file=sys.stderr,
        )


def _answers(path: Path) -> bool:
    """Whether a daemon answers a hello at path. Connecting is not enough: a dying daemon may
    close our connection before its listening socket (the kernel closes a process's files one
    by one), and a connection queued on that socket is accepted by nobody."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(_ANSWER_S)
    with contextlib.closing(s):
        try:
            s.connect(str(path))
            s.sendall(wire.encode({"op": "hello"}))
            reply = s.makefile("rb").readline(wire.MAX_LINE)
        except OSError:
            return False
    try:
        return bool(reply) and wire.decode(reply, request=False).get("ok") is True
    except ProtocolError:
        return False
