"""The socket protocol's framing and version, once (docs/protocol.md).

Requests and replies between `krex run`, the markers, pool workers and the daemon are JSON
objects, one per line, at most `MAX_LINE` bytes (a connection's first request, an `admit` with
its argv, at most `MAX_REQUEST`), every request carrying `"v": VERSION`. An argument that is
not UTF-8 travels as Python's os.fsdecode makes it (each undecodable byte a lone surrogate
U+DC80..U+DCFF, JSON-escaped) and is the same bytes again where it is run. The
client and a pool worker speak length-prefixed JSON with file descriptors (`send_frame`,
`recv_frame`). Each request's fields are defined once, in krex/core/messages.py.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:  # the daemon's streams; `krex run` (a client) never imports asyncio
    import asyncio

from krex.core.errors import ProtocolError

VERSION = 1
MAX_LINE = 64 * 1024  # bytes a line, its newline included
MAX_FRAME = 1 << 24  # bytes of one length-prefixed message (argv, environment, ...)
# A connection's first request: an `admit` carries the command's argv, which the OS allows up
# to ARG_MAX (2 MiB here; at most 6 MiB on Linux), JSON-escaped (a byte that is not UTF-8
# takes 6): the same bound as the frame that hands it to a warm worker.
MAX_REQUEST = MAX_FRAME


def encode(msg: dict[str, Any]) -> bytes:
    """One request line: `msg` with the protocol version, compact, newline-terminated."""
    return json.dumps({"v": VERSION, **msg}, separators=(",", ":")).encode() + b"\n"


def encode_reply(msg: dict[str, Any]) -> bytes:
    """One reply line (replies carry no version)."""
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes, *, request: bool = True, limit: int | None = MAX_LINE) -> dict[str, Any]:
    """The object on one line (or in one frame). ProtocolError for anything else, or for more
    than `limit` bytes (None: no bound; the daemon's reply to `finished` lists every region of
    the command, so the client cannot hold replies to a line's bound). A request must carry
    this protocol's version as a JSON integer (`true` is not 1)."""
    if limit is not None and len(line) > limit:
        raise ProtocolError(f"message longer than {limit} bytes")
    try:
        msg = json.loads(line, parse_int=_int)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProtocolError("message is not one JSON object per line") from e
    except RecursionError:
        raise ProtocolError("message nests arrays or objects too deeply") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a JSON object")
    if request:
        v = msg.get("v")
        if not is_int(v) or v != VERSION:
            raise ProtocolError(f"protocol version {v!r} is not supported (want {VERSION})")
    return msg


MAX_INT = 2**63  # an integer in a message is less than this in magnitude (64 bits, signed)


def _int(digits: str) -> int:
    """A JSON integer, within MAX_INT (a larger one, a count of bytes or a time-out past any
    real one, would only overflow the floats it is compared with and printed as)."""
    value = int(digits) if len(digits) <= 20 else MAX_INT
    if abs(value) >= MAX_INT:
        raise ProtocolError("message has an integer beyond 64 bits")
    return value


def arg_bytes(arg: str) -> bytes:
    """The bytes a command gets for one argument as it travels (os.fsencode's, on Linux)."""
    return arg.encode("utf-8", "surrogateescape")


def arg_problem(arg: str) -> str | None:
    """Why `arg` cannot be an argument of a command (None when it can)."""
    if "\0" in arg:
        return "contains a NUL byte"
    try:
        arg_bytes(arg)
    except UnicodeEncodeError:
        return "has a surrogate that stands for no byte (only U+DC80..U+DCFF do)"
    return None


def is_int(value: object) -> TypeGuard[int]:
    """Whether a decoded JSON value is an integer (JSON's true and false decode to bool, an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether a decoded JSON value is a number (an integer or a float, not true or false)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


# region_end's `calls` (the markers that began or continued the region, with their counts):
# at most MAX_CALL_NAMES names, each 1..MAX_CALL_NAME characters, each count 1..MAX_CALL_COUNT.
MAX_CALL_NAMES = 32
MAX_CALL_NAME = 200
MAX_CALL_COUNT = 10**9
OTHER_CALLS = "(others)"  # the last name's place, once all the others are taken


def add_call(calls: dict[str, int], name: str, n: int = 1) -> None:
    """Count n more entries of marker `name` into `calls`, within the bounds above: past
    MAX_CALL_NAMES - 1 names the rest share OTHER_CALLS; a count stops at MAX_CALL_COUNT."""
    if name not in calls and len(calls) >= MAX_CALL_NAMES - 1:
        name = OTHER_CALLS
    calls[name] = min(calls.get(name, 0) + n, MAX_CALL_COUNT)


def calls_problem(value: object) -> str | None:
    """Why `value` is not a region_end's `calls`, or None when it is one."""
    if not isinstance(value, dict) or len(value) > MAX_CALL_NAMES:
        return f"calls must be an object of at most {MAX_CALL_NAMES} names"
    for name, count in value.items():
        if not 0 < len(name) <= MAX_CALL_NAME:
            return f"a name in calls must be 1 to {MAX_CALL_NAME} characters"
        if not is_int(count) or not 0 < count <= MAX_CALL_COUNT:
            return f"calls[{name!r}] must be a count from 1 to {MAX_CALL_COUNT}"
    return None


class Lines:
    """Request lines from an asyncio stream, each within a bound of its own: MAX_LINE, or for
    a connection's first request MAX_REQUEST. Past MAX_LINE a line is read only while it holds
    one of `big`'s places (the daemon's few), so that many connections cannot each buffer
    MAX_REQUEST bytes at once."""

    def __init__(self, reader: asyncio.StreamReader, big: asyncio.Semaphore | None = None):
        self.reader = reader
        self.big = big
        self.buf = bytearray()  # what came after the last line
        self.last = 0  # bytes of the last line

    async def line(self, limit: int = MAX_LINE) -> bytes:
        """The next line, its newline included (at EOF what came without one; b"": nothing)."""
        held = False
        try:
            while (end := self.buf.find(b"\n")) < 0:
                if len(self.buf) >= limit:
                    raise ProtocolError(f"request longer than {limit} bytes")
                if len(self.buf) >= MAX_LINE and self.big is not None and not held:
                    await self.big.acquire()
                    held = True
                chunk = await self.reader.read(1 << 16)
                if not chunk:
                    line, self.buf = bytes(self.buf), bytearray()
                    return line
                self.buf += chunk
            if end >= limit:
                raise ProtocolError(f"request longer than {limit} bytes")
            line = bytes(self.buf[: end + 1])
            del self.buf[: end + 1]
            self.last = len(line)
            return line
        finally:
            if held and self.big is not None:
                self.big.release()

    async def read(self, limit: int = MAX_LINE) -> dict[str, Any] | None:
        """The next request; None at EOF."""
        line = await self.line(limit)
        return decode(line, limit=limit) if line else None


async def write(writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
    """Send one reply (or daemon-to-worker message) and wait until it is written."""
    writer.write(encode_reply(msg))
    await writer.drain()


def send_frame(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    """One length-prefixed JSON message, with file descriptors riding on its first bytes."""
    data = json.dumps(msg).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sent = sock.sendmsg([frame], anc)
        if sent < len(frame):  # sendall(b"") would still send, and fail once the peer is done
            sock.sendall(frame[sent:])
    else:
        sock.sendall(frame)


def recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """The next length-prefixed message and the descriptors that came with it; (None, []) at
    EOF. ProtocolError for an oversized or malformed message."""
    fds: list[int] = []
    head = b""
    while len(head) < 4:
        if max_fds and not fds and not head:
            data, anc, _, _ = sock.recvmsg(4, socket.CMSG_LEN(max_fds * 4))
            for level, kind, blob in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += array.array("i", blob[: len(blob) - len(blob) % 4]).tolist()
        else:
            data = sock.recv(4 - len(head))
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        head += data
    (size,) = struct.unpack("!I", head)
    if size > MAX_FRAME:
        raise ProtocolError(f"message of {size} bytes (at most {MAX_FRAME})")
    body = b""
    while len(body) < size:
        chunk = sock.recv(min(1 << 20, size - len(body)))
        if not chunk:
            raise ConnectionError("connection closed in the middle of a message")
        body += chunk
    return decode(body, request=False, limit=MAX_FRAME), fds
