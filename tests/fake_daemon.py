"""A stand-in for `krex daemon` that speaks the region part of docs/protocol.md.

`hello`, `region_begin` (granted at once, or after `grant_delay_s`, or refused with `refuse`)
and `region_end` (answered with a region record, then the connection is closed). It records
what it received, `(op, tenant, pid)`, with `"eof"` for a connection that closed inside a region.

    with FakeDaemon(tmp_path / "krex.sock") as daemon:
        env = {**os.environ, **daemon.env(tenant=7)}
        ...
        assert daemon.ops() == ["region_begin", "region_end"]
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from krex.core import wire
from krex.core.errors import ProtocolError

Received = tuple[str, int | None, int | None]


class FakeDaemon:
    """A threaded unix-socket server; a context manager that listens while entered."""

    def __init__(
        self,
        path: Path,
        *,
        grant_delay_s: float = 0.0,
        refuse: str | None = None,
        revoke: int = 0,
    ) -> None:
        self.path = path
        self.grant_delay_s = grant_delay_s
        self.refuse = refuse
        # The first `revoke` regions begun with `retake` are revoked for memory at once: the
        # `revoked` event after the grant, a revoked record at region_end.
        self.revoke = revoke
        self.retakes: list[tuple[bool, bool]] = []  # each region_begin's (retake, retaken)
        self.received: list[Received] = []
        self.calls: list[dict[str, int]] = []  # each region_end's `calls` ({} without)
        self.candidate: list[bool] = []  # each region_begin's `candidate` (False without)
        self.connections = 0
        self._changed = threading.Condition()
        self._stop = threading.Event()  # set by __exit__; shutdown() wakes the blocked calls
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._threads: list[threading.Thread] = []
        self._clients: list[socket.socket] = []
        self._epoch = 0

    def env(self, tenant: int = 1) -> dict[str, str]:
        """The variables that put a process inside krex, as this daemon's tenant."""
        return {"KREX_SOCKET": str(self.path), "KREX_TENANT": str(tenant)}

    def ops(self) -> list[str]:
        with self._changed:
            return [op for op, _, _ in self.received]

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        """Wait until `count` messages were received (bounded); return them all."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.received) >= count, timeout_s):
                raise TimeoutError(f"received {self.received}, wanted {count} messages")
            return list(self.received)

    def __enter__(self) -> FakeDaemon:
        self._listener.bind(str(self.path))
        self._listener.listen(64)
        self._spawn(self._accept_loop)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        # shutdown() wakes the blocked accept() (Linux); the clients' wake their recv().
        for sock in [self._listener, *self._clients]:
            with contextlib.suppress(OSError):  # closed already
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()
        self.path.unlink(missing_ok=True)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._changed:
                self.connections += 1
                self._clients.append(client)
            self._spawn(self._serve, client)

    def _record(self, op: str, tenant: int | None, pid: int | None) -> None:
        with self._changed:
            self.received.append((op, tenant, pid))
            self._changed.notify_all()

    def _serve(self, client: socket.socket) -> None:
        tenant: int | None = None
        pid: int | None = None
        began = 0.0
        revoked = False
        # A client gone before its reply: _reply let the write fail, and closing the stream
        # would try it again; the conversation is over either way.
        with contextlib.suppress(OSError), client, client.makefile("rwb") as stream:
            for line in stream:
                try:
                    request = wire.decode(line)  # as the daemon: the version checked
                    op = request["op"]
                except (ProtocolError, KeyError) as e:
                    self._reply(stream, {"ok": False, "error": f"malformed request: {e}"})
                    continue
                if op == "hello":
                    self._record(op, None, None)
                    self._reply(stream, {"ok": True, "version": "0.1.0", "pid": os.getpid()})
                elif op == "region_begin":
                    tenant, pid = request.get("tenant"), request.get("pid")
                    retake = request.get("retake", False)
                    with self._changed:
                        self.candidate.append(request.get("candidate", False))
                        self.retakes.append((retake, request.get("retaken", False)))
                        revoked = retake and self.revoke > 0
                        self.revoke -= revoked
                    self._record(op, tenant, pid)
                    if self.refuse is not None:
                        self._reply(stream, {"ok": False, "error": self.refuse})
                        return
                    if self.grant_delay_s and self._gone_within(client, self.grant_delay_s):
                        self._record("eof", tenant, pid)  # gave up waiting, or we stopped
                        return
                    began = time.monotonic()
                    self._epoch += 1
                    grant = {"epoch": self._epoch, "wait_s": self.grant_delay_s}
                    self._reply(stream, {"ok": True, **grant, **_COSTS, "clean": True})
                    if revoked:
                        self._reply(stream, {"event": "revoked", "why": "the owner waited"})
                elif op == "region_end" and tenant is not None:
                    with self._changed:  # before the record: wait_for() then sees both
                        self.calls.append(dict(request.get("calls") or {}))
                    self._record(op, tenant, pid)
                    record: dict[str, Any] = {"wait_s": self.grant_delay_s, **_COSTS}
                    record.update(
                        duration_s=time.monotonic() - began,
                        clean=not revoked,
                        revoked=revoked,
                        problems=["revoked before its owner ended it"] if revoked else [],
                    )
                    if "calls" in request:  # the markers that held it, as the daemon records them
                        record["calls"] = request["calls"]
                    self._reply(stream, {"ok": True, "region": record})
                    return
                else:
                    self._reply(stream, {"ok": False, "error": f"unexpected op {op!r}"})
            if tenant is not None:
                self._record("eof", tenant, pid)

    @staticmethod
    def _gone_within(client: socket.socket, seconds: float) -> bool:
        """Whether the client hangs up within `seconds` (it sends nothing while it waits)."""
        readable, _, _ = select.select([client], [], [], seconds)
        return bool(readable) and client.recv(1, socket.MSG_PEEK) == b""

    @staticmethod
    def _reply(stream: Any, reply: dict[str, Any]) -> None:
        try:
            stream.write(wire.encode_reply(reply))
            stream.flush()
        except OSError:
            pass  # the client went away; its EOF ends the conversation


_COSTS = {"drain_s": 0.001, "freeze_s": 0.002}
