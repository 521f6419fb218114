"""krex/core/messages.py: every request of the socket protocol, defined once: each message
round-trips through the wire, a receiver refuses a bad field with the reply's text, and no
module of krex writes a request as a dict literal of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from krex.core import messages, wire
from krex.core.config import MAX_BYTES
from krex.core.errors import KrexError, ProtocolError

KEY = "0123456789abcdef" * 2

# One or more samples of each message, as its senders build them.
SAMPLES: list[messages.Message] = [
    messages.Hello(),
    messages.Status(),
    messages.Admit(argv=["prog", "a b", "\udcff"], sim=True),
    messages.Admit(
        build={"version": "0.1.0", "build": "0" * 12, "path": "/k"},
        argv=["python3", "bench.py"],
        gpu=[0, 1],
        gpus=2,
        auto_regions="do_bench",
        region_timeout_s=30,
        settle_s=0.0,
        capped_settle_s=2.5,
        mem_bytes=1 << 30,
        mem_alone=True,
        mem_rerun=123,
        mem_key=KEY,
        mem_family="b" * 32,
        mem_retry=False,
    ),
    messages.Started(4321),
    messages.Started(4321, warm=True),
    messages.Lease(),
    messages.Finished(0, False),
    messages.Finished(None, True),
    messages.RegionBegin(7, 1234),
    messages.RegionBegin(7, 1234, candidate=True),
    messages.RegionBegin(7, 1234, retake=True),
    messages.RegionBegin(7, 1234, retaken=True),
    messages.RegionEnd(),
    messages.RegionEnd({"do_bench": 3, wire.OTHER_CALLS: 1}),
    messages.WorkerReady(3, "ab" * 16, 999),
    messages.Job("cd" * 16, 4321),
    messages.Exit(),
    messages.Exited(4322, 137),
]


def test_every_message_has_a_sample_and_an_op_of_its_own() -> None:
    ops = [kind.OP for kind in messages.MESSAGES]
    assert len(set(ops)) == len(ops)
    assert {type(m) for m in SAMPLES} == set(messages.MESSAGES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).OP)
def test_a_message_round_trips_through_the_wire(msg: messages.Message) -> None:
    line = wire.encode(msg.to_wire())
    decoded = wire.decode(line)
    assert decoded["op"] == type(msg).OP and decoded["v"] == wire.VERSION
    assert messages.parse(decoded, *messages.MESSAGES) == msg
    assert messages.parse(decoded, type(msg)) == msg


def test_a_field_at_its_default_stays_off_the_wire_as_senders_always_left_it() -> None:
    """Protocol version 1's keys: what was optional is sent only when given."""
    assert messages.Admit(argv=["x"]).to_wire() == {
        "op": "admit",
        "build": None,
        "argv": ["x"],
        "gpu": None,
        "sim": False,
        "auto_regions": None,
        "region_timeout_s": None,
    }
    assert messages.Started(5).to_wire() == {"op": "started", "pid": 5}
    assert messages.Started(5, warm=True).to_wire() == {"op": "started", "pid": 5, "warm": True}
    assert messages.Finished(None, False).to_wire() == {
        "op": "finished",
        "exit_code": None,
        "worker_lost": False,
    }
    assert messages.RegionBegin(7, 8).to_wire() == {"op": "region_begin", "tenant": 7, "pid": 8}
    assert messages.RegionEnd().to_wire() == {"op": "region_end"}
    assert messages.Admit(argv=["x"], settle_s=0.0).to_wire()["settle_s"] == 0.0  # given: sent
    assert messages.Hello().to_wire() == {"op": "hello"}


def _admit(**fields: Any) -> dict[str, Any]:
    return {"op": "admit", "argv": ["prog"], "sim": True, **fields}


# Per message, a request the receiver refuses, with its reply's text (docs/protocol.md).
REFUSED = [
    (_admit(argv=[]), "argv must be a non-empty list of strings"),
    (_admit(argv="prog"), "argv must be a non-empty list of strings"),
    (_admit(argv=["prog", "a\0b"]), "argv[1] contains a NUL byte"),
    (_admit(argv=["\ud800"]), "argv[0] has a surrogate that stands for no byte"),
    (_admit(region_timeout_s=0), "region_timeout_s must be a positive number of seconds"),
    (_admit(region_timeout_s=True), "region_timeout_s must be a positive number of seconds"),
    (_admit(auto_regions=["a"]), "auto_regions must be a string"),
    (_admit(mem_bytes=-1), f"mem_bytes must be an integer 0..{MAX_BYTES} (1 PiB)"),
    (_admit(mem_bytes=1.5), "mem_bytes must be an integer"),
    (_admit(mem_alone=1), "mem_alone must be true or false"),
    (_admit(mem_retry="no"), "mem_retry must be true or false"),
    (_admit(mem_rerun=None), "mem_rerun must be an integer"),
    (_admit(settle_s=6), "settle_s must be a number of seconds, 0..5"),
    (_admit(capped_settle_s=-1), "capped_settle_s must be a number of seconds, 0..5"),
    (_admit(mem_key="ABC"), "mem_key must be 32 lower-case hexadecimal digits"),
    (_admit(mem_family="f" * 31), "mem_family must be 32 lower-case hexadecimal digits"),
    (_admit(mem_family=7), "mem_family must be 32 lower-case hexadecimal digits"),
    (_admit(gpus=0), "gpus must be a positive integer, got 0"),
    (_admit(gpu="0"), "gpu must be a GPU index or a list of them, got '0'"),
    (_admit(gpu=[]), "gpu must be a GPU index or a list of them, got []"),
    ({"op": "started", "pid": 0}, "pid must be a positive integer"),
    ({"op": "started", "pid": "1"}, "pid must be a positive integer"),
    ({"op": "region_begin", "tenant": "7"}, "tenant '7' is not admitted here"),
    ({"op": "region_begin", "tenant": 7, "candidate": 1}, "candidate must be true or false"),
    ({"op": "region_begin", "tenant": 7, "retake": "yes"}, "retake must be true or false"),
    ({"op": "region_begin", "tenant": 7, "retaken": None}, "retaken must be true or false"),
    ({"op": "region_end", "calls": []}, "region_end: calls must be an object"),
    ({"op": "region_end", "calls": {"f": 0}}, "region_end: calls['f'] must be a count"),
    ({"op": "worker_ready", "worker": "1", "secret": "x"}, "unknown worker"),
    ({"op": "worker_ready", "worker": 1}, "unknown worker"),
    ({"op": "job", "token": 5, "client": 1}, "job: token must be a string"),
    ({"op": "exited", "pid": 5, "status": None}, "exited: pid and status must be integers"),
]


@pytest.mark.parametrize(("msg", "error"), REFUSED, ids=lambda x: str(x)[:40])
def test_a_receiver_refuses_a_bad_field_with_the_replys_text(
    msg: dict[str, Any], error: str
) -> None:
    with pytest.raises(ProtocolError) as e:
        messages.parse(msg, *messages.MESSAGES)
    assert str(e.value).startswith(error), str(e.value)
    assert isinstance(e.value, KrexError)


def test_what_no_receiver_acts_on_is_taken_as_before() -> None:
    """Fields a receiver never refused still pass: the pids the daemon takes from the socket's
    credentials, `exit_code`, a job's client, admit's `sim` (any value, as true or false) and a
    `build` that is not an object (unchecked)."""
    begin = messages.parse({"op": "region_begin", "tenant": 7, "pid": "me"}, messages.RegionBegin)
    assert begin == messages.RegionBegin(7, None)
    done = messages.parse({"op": "finished", "exit_code": "x", "worker_lost": 1}, messages.Finished)
    assert done == messages.Finished(None, True)
    job = messages.parse({"op": "job", "token": "t", "client": None}, messages.Job)
    assert job == messages.Job("t", 0)
    admit = messages.parse(_admit(sim="yes", build="old", mem_bytes=None), messages.Admit)
    assert admit.sim is True and admit.build is None and admit.mem_bytes == 0
    started = messages.parse({"op": "started", "pid": 9, "warm": 1}, messages.Started)
    assert started.warm is False  # only true itself is warm


def test_an_op_the_receiver_does_not_take_is_unknown() -> None:
    with pytest.raises(messages.UnknownOp, match=r"^unknown op 'started'$") as e:
        messages.parse({"op": "started", "pid": "bad"}, messages.Admit, messages.Hello)
    assert e.value.op == "started"
    with pytest.raises(messages.UnknownOp, match=r"^unknown op None$"):
        messages.parse({}, *messages.MESSAGES)


def _op_dicts(path: Path) -> list[int]:
    """Lines of `path` with a dict literal that has an "op" key, or dict(op=...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "op" for k in node.keys
        ):
            found.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "dict"
            and any(k.arg == "op" for k in node.keywords)
        ):
            found.append(node.lineno)
    return found


def test_no_request_is_a_dict_literal_outside_its_definition() -> None:
    """Every wire op is built from krex/core/messages.py, nowhere by hand."""
    home = ROOT / "krex" / "core" / "messages.py"
    stray = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in sorted((ROOT / "krex").rglob("*.py"))
        if p != home
        for line in _op_dicts(p)
    ]
    assert not stray, f"a request written by hand (build a krex.core.messages class): {stray}"
    assert _op_dicts(home)  # the check finds one where there is one


def test_a_users_process_gets_none_of_the_configurations_imports() -> None:
    """The markers and the fork server import this module inside a user's process: only the
    daemon, reading an admit, needs krex.core.config (and difflib, datetime, ...)."""
    code = "import sys, krex.core.messages; print('krex.core.config' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
