"""Every request of the socket protocol, defined once (docs/protocol.md; framing and version:
krex/core/wire.py).

One frozen dataclass per op (its `OP`), used by the client, the markers, the pool worker and
the daemon alike: a sender builds one and sends `to_wire()` (wire.encode adds the version); a
receiver checks a decoded object once with `parse`, whose ProtocolError is the error reply's
text. A field marked `OMIT` travels only when it differs from its default (the senders have
always left those out), so the JSON keys and values are protocol version 1's. Replies are plain
objects. shim/preload/region.c writes region_begin and region_end by hand; tests/test_wire.py
checks them against these.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from krex.core import wire
from krex.core.errors import ProtocolError

OMIT = {"omit": True}  # a field's metadata: left off the wire while at its default


M = TypeVar("M", bound="Message")


class UnknownOp(ProtocolError):
    """A request whose op is not one the receiver takes at this point."""

    def __init__(self, op: object) -> None:
        super().__init__(f"unknown op {op!r}")
        self.op = op


@dataclass(frozen=True)
class Message:
    """One request: its op, and its fields as they travel."""

    OP: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        """The request as an object for wire.encode."""
        out: dict[str, Any] = {"op": self.OP}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("omit") and value == _default(f):
                continue
            out[f.name] = value
        return out

    @classmethod
    def from_wire(cls: type[M], msg: dict[str, Any]) -> M:
        """The message in a decoded request of this op, checked (what `parse` calls)."""
        del msg
        return cls()


def op_of(msg: dict[str, Any]) -> object:
    """A decoded request's op, as it came (anything, for an error to name)."""
    return msg.get("op")


def parse(msg: dict[str, Any], *among: type[M]) -> M:
    """The message in a decoded request whose op is one of `among`'s, checked once: UnknownOp
    for another op, ProtocolError (the reply's text) for a field the receiver cannot take."""
    op = op_of(msg)
    for kind in among:
        if op == kind.OP:
            return kind.from_wire(msg)
    raise UnknownOp(op)


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _pid(value: object) -> int | None:
    """A pid the daemon does not act on (it trusts the socket's peer credentials): any value
    passes, and one that is not an integer reads as None."""
    return value if wire.is_int(value) else None


def is_key(value: object) -> bool:
    """Whether a client's command key (admit's `mem_key`) is well formed: 32 lower-case hex
    digits."""
    return (
        isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)
    )


# From any process: the first request of a connection.
@dataclass(frozen=True)
class Hello(Message):
    """Who the daemon is: its version, pid and build."""

    OP: ClassVar[str] = "hello"


@dataclass(frozen=True)
class Status(Message):
    """The daemon's state, every GPU's."""

    OP: ClassVar[str] = "status"


# From `krex run`, on one connection for the command's life: admit, started or lease, finished.
@dataclass(frozen=True, kw_only=True)
class Admit(Message):
    """A command asks for a GPU (None: the daemon's default, where a field has one)."""

    OP: ClassVar[str] = "admit"
    build: dict[str, Any] | None = None  # the client's (krex/core/build.py); None: unchecked
    argv: list[str]
    gpu: int | list[int] | None = None  # which GPU(s); None: the least loaded
    gpus: int | None = field(default=None, metadata=OMIT)  # how many
    sim: bool = False
    auto_regions: str | None = None  # comma-separated callables
    region_timeout_s: float | None = None
    settle_s: float | None = field(default=None, metadata=OMIT)
    capped_settle_s: float | None = field(default=None, metadata=OMIT)
    mem_bytes: int = field(default=0, metadata=OMIT)  # declared device memory, 0: none
    mem_alone: bool = field(default=False, metadata=OMIT)
    mem_rerun: int = field(default=0, metadata=OMIT)  # a rerun: what its last attempt needed
    mem_key: str | None = field(default=None, metadata=OMIT)  # identity for learned peaks
    # What the command is, run again edited (its argv and directory, not its files' contents):
    # the last peak of its family stands for a command never seen (docs/memory.md).
    mem_family: str | None = field(default=None, metadata=OMIT)
    # `krex run` runs the command again when it is preempted or a region of it is revoked for
    # memory (false: --no-memory-retry, or its last attempt).
    mem_retry: bool = field(default=True, metadata=OMIT)

    @staticmethod
    def build_of(msg: dict[str, Any]) -> dict[str, Any] | None:
        """The sender's build, where the request carries one (checked before its fields: a
        client of another build may send fields that this one refuses)."""
        build = msg.get("build")
        return build if isinstance(build, dict) else None

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Admit:
        # Here, not at the top: the markers and the fork server import this module inside a
        # user's process, which should get none of the configuration's imports.
        from krex.core.config import MAX_BYTES, MAX_SECONDS

        argv = msg.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ProtocolError("argv must be a non-empty list of strings")
        for i, arg in enumerate(argv):
            if why := wire.arg_problem(arg):
                raise ProtocolError(f"argv[{i}] {why}")
        timeout = msg.get("region_timeout_s")
        if timeout is not None and (not wire.is_number(timeout) or not 0 < timeout <= MAX_SECONDS):
            raise ProtocolError(
                f"region_timeout_s must be a positive number of seconds, at most {MAX_SECONDS:g}"
            )
        auto = msg.get("auto_regions")
        if auto is not None and not isinstance(auto, str):
            raise ProtocolError("auto_regions must be a string")
        mem = msg.get("mem_bytes", 0)
        if mem is None:
            mem = 0
        if not wire.is_int(mem) or not 0 <= mem <= MAX_BYTES:
            raise ProtocolError(f"mem_bytes must be an integer 0..{MAX_BYTES} (1 PiB)")
        alone = msg.get("mem_alone", False)
        if not isinstance(alone, bool):
            raise ProtocolError("mem_alone must be true or false")
        rerun = msg.get("mem_rerun", 0)
        if not wire.is_int(rerun) or not 0 <= rerun <= MAX_BYTES:
            raise ProtocolError(f"mem_rerun must be an integer 0..{MAX_BYTES} (bytes)")
        retry = msg.get("mem_retry", True)
        if not isinstance(retry, bool):
            raise ProtocolError("mem_retry must be true or false")
        settle, capped = (_settle(msg, key) for key in ("settle_s", "capped_settle_s"))
        mem_key = msg.get("mem_key")
        if mem_key is not None and not is_key(mem_key):
            raise ProtocolError("mem_key must be 32 lower-case hexadecimal digits")
        mem_family = msg.get("mem_family")
        if mem_family is not None and not is_key(mem_family):
            raise ProtocolError("mem_family must be 32 lower-case hexadecimal digits")
        return cls(
            build=cls.build_of(msg),
            argv=argv,
            gpu=_gpu(msg.get("gpu")),
            gpus=_gpus(msg.get("gpus")),
            sim=bool(msg.get("sim", False)),
            auto_regions=auto,
            region_timeout_s=timeout,
            settle_s=settle,
            capped_settle_s=capped,
            mem_bytes=mem,
            mem_alone=alone,
            mem_rerun=rerun,
            mem_key=mem_key,
            mem_family=mem_family,
            mem_retry=retry,
        )


def _settle(msg: dict[str, Any], key: str) -> float | None:
    from krex.core.config import MAX_SETTLE_S  # as in Admit.from_wire

    value = msg.get(key)
    if value is not None and (not wire.is_number(value) or not 0 <= value <= MAX_SETTLE_S):
        raise ProtocolError(f"{key} must be a number of seconds, 0..{MAX_SETTLE_S:g}")
    return value


def _gpus(count: object) -> int | None:
    if count is None:
        return None
    if not wire.is_int(count) or count < 1:
        raise ProtocolError(f"gpus must be a positive integer, got {count!r}")
    return count


def _gpu(wanted: object) -> int | list[int] | None:
    if wanted is None or wire.is_int(wanted):
        return wanted
    ids = wanted if isinstance(wanted, list) else []
    if not ids or not all(wire.is_int(i) for i in ids):
        raise ProtocolError(f"gpu must be a GPU index or a list of them, got {wanted!r}")
    return ids


@dataclass(frozen=True)
class Started(Message):
    """The command's first process (a warm worker's child: `warm`), for the daemon to place."""

    OP: ClassVar[str] = "started"
    pid: int
    warm: bool = field(default=False, metadata=OMIT)

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Started:
        pid = msg.get("pid")
        if not wire.is_int(pid) or pid <= 0:
            raise ProtocolError("pid must be a positive integer")
        return cls(pid, warm=msg.get("warm") is True)


@dataclass(frozen=True)
class Lease(Message):
    """A warm worker to fork the command, or why there is none."""

    OP: ClassVar[str] = "lease"


@dataclass(frozen=True)
class Finished(Message):
    """The command is over (`worker_lost`: its warm child ended without a status)."""

    OP: ClassVar[str] = "finished"
    exit_code: int | None  # not acted on: a value that is not an integer reads as None
    worker_lost: bool = False

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Finished:
        code = msg.get("exit_code")
        return cls(code if wire.is_int(code) else None, bool(msg.get("worker_lost")))


# From inside a tenant, on a connection of the region's own.
@dataclass(frozen=True)
class RegionBegin(Message):
    """Tenant `tenant` asks for the GPU to itself (`candidate`: an autotuner's candidate).
    `retake`: a timing call it can make again asks, so if the region is revoked for memory the
    daemon says so on this connection (a `revoked` event) and the tenant times the call again
    in a new region instead of its command running again; `retaken`: that new region."""

    OP: ClassVar[str] = "region_begin"
    tenant: int
    pid: int | None
    candidate: bool = field(default=False, metadata=OMIT)
    retake: bool = field(default=False, metadata=OMIT)
    retaken: bool = field(default=False, metadata=OMIT)

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> RegionBegin:
        tid = msg.get("tenant")
        if not wire.is_int(tid):
            raise ProtocolError(f"tenant {tid!r} is not admitted here")
        flags = {k: msg.get(k, False) for k in ("candidate", "retake", "retaken")}
        for k, v in flags.items():
            if not isinstance(v, bool):
                raise ProtocolError(f"{k} must be true or false")
        return cls(tid, _pid(msg.get("pid")), **flags)


# What the daemon sends on its own on a region's connection that asked for it (`retake`): the
# region was revoked for memory. Its one unsolicited line; a reader of replies skips it.
REVOKED_EVENT = "revoked"


def is_event(reply: dict[str, Any]) -> bool:
    """Whether a line the daemon sent on a region's connection is an event, not a reply."""
    return "event" in reply and "ok" not in reply


@dataclass(frozen=True)
class RegionEnd(Message):
    """The region is over; `calls`: the markers that began or continued it, with counts."""

    OP: ClassVar[str] = "region_end"
    calls: dict[str, int] = field(default_factory=dict, metadata=OMIT)

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> RegionEnd:
        calls = msg.get("calls", {})
        if problem := wire.calls_problem(calls):
            raise ProtocolError(f"region_end: {problem}")
        return cls(calls)


# Between the daemon and a pool worker, on the worker's control connection.
@dataclass(frozen=True)
class WorkerReady(Message):
    """A pool worker is up (`secret`: from its environment)."""

    OP: ClassVar[str] = "worker_ready"
    worker: int
    secret: str
    pid: int | None

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> WorkerReady:
        wid, secret = msg.get("worker"), msg.get("secret")
        if not wire.is_int(wid) or not isinstance(secret, str):
            raise ProtocolError("unknown worker")
        return cls(wid, secret, _pid(msg.get("pid")))


@dataclass(frozen=True)
class Job(Message):
    """From the daemon: fork one child for `token`, asked for by process `client`."""

    OP: ClassVar[str] = "job"
    token: str
    client: int  # 0 (no process) where it came as no integer

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Job:
        token, client = msg.get("token"), msg.get("client")
        if not isinstance(token, str):
            raise ProtocolError("job: token must be a string")
        return cls(token, client if wire.is_int(client) else 0)


@dataclass(frozen=True)
class Exit(Message):
    """From the daemon: the worker stops."""

    OP: ClassVar[str] = "exit"


@dataclass(frozen=True)
class Exited(Message):
    """From the worker: a child it reaped, with its status as a shell gives it."""

    OP: ClassVar[str] = "exited"
    pid: int
    status: int

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Exited:
        pid, status = msg.get("pid"), msg.get("status")
        if not wire.is_int(pid) or not wire.is_int(status):
            raise ProtocolError("exited: pid and status must be integers")
        return cls(pid, status)


MESSAGES: tuple[type[Message], ...] = (
    Hello,
    Status,
    Admit,
    Started,
    Lease,
    Finished,
    RegionBegin,
    RegionEnd,
    WorkerReady,
    Job,
    Exit,
    Exited,
)
