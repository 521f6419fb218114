"""The shared segment: gates and process slots, seen from the control plane.

The only module that touches ``krex._native`` (cffi). It maps the POSIX shared-memory segment
whose layout ``shim/krex_layout.h`` defines, checks it, and wraps the C helpers of
``shim/krex_control.h`` in typed methods whose failures are exceptions.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import posix_ipc

from krex._native import ffi, lib
from krex.core.errors import KrexError

LAYOUT_VERSION = (int(lib.KREX_LAYOUT_MAJOR), int(lib.KREX_LAYOUT_MINOR))
MAX_GPUS = int(lib.KREX_MAX_GPUS)
MAX_SLOTS = int(lib.KREX_MAX_SLOTS)
_NO_WAIT_LIMIT = 2**64 - 1


class SegmentError(KrexError):
    """The shared segment is missing, foreign, corrupt or of another layout version."""


class ForeignSegment(SegmentError):
    """A segment that is not this daemon's own (another uid's, or writable by others)."""


class WaitTimeout(KrexError):
    """A bounded wait of the region protocol ran out of time."""

    def __init__(self, what: str, outstanding: int, pids: list[int] | None = None) -> None:
        who = f" (pid {', '.join(map(str, pids))})" if pids else ""
        super().__init__(f"{what} timed out with {outstanding} slot(s) outstanding{who}")
        self.outstanding = outstanding
        self.pids = pids or []


def _ns(seconds: float) -> int:
    if seconds < 0:
        raise ValueError(f"a timeout must be >= 0 seconds, got {seconds}")
    return int(seconds * 1e9)


def now_ns() -> int:
    """CLOCK_MONOTONIC in nanoseconds: the clock of gate deadlines."""
    return int(lib.krex_now_ns())


_MEM_FIELDS = (
    "mem_bytes",
    "mem_peak",
    "mem_want",
    "mem_since_ns",
    "mem_wait_ns",
    "mem_waits",
    "mem_grant",
    "mem_deny",
    "mem_oom_alone",
    "mem_oom_shared",
    "mem_kind",
    "mem_seen",
    "drained_calls",
    "mem_failed",
)
# What a memory wait waits in (krex_slot.mem_kind, mem_kind_waits; shim/krex_layout.h).
MEM_KINDS = ("alloc", "context", "module", "launch", "graph")
assert len(MEM_KINDS) == int(lib.KREX_MEM_KINDS)


@dataclass(frozen=True)
class SlotView:
    """One process slot, each field read atomically."""

    index: int
    state: int
    pid: int
    tenant: int
    gpu: int
    gpus: int  # mask: bit i = GPU i
    in_flight: int
    intercepted: int
    blocked: int
    unmatched: int
    drain_req: int
    drain_ack: int
    alive: bool
    ungated: int = 0  # 1.3: ways to a GPU driver past the shim (dlmopen, deepbind.c)
    # Device memory (layout 1.2, docs/memory.md).
    mem_bytes: int = 0
    mem_peak: int = 0
    mem_want: int = 0  # bytes of the allocation it waits for; 0: not waiting
    mem_since_ns: int = 0
    mem_wait_ns: int = 0
    mem_waits: int = 0
    mem_grant: int = 0
    mem_deny: int = 0
    mem_oom_alone: int = 0
    mem_oom_shared: int = 0
    # Layout 2.0: the kind of the current memory wait (MEM_KINDS), `intercepted` at the last
    # completed drain, and memory waits so far per kind.
    mem_kind: int = 0
    mem_seen: int = 0
    drained_calls: int = 0
    mem_kind_waits: tuple[int, ...] = (0,) * len(MEM_KINDS)
    # Layout 2.2: the memory waiters' retries that failed, so far (a counter).
    mem_failed: int = 0

    @property
    def dead(self) -> bool:
        """A live slot whose process is gone: its counters are final (a slot being claimed, by
        a new process, is neither alive nor dead)."""
        return self.state == lib.KREX_SLOT_LIVE and not self.alive


@dataclass
class Tickets:
    """One drain request over a segment: per slot, the request count to wait for (0: none)."""

    gpu: int
    owner: int
    slots: Any  # cffi uint32_t[n_slots]
    asked: int = 0


class Segment:
    """A mapped KREX segment (create it in the controller, attach to it anywhere)."""

    def __init__(self, name: str, mm: mmap.mmap) -> None:
        self.name = name
        self._mm = mm
        self._buf: Any = ffi.from_buffer("char[]", mm, require_writable=True)
        rc = int(lib.krex_seg_check(self._buf, len(mm)))
        if rc != lib.KREX_OK:
            del self._buf
            mm.close()
            raise SegmentError(f"{name}: {ffi.string(lib.krex_strerror(rc)).decode()}")
        self._seg: Any = ffi.cast("struct krex_segment *", self._buf)
        self.n_gpus = int(self._seg.header.n_gpus)
        self.n_slots = int(self._seg.header.n_slots)

    @classmethod
    def create(cls, name: str, n_gpus: int = 1, n_slots: int = 256, mode: int = 0o600) -> Segment:
        """Create and initialise a new segment; fails if one of that name exists."""
        if not 1 <= n_gpus <= MAX_GPUS:
            raise ValueError(f"n_gpus must be 1..{MAX_GPUS}, got {n_gpus}")
        if not 1 <= n_slots <= MAX_SLOTS:
            raise ValueError(f"n_slots must be 1..{MAX_SLOTS}, got {n_slots}")
        size = int(ffi.sizeof("struct krex_segment")) + n_slots * int(
            ffi.sizeof("struct krex_slot")
        )
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=mode, size=size)
        except posix_ipc.ExistentialError as e:
            raise SegmentError(f"{name}: a segment of that name exists already") from e
        try:
            mm = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        buf = ffi.from_buffer("char[]", mm, require_writable=True)
        rc = int(lib.krex_seg_init(buf, size, n_gpus, n_slots))
        del buf
        if rc != lib.KREX_OK:
            mm.close()
            posix_ipc.unlink_shared_memory(name)
            raise SegmentError(f"{name}: {ffi.string(lib.krex_strerror(rc)).decode()}")
        return cls(name, mm)

    @classmethod
    def attach(cls, name: str, owner: int | None = None) -> Segment:
        """Map an existing segment and check its layout; with `owner`, also that it belongs to
        that uid and nobody else can write it (a daemon never adopts someone else's)."""
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError as e:
            raise SegmentError(f"{name}: no such KREX segment") from e
        try:
            if owner is not None:
                st = os.fstat(shm.fd)
                if st.st_uid != owner or st.st_mode & 0o022:
                    raise ForeignSegment(
                        f"{name} belongs to uid {st.st_uid} (mode {st.st_mode & 0o777:o}), not "
                        f"to this daemon's uid {owner} alone: refusing it (remove it, or set "
                        "another daemon.segment)"
                    )
            if shm.size < int(ffi.sizeof("struct krex_header")):
                raise SegmentError(f"{name}: {shm.size} bytes is too small for a KREX segment")
            mm = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        return cls(name, mm)

    def close(self) -> None:
        """Unmap (the segment itself stays until unlinked)."""
        if not self._mm.closed:
            self._seg = None
            del self._buf  # the buffer's export first: a mapping with one cannot close
            self._mm.close()

    def unlink(self) -> None:
        """Remove the segment's name; mappings stay valid until closed."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(self.name)

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Gate (the region protocol's step 1 and exit: docs/architecture.md).
    def gate_close(self, gpu: int, owner: int, deadline_s: float | None = None) -> int:
        """Close `gpu`'s gate to every tenant but `owner`; returns the region's epoch.

        deadline_s: seconds from now after which blocked threads pass on their own, the last
        line of defence against a controller that died without opening the gate.
        """
        if owner <= 0:
            raise ValueError(f"a tenant id is a positive integer, got {owner}")
        deadline = 0 if deadline_s is None else now_ns() + _ns(deadline_s)
        return int(lib.krex_gate_close(self._seg, _check_gpu(gpu, self.n_gpus), owner, deadline))

    def gate_open(self, gpu: int) -> None:
        """Open `gpu`'s gate and wake every thread blocked on it."""
        lib.krex_gate_open(self._seg, _check_gpu(gpu, self.n_gpus))

    def gate(self, gpu: int) -> Gate:
        """`gpu`'s gate as one read of its word: its epoch and the tenant it is closed for."""
        word = int(lib.krex_gate_word(self._seg, _check_gpu(gpu, self.n_gpus)))
        return Gate(epoch=word >> 32, owner=word & 0xFFFFFFFF)

    # Region protocol steps 2 and 3.
    def quiesce(self, gpu: int, owner: int, timeout_s: float) -> None:
        """Wait until no sibling of `owner` on `gpu` is half-way into the driver."""
        busy = ffi.new("uint32_t *")
        rc = int(
            lib.krex_quiesce(self._seg, _check_gpu(gpu, self.n_gpus), owner, _ns(timeout_s), busy)
        )
        if rc == lib.KREX_E_TIMEOUT:
            raise WaitTimeout("quiesce", int(busy[0]))
        if rc != lib.KREX_OK:
            raise KrexError(ffi.string(lib.krex_strerror(rc)).decode())

    def drain_request(self, gpu: int, owner: int) -> Tickets:
        """Ask every sibling of `owner` on `gpu` to drain; what to wait for (its .asked: how
        many were asked)."""
        tickets = Tickets(gpu, owner, ffi.new("uint32_t[]", self.n_slots))
        n = int(
            lib.krex_drain_request(self._seg, _check_gpu(gpu, self.n_gpus), owner, tickets.slots)
        )
        if n < 0:
            raise KrexError(ffi.string(lib.krex_strerror(n)).decode())
        tickets.asked = n
        return tickets

    def drain_await(self, tickets: Tickets, timeout_s: float) -> None:
        """Wait until every sibling asked (tickets) has drained since it was asked."""
        pending = ffi.new("uint32_t *")
        gpu, owner = _check_gpu(tickets.gpu, self.n_gpus), tickets.owner
        rc = int(
            lib.krex_drain_await(self._seg, gpu, owner, tickets.slots, _ns(timeout_s), pending)
        )
        if rc == lib.KREX_E_TIMEOUT:
            # Which processes did not answer (for the region's problems and the log).
            late = [
                v.pid
                for i in range(self.n_slots)
                if tickets.slots[i]
                and (v := self.slot(i)).alive
                and (v.drain_ack - int(tickets.slots[i])) % 2**32 >= 2**31
            ]
            raise WaitTimeout("drain", int(pending[0]), late)
        if rc != lib.KREX_OK:
            raise KrexError(ffi.string(lib.krex_strerror(rc)).decode())

    # Slots.
    def slot(self, index: int) -> SlotView:
        """Slot `index`, read field by field with atomic loads."""
        _check_slot(index, self.n_slots)
        v = ffi.new("struct krex_slot_view *")
        lib.krex_slot_read(self._seg, index, v)
        return _view(index, v)

    def slots(self) -> list[SlotView]:
        """Every slot that is not free."""
        return [
            self.slot(i)
            for i in range(self.n_slots)
            if int(self._seg.slots[i].state) != lib.KREX_SLOT_FREE
        ]

    def set_slot_tenant(self, index: int, pid: int, tenant: int) -> None:
        """Re-assign process `pid`'s live slot `index` to `tenant` (a pool worker's command)."""
        if int(lib.krex_slot_set_tenant(self._seg, index, pid, tenant)) != lib.KREX_OK:
            raise KrexError(f"slot {index} is not a live slot of process {pid}")

    def mem_grant(self, index: int) -> None:
        """Let slot `index`'s memory waiter retry its allocation."""
        _check_slot(index, self.n_slots)
        lib.krex_mem_grant(self._seg, index)

    def mem_deny(self, index: int) -> None:
        """End slot `index`'s memory waits with the driver's out-of-memory error, counted as
        errors the command would have had alone."""
        _check_slot(index, self.n_slots)
        lib.krex_mem_deny(self._seg, index)

    def mem_seen(self, index: int) -> None:
        """Tell slot `index`'s memory waiter that the controller passed over it (not its
        turn): it waits on instead of retrying on its own."""
        _check_slot(index, self.n_slots)
        lib.krex_mem_seen(self._seg, index)

    def slots_of(self, pid: int) -> list[SlotView]:
        """The slots a process (by pid) holds or held."""
        return [s for s in self.slots() if s.pid == pid]

    def reap(self) -> int:
        """Free the slots of dead processes; returns how many."""
        return int(lib.krex_slots_reap(self._seg))

    def reap_slot(self, index: int) -> SlotView | None:
        """Free slot `index` if its process is dead, and return it as it was (its counters are
        final); None if it was not freed (free, alive, or being claimed)."""
        _check_slot(index, self.n_slots)
        v = ffi.new("struct krex_slot_view *")
        if int(lib.krex_slot_reap(self._seg, index, v)) != 1:
            return None
        return _view(index, v)

    def set_controller(self, pid: int) -> None:
        """Declare the controller that holds the segment's liveness lock (krex/core/liveness.py)."""
        lib.krex_seg_set_controller(self._seg, pid)

    @property
    def controller_pid(self) -> int:
        """The controller that declared itself (layout 2.1; 0: none ever did)."""
        return int(lib.krex_seg_controller(self._seg))

    @property
    def overflow(self) -> Overflow:
        """Processes that found no free slot: gated but invisible to the drain."""
        h = self._seg.header
        return Overflow(int(h.overflow), [int(p) for p in h.overflow_pids if p])


class Gate(NamedTuple):
    """A gate's word: its epoch (each close bumps it) and its owner (0: open)."""

    epoch: int
    owner: int


class Overflow(NamedTuple):
    """Processes that found no free slot: how many, and the first ones' pids (layout 1.3)."""

    total: int
    pids: list[int]


def _check_slot(index: int, n_slots: int) -> None:
    if not 0 <= index < n_slots:
        raise IndexError(f"slot {index} out of range 0..{n_slots - 1}")


def _check_gpu(gpu: int, n_gpus: int) -> int:
    if not 0 <= gpu < n_gpus:
        raise ValueError(f"GPU {gpu} is not in this segment (it has {n_gpus})")
    return gpu


def _view(index: int, v: Any) -> SlotView:
    """A SlotView of a struct krex_slot_view (cffi) read from slot `index`."""
    return SlotView(
        index=index,
        state=int(v.state),
        pid=int(v.pid),
        tenant=int(v.tenant),
        gpu=int(v.gpu),
        gpus=int(v.gpus),
        in_flight=int(v.in_flight),
        intercepted=int(v.intercepted),
        blocked=int(v.blocked),
        unmatched=int(v.unmatched),
        ungated=int(v.ungated),
        drain_req=int(v.drain_req),
        drain_ack=int(v.drain_ack),
        alive=bool(v.alive),
        **{f: int(getattr(v, f)) for f in _MEM_FIELDS},
        mem_kind_waits=tuple(int(v.mem_kind_waits[k]) for k in range(len(MEM_KINDS))),
    )
