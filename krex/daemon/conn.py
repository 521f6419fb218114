"""A client's connection as the daemon holds it: its streams, who is on the other end, and
the few ways the daemon talks over it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass
from typing import Any

from krex.core import wire
from krex.core.errors import ProtocolError

SEND_S = 60.0  # a reply the client does not read within this ends the connection


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection (SO_PEERCRED, at connect time)."""

    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class Conn:
    """One client connection: its streams and who is on the other end."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    peer: Peer
    lines: wire.Lines

    async def send(self, msg: dict[str, Any]) -> None:
        try:
            await asyncio.wait_for(wire.write(self.writer, msg), SEND_S)
        except TimeoutError:
            raise ConnectionError(f"the client read no reply for {SEND_S:g} s") from None

    async def read(self, limit: int = wire.MAX_LINE) -> dict[str, Any] | None:
        return await self.lines.read(limit)

    async def until(self, fut: asyncio.Future[Any]) -> None:
        """Wait for fut, but give up when the client goes away (EOF). The client says nothing
        while it waits, so the watch for EOF reads no request."""
        if self.lines.buf:
            raise ProtocolError("nothing may be sent while waiting")
        eof = asyncio.create_task(self.reader.read(1))
        try:
            done, _ = await asyncio.wait({fut, eof}, return_when=asyncio.FIRST_COMPLETED)
            if fut not in done or fut.cancelled():
                raise ConnectionError("client left while waiting")
        finally:
            eof.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                if await eof:
                    raise ProtocolError("nothing may be sent while waiting")


def peer_of(writer: asyncio.StreamWriter) -> Peer:
    """Who connected (SO_PEERCRED: the credentials at connect time)."""
    sock = writer.get_extra_info("socket")
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return Peer(*struct.unpack("3i", creds))
