"""krex/core/wire.py: the socket protocol's framing and version (docs/protocol.md), and the two
requests shim/preload/region.c writes by hand (against krex/core/messages.py's)."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterator

import pytest
from conftest import ROOT

from krex.core import messages, wire
from krex.core.errors import ProtocolError

BEGIN = messages.RegionBegin(tenant=7, pid=1234)
REQUEST = BEGIN.to_wire()


def test_a_request_round_trips_with_the_version() -> None:
    line = wire.encode(REQUEST)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.decode(line) == {"v": wire.VERSION, **REQUEST}
    assert json.loads(line)["v"] == wire.VERSION


def test_a_reply_round_trips_without_a_version() -> None:
    reply = {"ok": True, "region": {"clean": True, "problems": []}, "text": "é\n"}
    line = wire.encode_reply(reply)
    assert line.count(b"\n") == 1 and b'"v"' not in line
    assert wire.decode(line, request=False) == reply


@pytest.mark.parametrize("v", ["true", "1.0", "2", "0", '"1"', "null", None])
def test_only_this_integer_version_is_a_request(v: str | None) -> None:
    """`"v": true` (JSON's true is Python's 1), `1.0`, 2, a string, null or no version at all
    are refused."""
    body = '"op":"hello"' if v is None else f'"v":{v},"op":"hello"'
    line = ("{" + body + "}\n").encode()
    with pytest.raises(ProtocolError, match="version"):
        wire.decode(line)
    assert wire.decode(line, request=False)["op"] == "hello"  # replies carry none


@pytest.mark.parametrize("line", [b"", b"[]\n", b"1\n", b'{"v":1\n', b"\xff\xfe\n", b"null\n"])
def test_what_is_not_one_json_object_is_refused(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire.decode(line)


def test_oversize_lines_are_refused() -> None:
    pad = wire.MAX_LINE - len(wire.encode({"op": "hello", "x": ""}))
    fits = wire.encode({"op": "hello", "x": "a" * pad})
    assert len(fits) == wire.MAX_LINE
    assert wire.decode(fits)["x"] == "a" * pad
    over = wire.encode({"op": "hello", "x": "a" * (pad + 1)})
    with pytest.raises(ProtocolError, match="longer than"):
        wire.decode(over)
    with pytest.raises(ProtocolError, match="longer than"):
        wire.decode(over, request=False)
    # A reply may be unbounded where the caller says so (a report lists every region).
    assert wire.decode(over, request=False, limit=None)["op"] == "hello"


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        yield a, b


def test_frames_round_trip_with_descriptors(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    r, w = os.pipe()
    try:
        wire.send_frame(a, {"token": "t", "n": 1}, [w])
        msg, fds = wire.recv_frame(b, max_fds=3)
        assert msg == {"token": "t", "n": 1} and len(fds) == 1
        os.write(fds[0], b"x")  # the descriptor is the pipe's write end
        os.close(fds[0])
        assert os.read(r, 1) == b"x"
    finally:
        os.close(r)
        os.close(w)
    wire.send_frame(a, {"signal": 2})
    assert wire.recv_frame(b) == ({"signal": 2}, [])


def test_a_frame_may_be_larger_than_a_line(pair: tuple[socket.socket, socket.socket]) -> None:
    """A job (argv, environment) is bounded by MAX_FRAME, not by MAX_LINE."""
    a, b = pair
    big = {"env": {"X": "a" * (4 * wire.MAX_LINE)}}
    a.settimeout(10)
    b.settimeout(10)
    sender = threading.Thread(target=wire.send_frame, args=(a, big))
    sender.start()
    assert wire.recv_frame(b) == (big, [])
    sender.join()


def test_oversize_frames_and_eof(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall((wire.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(ProtocolError, match="bytes"):
        wire.recv_frame(b)
    a.close()
    assert wire.recv_frame(b) == (None, [])


def _c_requests() -> dict[str, bytes]:
    """The request lines shim/preload/region.c writes, by op, with sample values for its
    printf conversions."""
    source = (ROOT / "shim" / "preload" / "region.c").read_text()
    out = {}
    for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', source):
        if '\\"op\\":' not in literal:
            continue
        text = literal.encode().decode("unicode_escape")  # \" and \n, as C reads them
        text = text.replace("%lu", str(BEGIN.tenant)).replace("%d", str(BEGIN.pid))
        out[json.loads(text)["op"]] = text.encode()
    return out


def test_the_c_markers_requests_are_requests_of_this_version() -> None:
    requests = _c_requests()
    assert set(requests) == {"region_begin", "region_end"}, requests
    for op, line in requests.items():
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        msg = wire.decode(line)
        assert msg["op"] == op
    # Byte for byte what krex.tenant.markers sends for the same region (which adds its markers'
    # `calls` to region_end: the C entry points have no labels, so their records have none).
    assert requests["region_begin"] == wire.encode(BEGIN.to_wire())
    assert requests["region_end"] == wire.encode(messages.RegionEnd().to_wire())
    # And the daemon reads them as those messages.
    begin, end = (wire.decode(requests[op]) for op in ("region_begin", "region_end"))
    assert messages.parse(begin, messages.RegionBegin) == BEGIN
    assert messages.parse(end, messages.RegionEnd) == messages.RegionEnd()
