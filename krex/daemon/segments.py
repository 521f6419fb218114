"""The node's shared-memory segments, as the daemon keeps them.

The gates' segment (readable by all, written by the daemon; tenants map it read-only) and one
segment of process slots per tenant and per pool worker (`<gates>-t<id>`, written by that
tenant's processes only), plus those of tenants gone whose processes have not all exited yet,
or that a crashed predecessor left: they are still drained until their last process exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import time
from collections.abc import Iterable, Iterator
from itertools import zip_longest
from pathlib import Path

from krex.core.shm import ForeignSegment, Segment, SegmentError, SlotView
from krex.core.tenants import recover
from krex.daemon.model import Tenant

log = logging.getLogger("krex.daemon")
# Planted slot-segment names skipped in a row before an admission gives up with one error (a
# stat each: cheap; a planter who makes more has to make them faster than ids are taken).
_PLANTED_MAX = 1024


class Segments:
    """The gates' segment and every segment of process slots."""

    def __init__(self, name: str, n_gpus: int, slots_per_gpu: int, root: str) -> None:
        self.n_gpus = n_gpus
        self.lock_fd: int | None = None  # the gates segment, flock'ed for the daemon's life
        self.next_id = 1  # above every tenant id a predecessor used
        self.created = False  # the gates segment is new (not a dead predecessor's)
        self.gates = self._gates(name, n_gpus, slots_per_gpu, root)
        self.inode = _inode(self.gates.name)
        self.tenants: dict[int, Segment] = {}  # by tenant (or pool worker) id
        self.orphans: list[Segment] = self._adopt()
        self.closed = False  # at shutdown; connections that end afterwards find no segment

    def _gates(self, name: str, n: int, slots_per_gpu: int, root: str) -> Segment:
        try:
            seg: Segment | None = Segment.attach(name, owner=os.geteuid())
        except ForeignSegment:
            raise  # someone else's: never "recovered"
        except SegmentError:
            seg = None  # none, or damaged: made anew
        if seg is not None:
            # One daemon per segment: a second one (on another socket, same daemon.segment)
            # must not reopen the first one's gates and thaw its siblings mid-region.
            self.lock_fd = _lock(name)
        if seg is not None and seg.n_gpus == n:
            # A predecessor died: its gates may be closed and its tenants frozen. Reopen and
            # thaw everything; tenants that are still running carry on with this segment.
            for g in range(n):
                seg.gate_open(g)
            thawed = recover(root)
            self.next_id = 1 + max((s.tenant for s in seg.slots()), default=0)
            log.warning("recovered segment %s: gates reopened, %d group(s) thawed", name, thawed)
            return seg
        if seg is not None:
            seg.close()
        unlink(name)
        if self.lock_fd is not None:  # the lock of the old file, now gone
            os.close(self.lock_fd)
            self.lock_fd = None
        recover(root)
        # Readable by all (gates are no secret; tenants map them read-only), writable by us.
        slots = min(4096, max(64, 16 * n * slots_per_gpu))
        created = Segment.create(name, n_gpus=n, n_slots=slots, mode=0o644)
        self.created = True
        self.lock_fd = _lock(name)
        return created

    def _adopt(self) -> list[Segment]:
        """Tenants' slot segments a crashed predecessor left: keep draining their live slots."""
        adopted = []
        prefix = self.gates.name.lstrip("/") + "-t"
        with contextlib.suppress(OSError):
            for entry in os.listdir("/dev/shm"):
                if not (entry.startswith(prefix) and entry[len(prefix) :].isdigit()):
                    continue
                try:
                    seg = Segment.attach("/" + entry, owner=os.geteuid())
                except ForeignSegment as e:
                    # Not ours: its id is skipped when it comes (new_tenant), and it does not
                    # push our ids up (a planted "-t4294967295" would overflow them).
                    log.warning("not adopting %s: %s", entry, e)
                    continue
                except SegmentError:
                    unlink("/" + entry)
                    continue
                self.next_id = max(self.next_id, int(entry[len(prefix) :]) + 1)
                if _in_use(seg):
                    adopted.append(seg)
                else:
                    seg.unlink()
                    seg.close()
        return adopted

    def take_id(self) -> int:
        """A fresh id for a tenant or a pool worker's slot segment."""
        self.next_id += 1
        return self.next_id - 1

    def name_of(self, tid: int) -> str:
        return f"{self.gates.name}-t{tid}"

    def create(self, tid: int, slots: int) -> Segment:
        """The slot segment of a new tenant (or pool worker) with this id. ForeignSegment when
        someone else holds its name (another uid can make any name in /dev/shm first, and the
        sticky directory forbids removing it): new_tenant() then takes the next id."""
        name = self.name_of(tid)
        path = Path("/dev/shm", name.lstrip("/"))
        for _ in range(2):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_uid != os.geteuid():
                raise ForeignSegment(
                    f"{name} belongs to uid {st.st_uid} (mode {st.st_mode & 0o777:o}), not to "
                    f"this daemon's uid {os.geteuid()}"
                )
            if st is not None:
                unlink(name)  # a stale one of a predecessor's tenant with this id
            try:
                seg = Segment.create(name, n_gpus=self.n_gpus, n_slots=slots)
            except SegmentError:
                continue  # made meanwhile: whose it is decides on the next pass
            self.tenants[tid] = seg
            return seg
        raise SegmentError(f"{name} keeps being made again under the daemon")

    def new_tenant(self, slots: int) -> tuple[int, Segment]:
        """A fresh id and its slot segment; a name someone else planted is skipped (logged),
        and after many in a row one SegmentError says whose they are."""
        last: ForeignSegment | None = None
        for _ in range(_PLANTED_MAX):
            tid = self.take_id()
            try:
                return tid, self.create(tid, slots)
            except ForeignSegment as e:
                log.warning("skipping tenant id %d: %s", tid, e)
                last = e
        raise SegmentError(
            f"cannot make a slot segment: the next {_PLANTED_MAX} names are someone else's "
            f"({last}); remove them"
        )

    def discard(self, tid: int) -> None:
        """A tenant that was never set up: its new segment goes (no process ever mapped it).
        Its name at once; its mapping with the next `account` pass (a worker thread may be
        reading every segment now: a region's drain, a grant's audit)."""
        seg = self.tenants.pop(tid, None)
        if seg is not None:
            seg.unlink()
            if self.closed:
                seg.close()
            else:
                self.orphans.append(seg)

    def retire(self, tid: int) -> None:
        """Its tenant is gone: the segment stays (and is drained) until its last process exits."""
        seg = self.tenants.pop(tid, None)
        if seg is not None and not self.closed:
            self.orphans.append(seg)

    def all(self) -> list[Segment]:
        """Every segment that holds process slots: the gates' own (older shims, tests), each
        tenant's, and those of tenants gone whose processes linger."""
        return [] if self.closed else [self.gates, *self.tenants.values(), *self.orphans]

    def live_slots(self) -> Iterator[tuple[Segment, SlotView]]:
        """Every process slot that is not free, with its segment."""
        for seg in self.all():
            for s in seg.slots():
                yield seg, s

    def live_by_tenant(self) -> dict[int, list[SlotView]]:
        """The slots of live processes, by tenant id: one pass over every segment."""
        out: dict[int, list[SlotView]] = {}
        for _, s in self.live_slots():
            if s.alive:
                out.setdefault(s.tenant, []).append(s)
        return out

    def hand_over(self, seg_id: int, index: int, pid: int, old: Tenant | None, new: int) -> None:
        """Process pid's slot `index` (in tenant seg_id's segment) passes to tenant `new`: what
        it counted for `old` is folded into old first, since the hand-over starts the slot's
        counters again (a pool worker's next command must not inherit them, nor its last
        command lose them when its worker is given back before its report is made)."""
        seg = self.tenants[seg_id]
        if old is not None:
            view = seg.slot(index)
            if view.tenant == old.id and view.pid == pid:
                _fold(old, view)
        seg.set_slot_tenant(index, pid, new)

    def to_drain(self, skip: Iterable[int]) -> list[Segment]:
        """The segments a region's quiesce and drain wait on: all but those of the ids in skip."""
        left_out = set(skip)
        own = [seg for tid, seg in self.tenants.items() if tid not in left_out]
        return [self.gates, *own, *self.orphans]

    def account(self, tenants: dict[int, Tenant], *, draining: bool) -> None:
        """Fold the counters of dead processes' slots into their tenants, free those slots,
        and remove orphaned segments whose processes are all gone (not while a region is
        being set up: its quiesce and drain run on these mappings in a worker thread)."""
        for seg in self.all():
            for s in seg.slots():
                if not s.dead:
                    continue
                # Taken, copied and freed in one step (krex_slot_reap): what is folded is what
                # was freed. None: a process of the tenant reclaimed it first and carries its
                # counters on in its own (shim/preload/gate.c), or it was freed already.
                final = seg.reap_slot(s.index)
                if final is not None and (owner := tenants.get(final.tenant)) is not None:
                    _fold(owner, final)
        for seg in [] if draining or self.closed else list(self.orphans):
            if not _in_use(seg):
                self.orphans.remove(seg)
                seg.unlink()
                seg.close()

    def totals(self, t: Tenant) -> Tenant:
        """t's counters with those of its processes not folded yet added: the live ones, and
        any that died since the last pass (a copy; t is unchanged)."""
        total = dataclasses.replace(t)
        for seg in self.all():
            for s in seg.slots():
                if s.tenant == t.id and (s.alive or s.dead):
                    _fold(total, s)
        return total

    def linked(self) -> bool:
        """Whether the gates' segment is still the one under its name (not removed by hand,
        or by systemd-logind's RemoveIPC)."""
        return self.inode is not None and _inode(self.gates.name) == self.inode

    def close(self) -> list[str]:
        """At shutdown: each segment is removed unless processes still use it (new processes
        of theirs attach by name; the last `krex run` to end removes it, krex/client/leftovers.py,
        or a successor adopts it). Returns the names that stay."""
        self.closed = True
        kept = []
        for seg in [*self.tenants.values(), *self.orphans, self.gates]:
            if _in_use(seg):
                kept.append(seg.name)
            else:
                seg.unlink()
            seg.close()
        self._unlock()
        return kept

    def abandon(self) -> None:
        """The daemon did not start: the gates segment goes if it made it; one a dead
        predecessor left (and the segments of its tenants) stays for the next daemon."""
        if self.created:
            self.close()
            return
        self.closed = True
        for seg in [*self.orphans, self.gates]:
            seg.close()
        self._unlock()

    def _unlock(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def _fold(t: Tenant, s: SlotView) -> None:
    """Add a process slot's counters to its tenant's. A memory wait still on (a live process's)
    or cut short (its process ended waiting: killed, preempted) counts too, its time up to
    now: the shim counts a wait only as it ends, so a preempted attempt's report said it never
    waited."""
    t.intercepted += s.intercepted
    t.blocked += s.blocked
    t.mem_peak = max(t.mem_peak, s.mem_peak)
    t.mem_wait_ns += s.mem_wait_ns
    t.mem_waits += s.mem_waits
    t.mem_oom_alone += s.mem_oom_alone
    t.mem_oom_shared += s.mem_oom_shared
    kinds = list(s.mem_kind_waits)
    if s.mem_want and s.mem_since_ns:
        t.mem_waits += 1
        t.mem_wait_ns += max(0, time.monotonic_ns() - s.mem_since_ns)
        if s.mem_kind < len(kinds):
            kinds[s.mem_kind] += 1
    t.mem_kind_waits = [a + b for a, b in zip_longest(t.mem_kind_waits, kinds, fillvalue=0)]


def _lock(name: str) -> int:
    """Hold an exclusive flock on the segment's file for as long as the fd stays open; refuse
    when another process (another daemon) holds it."""
    fd = os.open(Path("/dev/shm", name.lstrip("/")), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SegmentError(
            f"segment {name} is in use by another krex daemon: give this one another "
            "daemon.segment (or socket)"
        ) from None
    return fd


def _in_use(seg: Segment) -> bool:
    return any(s.alive for s in seg.slots())


def _inode(shm_name: str) -> int | None:
    """The inode behind a POSIX shared-memory name (None when the name is gone)."""
    try:
        return os.stat(Path("/dev/shm", shm_name.lstrip("/"))).st_ino
    except OSError:
        return None


def unlink(name: str) -> None:
    """Remove a segment's name if it is there and we may (another uid's in the sticky /dev/shm
    stays: whoever maps it next checks its owner)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        Path("/dev/shm", name.lstrip("/")).unlink()
