"""The processes of one tenant, and what the controller does to them: freeze and pin.

These are steps 4 and 5 of the region protocol (docs/architecture.md): a sibling tenant is frozen
while a region runs, and the region's owner is moved onto the GPU's region cores. A tenant's
processes live in a group: a cgroup (v2, or the v1 freezer and cpuset hierarchies) when the
controller may create one, else the process tree under the processes it was given (the signal
freezer, SIGSTOP/SIGCONT). Whatever the kind, every wait is bounded, the controller itself never
joins a group, and a process that exits while it is being looked at is not an error.

After a controller crash, `recover` thaws what it left frozen: the cgroups under its root and
the processes the signal freezer stopped, which it records (pid and start time) in
``$XDG_RUNTIME_DIR/krex/<root>.stopped`` (else ``/tmp/krex-<uid>/<root>.stopped``) before it
stops them.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Iterable
from enum import Enum
from pathlib import Path

import psutil

from krex.core import trust
from krex.core.errors import KrexError
from krex.core.kernelfs import read as _read
from krex.core.procs import self_and_ancestors
from krex.core.slices import format_cpu_list

# Where the hierarchies are mounted; module attributes so that a test can point them elsewhere.
V2_MOUNT = "/sys/fs/cgroup"
V1_FREEZER = "/sys/fs/cgroup/freezer"
V1_CPUSET = "/sys/fs/cgroup/cpuset"

_ROOT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_MOVE_TIMEOUT_S = 2.0  # destroy(): moving processes out and removing the directories
_PIN_PASSES = 5  # pin(): re-scans for threads started while the others were being moved
_VFORK_NUDGE_S = 0.05  # freeze(): not frozen this long, look for a parent held by a vfork child
# freeze() with processes left awake: the child group of the freezer group that is frozen
# (the awake ones stay in its parent, which is not).
SPLIT_NAME = "frozen"

log = logging.getLogger("krex.tenants")


class FreezerKind(str, Enum):
    """How a tenant's processes are grouped and frozen."""

    CGROUP_V2 = "cgroup-v2"
    CGROUP_V1 = "cgroup-v1"
    SIGNAL = "signal"


class TenantsError(KrexError):
    """A tenant group cannot be made or used; the message is one clear sentence."""


# --- small file and /proc helpers ------------------------------------------------------------


def _write(path: str, text: str) -> None:
    """Write `text` with one write(2), as cgroup files want; failures become TenantsError."""
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise TenantsError(f"Cannot write {text!r} to {path}: {e.strerror}.") from e


# psutil (krex/core/procs.py) answers the look-ups made once per call: ancestors, mounts. What runs
# inside a region's set-up (the signal freezer's scan and stop checks, pinning every thread)
# reads /proc directly, because psutil is slower there or lacks the field (measured on the dev
# machine, 70 processes): listing 64 threads is 36 us with os.listdir and 980 us with
# psutil.Process.threads(), which parses each thread's stat for CPU times; psutil has no
# per-thread state at all (a signal freeze waits for every thread to be stopped); and one scan
# of the process tree is 1.1 ms by hand against 3.3 ms with psutil.process_iter. The start time
# stays the kernel's (clock ticks after boot): the signal freezer's record must match it after a
# controller restart, and psutil only offers it as wall-clock seconds (boot time + ticks), which
# moves when the clock is stepped.


def _stat(path: str) -> tuple[str, int, int] | None:
    """(state, ppid, start time) from a /proc/<pid>[/task/<tid>]/stat file; None when gone."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return rest[0].decode(), int(rest[1]), int(rest[19])  # fields 3, 4 and 22
    except (IndexError, ValueError):
        return None


def _start_time(pid: int) -> int | None:
    """The start time (clock ticks after boot) of a live process; None when there is none."""
    st = _stat(f"/proc/{pid}/stat")
    return None if st is None or st[0] in "ZX" else st[2]


def _tids(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return []


def _fully_stopped(pid: int) -> bool:
    """True when no thread of `pid` can run: each is stopped, traced-stopped, dead, or gone."""
    for tid in _tids(pid):
        st = _stat(f"/proc/{pid}/task/{tid}/stat")
        if st is not None and st[0] not in "tTZX":
            return False
    return True


def _wchan(pid: int) -> str:
    """Where in the kernel the process sleeps ("" where gone, or hidden by the kernel)."""
    return _read(f"/proc/{pid}/wchan") or ""


def _states(pids: Iterable[int]) -> dict[int, str]:
    """Each process's state letter and kernel wait channel (for a log line)."""
    out = {}
    for pid in pids:
        st = _stat(f"/proc/{pid}/stat")
        out[pid] = f"{st[0] if st else 'gone'} {_wchan(pid) or '?'}"
    return out


def _in_vfork(pid: int) -> bool:
    """Whether the process sleeps in the kernel waiting for a vfork child."""
    return _wchan(pid) in ("kernel_clone", "wait_for_vfork_done")


def _dead(pid: int) -> bool:
    """Gone, or exited and not yet reaped (a zombie): it runs nothing any more."""
    st = _stat(f"/proc/{pid}/stat")
    return st is None or st[0] in "ZX"


def _forked_by(keep: set[int], pids: Iterable[int], known: set[int]) -> set[int]:
    """`keep` and those of `pids` not in `known` (the processes seen when the freeze began)
    that one of them forked since: what a process left awake forks stays awake."""
    parent = {p: st[1] for p in pids if p not in known and (st := _stat(f"/proc/{p}/stat"))}
    out = set(keep)
    grew = True
    while grew:
        new = {p for p, pp in parent.items() if pp in out and p not in out}
        out |= new
        grew = bool(new)
    return out


def _pin_threads(pids: Iterable[int], cpus: set[int]) -> None:
    """sched_setaffinity on every thread of every process, catching threads started meanwhile."""
    for pid in pids:
        done: set[int] = set()
        # A thread started by a thread not yet moved inherits the old mask: scan again.
        for _ in range(_PIN_PASSES):
            new = [t for t in _tids(pid) if t not in done]
            if not new:
                break
            for tid in new:
                try:
                    os.sched_setaffinity(tid, cpus)
                except ProcessLookupError:
                    pass
                except OSError as e:
                    raise TenantsError(
                        f"Cannot pin thread {tid} of process {pid} onto CPUs "
                        f"{format_cpu_list(cpus)}: {e.strerror}."
                    ) from e
                done.add(tid)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file-system type, options) of every mount this process sees, in the
    kernel's order (/proc/self/mounts, octal escapes decoded)."""
    try:
        parts = psutil.disk_partitions(all=True)
    except OSError:
        return []
    return [(os.path.normpath(p.mountpoint), p.fstype, set(p.opts.split(","))) for p in parts]


def _is_mount(path: str, fstype: str, option: str | None = None) -> bool:
    path = os.path.normpath(path)
    # The last entry for a mount point is the one on top.
    found = [(t, o) for p, t, o in _mounts() if p == path]
    return bool(found) and found[-1][0] == fstype and (option is None or option in found[-1][1])


def _probe(mount: str, needed: str) -> str | None:
    """Why a group cannot be made under `mount` with a writable `needed` file; None if it can."""
    if not os.access(mount, os.W_OK):
        return f"{mount} is not writable (it needs root or a delegated hierarchy)"
    probe = os.path.join(mount, f"krex-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot create a group under {mount}: {e.strerror}"
    try:
        if not os.access(os.path.join(probe, needed), os.W_OK):
            return f"groups under {mount} have no writable {needed}"
        return None
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def _v2_problem() -> str | None:
    if not _is_mount(V2_MOUNT, "cgroup2"):
        return f"{V2_MOUNT} is not a cgroup2 mount"
    return _probe(V2_MOUNT, "cgroup.freeze")


def _v1_problem(mount: str, controller: str, needed: str) -> str | None:
    if not _is_mount(mount, "cgroup", controller):
        return f"no cgroup v1 {controller} hierarchy is mounted at {mount}"
    return _probe(mount, needed)


def detect_freezer(preferred: str = "auto") -> FreezerKind:
    """The freezer to use: `preferred` if it works, or for "auto" the best that works here.

    "auto" picks cgroup-v2 when /sys/fs/cgroup is a writable cgroup2 mount whose groups can be
    frozen, else cgroup-v1 when the v1 freezer hierarchy is mounted and writable, else signal.
    An explicit cgroup-v2 or cgroup-v1 that cannot be used raises TenantsError saying why.
    """
    choice = (preferred.value if isinstance(preferred, FreezerKind) else preferred).strip().lower()
    if choice == FreezerKind.SIGNAL.value:
        return FreezerKind.SIGNAL
    if choice == FreezerKind.CGROUP_V2.value:
        why = _v2_problem()
        if why:
            raise TenantsError(f"The cgroup-v2 freezer cannot be used: {why}.")
        return FreezerKind.CGROUP_V2
    if choice == FreezerKind.CGROUP_V1.value:
        why = _v1_problem(V1_FREEZER, "freezer", "freezer.state")
        if why:
            raise TenantsError(f"The cgroup-v1 freezer cannot be used: {why}.")
        return FreezerKind.CGROUP_V1
    if choice == "auto":
        if _v2_problem() is None:
            return FreezerKind.CGROUP_V2
        if _v1_problem(V1_FREEZER, "freezer", "freezer.state") is None:
            return FreezerKind.CGROUP_V1
        return FreezerKind.SIGNAL
    raise TenantsError(
        f"Unknown freezer {preferred!r}; expected auto, cgroup-v2, cgroup-v1 or signal."
    )


# --- the signal freezer's record of stopped processes ----------------------------------------

_STATE_LOCK = threading.Lock()


def _state_dir() -> Path:
    from krex.core.trust import TrustError, runtime_dir

    try:
        return runtime_dir()
    except TrustError as e:
        raise TenantsError(str(e)) from e


def _state_path(root: str) -> Path:
    """The file listing the processes the signal freezer stopped for groups under `root`."""
    return _state_dir() / f"{root}.stopped"


def _parse_state(text: str) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2 and f[0].isdigit() and f[1].isdigit():
            out.add((int(f[0]), int(f[1])))
    return out


def _state_edit(root: str, add: set[tuple[int, int]], drop: set[tuple[int, int]]) -> None:
    """Add and remove (pid, start time) lines; the file goes away when it would be empty.

    Groups of one root share the file: edits are serialised by a lock in this process and by
    flock on the directory between processes, and the file is replaced atomically.
    """
    d = _state_dir()
    with _STATE_LOCK:
        if add:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            if d.stat().st_uid != os.getuid():
                raise TenantsError(f"{d} belongs to another user; it cannot hold KREX's state.")
        try:
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)
            path = d / f"{root}.stopped"
            try:
                entries = _parse_state(path.read_text())
            except FileNotFoundError:
                entries = set()
            entries = (entries | add) - drop
            if not entries:
                path.unlink(missing_ok=True)
                return
            tmp = d / f"{root}.stopped.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.writelines(f"{pid} {start}\n" for pid, start in sorted(entries))
            os.replace(tmp, path)
        finally:
            os.close(dfd)


# --- groups ------------------------------------------------------------------------------------


def _check_root(root: str) -> None:
    if not _ROOT_NAME.fullmatch(root) or root in (".", ".."):
        raise TenantsError(
            f"{root!r} is not a usable group root name (letters, digits, '.', '_', '-')."
        )


# The control files of a group that krex writes: whoever else can write one can thaw a frozen
# sibling mid-region or move processes out of the group krex freezes.
_CONTROL_FILES = ("cgroup.procs", "cgroup.freeze", "freezer.state", "cpuset.cpus", "cpuset.mems")


def _mkdir(path: str) -> None:
    """Create the cgroup `path`, or take up an existing one only when it is ours (docs/security.md):
    a directory (not a symlink) owned by us or root, it and its control files writable by
    nobody else; refused with TenantsError otherwise."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as e:
        raise TenantsError(f"Cannot create the cgroup {path}: {e.strerror}.") from e
    try:
        st = os.lstat(path)
    except OSError as e:
        raise TenantsError(f"Cannot use the cgroup {path}: {e.strerror}.") from e
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise TenantsError(f"Refusing the cgroup {path}: not a directory (a symlink or a file).")
    if not trust.safe_stat(st):
        raise TenantsError(
            f"Refusing the cgroup {path}: owned by uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}; krex uses only groups that no one but you or root "
            "can change. Remove it (as its owner or root) and start again."
        )
    for name in _CONTROL_FILES:
        try:
            fst = os.lstat(os.path.join(path, name))
        except OSError:
            continue  # not in this hierarchy
        if not trust.safe_stat(fst):
            raise TenantsError(
                f"Refusing the cgroup {path}: its {name} is owned by uid {fst.st_uid} with mode "
                f"{stat.S_IMODE(fst.st_mode):o}, so someone else could write it (thaw or empty "
                "the group). Remove the group (as its owner or root) and start again."
            )


def _procs(group: str) -> list[int]:
    text = _read(os.path.join(group, "cgroup.procs"))
    return sorted({int(p) for p in text.split()}) if text else []


class TenantGroup:
    """The processes of one tenant: add them, list them, freeze, thaw, pin, destroy.

    Make one with `TenantGroup.create`. Methods are serialised per group, so a thaw() issued
    while another thread's freeze() waits runs once that bounded wait is over.
    """

    kind: FreezerKind

    def __init__(self, root: str, tenant: int) -> None:
        self.root = root
        self.tenant = tenant
        self._lock = threading.RLock()
        self._awake: set[int] = set()

    @classmethod
    def create(cls, kind: FreezerKind, root: str, tenant: int) -> TenantGroup:
        """A group for `tenant` under `root` (a name such as "krex"); existing groups are reused.

        cgroup-v2: /sys/fs/cgroup/<root>/t<tenant>, with +cpuset enabled below <root> when the
        parent offers it. cgroup-v1: <root>/t<tenant> in the freezer hierarchy and, when it is
        mounted and writable, in the cpuset one. signal: no cgroup, a process tree.
        """
        _check_root(root)
        if tenant < 0:
            raise TenantsError(f"{tenant} is not a tenant id (0 or more).")
        try:
            kind = FreezerKind(kind)
        except ValueError:
            raise TenantsError(
                f"Unknown freezer {kind!r}; expected cgroup-v2, cgroup-v1 or signal."
            ) from None
        if kind is FreezerKind.CGROUP_V2:
            return _V2Group(root, tenant)
        if kind is FreezerKind.CGROUP_V1:
            return _V1Group(root, tenant)
        return _SignalGroup(root, tenant)

    @property
    def pin_method(self) -> str:
        """How pin() works here: "cpuset" (the group's cpuset) or "affinity" (every thread)."""
        return "affinity"

    def add(self, pid: int) -> None:
        """Put process `pid` into the group; the children it forks from now on follow it.

        Refuses the calling process and its ancestors: the controller must never be frozen.
        """
        if pid <= 0:
            raise TenantsError(f"{pid} is not a process id.")
        if pid in self_and_ancestors():
            raise TenantsError(
                f"Process {pid} is the controller or one of its ancestors; "
                "it cannot join a group that may be frozen."
            )
        if _start_time(pid) is None:
            raise TenantsError(f"Process {pid} does not exist.")
        with self._lock:
            self._add(pid)

    def remove(self, pid: int) -> None:
        """Process `pid` leaves the group for another one (a pool worker between tenants).

        A cgroup needs nothing: adding the process to the other group moves it. The signal
        freezer, which only tracks processes, forgets it (and the children it forks)."""
        with self._lock:
            self._remove(pid)

    def pids(self) -> list[int]:
        """Every live process of the tenant, sorted."""
        with self._lock:
            return self._pids()

    def freeze(self, timeout_s: float, awake: Iterable[int] = ()) -> bool:
        """Freeze every process but those in `awake`, which keep running, as do the processes
        they fork from now on; True once all others are frozen, False after `timeout_s`.

        A cgroup group is split for that: its child group (SPLIT_NAME) is frozen, the awake
        ones stay in the group. Where the split cannot be made, the whole group is frozen
        (logged): never less than asked. On time-out what could be frozen stays frozen;
        thaw() undoes it.
        """
        with self._lock:
            return self._freeze(time.monotonic() + max(0.0, timeout_s), set(awake))

    def awake(self) -> list[int]:
        """The processes the current freeze left running (none when thawed or frozen whole)."""
        # Not locked: read on the daemon's event loop while another thread may be in a freeze
        # (bounded, but long); the set is replaced, never changed, once it is published.
        return sorted(self._awake)

    def thaw(self) -> None:
        """Let every process run again; always safe to call, idempotent."""
        with self._lock:
            self._thaw()

    def pin(self, cpus: set[int]) -> None:
        """Move every thread of every process (and the children they fork) onto `cpus`."""
        if not cpus or min(cpus) < 0:
            raise TenantsError(
                f"Cannot pin onto {sorted(cpus)}: a non-empty set of CPUs (0 or more) is needed."
            )
        with self._lock:
            self._pin(set(cpus))

    def destroy(self) -> None:
        """Thaw, give the remaining processes back to the root group and remove the group.

        Idempotent; the processes keep running.
        """
        with self._lock:
            self._destroy()

    # Implemented by each kind.
    def _add(self, pid: int) -> None:
        raise NotImplementedError

    def _remove(self, pid: int) -> None:
        pass

    def _pids(self) -> list[int]:
        raise NotImplementedError

    def _freeze(self, deadline: float, awake: set[int]) -> bool:
        raise NotImplementedError

    def _thaw(self) -> None:
        raise NotImplementedError

    def _pin(self, cpus: set[int]) -> None:
        raise NotImplementedError

    def _destroy(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind.value} {self.root}/t{self.tenant}>"


def _wait(until: float, delay: float, longest: float = 0.01) -> float:
    """Sleep a little (never past `until`); returns the next, longer, delay (at most
    `longest`)."""
    time.sleep(max(0.0, min(delay, until - time.monotonic())))
    return min(delay * 2, longest)


# A freeze is on a region's critical path: its state is read at least every millisecond (a
# read is microseconds). Doubling to 10 ms from 0.2, a freeze done 6.3 ms in was seen at 12.6.
_FREEZE_POLL_S = 0.001


class _CgroupGroup(TenantGroup):
    """Common part of the v1 and v2 groups: membership, freezing and pinning through files."""

    def __init__(self, root: str, tenant: int) -> None:
        super().__init__(root, tenant)
        self._groups: list[tuple[str, str]] = []  # (hierarchy mount, group directory)
        self._freeze_dir = ""
        self._cpuset_dir: str | None = None
        self.pin_fallback_reason: str | None = None  # why pin() cannot use a cpuset
        self._split = False  # frozen with processes left awake: only the child group is

    @property
    def pin_method(self) -> str:
        return "cpuset" if self._cpuset_dir else "affinity"

    @property
    def _child(self) -> str:
        """The freezer group's child that a freeze with processes left awake freezes."""
        return os.path.join(self._freeze_dir, SPLIT_NAME)

    def _freeze_file(self, group: str) -> tuple[str, str, str]:
        """(file, text that freezes, text that thaws) of the freezer group `group`."""
        raise NotImplementedError

    def _is_frozen(self, group: str) -> bool:
        raise NotImplementedError

    def _add(self, pid: int) -> None:
        for _, group in self._groups:
            if self._split and group == self._freeze_dir:
                group = self._child  # as with a whole group: joining a frozen one freezes
            try:
                _write(os.path.join(group, "cgroup.procs"), str(pid))
            except TenantsError as e:
                if _start_time(pid) is None:
                    raise TenantsError(f"Process {pid} exited before it joined {group}.") from e
                raise

    def _pids(self) -> list[int]:
        return sorted({*_procs(self._freeze_dir), *_procs(self._child)})

    def _evict_self(self) -> None:
        # Defensive: add() refuses the controller, but anyone with write access can move it.
        if os.getpid() in self._pids():
            for mount, _ in self._groups:
                _write(os.path.join(mount, "cgroup.procs"), str(os.getpid()))

    def _freeze(self, deadline: float, awake: set[int]) -> bool:
        self._evict_self()
        known = set(self._pids())
        keep = awake & known
        if keep and not self._split_off(keep, known):
            keep = set()
        delay = 0.0002
        try:
            # Every stray in the child before it freezes: a process moved into a freezing group
            # freezes at once, and one moved mid-vfork (forked before its parent moved) would
            # hold its parent in the kernel, unfreezable, until the time-out.
            while keep and not self._sweep(keep, known):  # strays forked meanwhile
                if time.monotonic() >= deadline:
                    log.warning(
                        "tenant %d: processes kept appearing beside those left running "
                        "(%s) until the freeze's time-out",
                        self.tenant,
                        sorted(keep),
                    )
                    return False
                delay = _wait(deadline, delay)
        except TenantsError as e:
            self._whole(keep, e)
            keep = set()
        group = self._child if keep else self._freeze_dir
        path, frozen, _ = self._freeze_file(group)
        _write(path, frozen)
        self._split = bool(keep)
        self._awake = keep
        nudge = time.monotonic() + _VFORK_NUDGE_S
        while not self._is_frozen(group):
            if time.monotonic() >= nudge:
                nudge = time.monotonic() + _VFORK_NUDGE_S
                self._nudge(group)
            if time.monotonic() >= deadline:
                log.warning(
                    "tenant %d: %s not frozen at the freeze's time-out (processes and states %s)",
                    self.tenant,
                    group,
                    _states(_procs(group)),
                )
                return False
            delay = _wait(deadline, delay, _FREEZE_POLL_S)
        return True

    def _nudge(self, group: str) -> None:
        """A process forked with vfork that froze before its exec holds its parent in the
        kernel (in clone), where the freezer does not count it frozen: thaw the group a moment
        so that the child execs, then freeze it again."""
        if not any(_in_vfork(pid) for pid in _procs(group)):
            return
        path, frozen, thawed = self._freeze_file(group)
        _write(path, thawed)
        time.sleep(0.001)
        _write(path, frozen)

    def _whole(self, keep: set[int], why: TenantsError) -> None:
        """Say that the whole group is frozen after all, where leaving `keep` running failed."""
        log.warning(
            "tenant %d: cannot leave processes %s running while the rest is frozen (%s); "
            "freezing all of them", self.tenant, sorted(keep), why,
        )  # fmt: skip

    def _split_off(self, keep: set[int], known: set[int]) -> bool:
        """Move the processes to freeze into the child group and `keep` into the group; False
        (logged) where that cannot be done, and the whole group is to be frozen."""
        try:
            _mkdir(self._child)
            self._check_split()
            # Only the misplaced move (a cgroup migration is costly): after the first split
            # the workers stay awake in the group and the context holders in the child.
            in_child = set(_procs(self._child))
            for pid in sorted(known):
                if (pid in keep) == (pid in in_child):
                    _move(self._freeze_dir if pid in keep else self._child, pid)
        except TenantsError as e:
            self._whole(keep, e)
            return False
        return True

    def _check_split(self) -> None:
        """TenantsError where the group cannot hold processes beside its child."""

    def _sweep(self, keep: set[int], known: set[int]) -> bool:
        """Move into the frozen child what the group holds beside `keep` and what they forked
        since (a process forked by one being moved); True when there was none. `keep` grows by
        the children of awake ones."""
        here = _procs(self._freeze_dir)
        keep |= _forked_by(keep, here, known)
        # An exited process not yet reaped stays listed and cannot be moved (nor run): not a
        # stray, or the sweep would never end.
        strays = [p for p in here if p not in keep and not _dead(p)]
        for pid in strays:
            _move(self._child, pid)
        keep &= set(here)
        return not strays

    def _thaw(self) -> None:
        # The child is frozen by itself only after a split freeze; otherwise the group's thaw
        # thaws it (no write to it on every region's exit).
        groups = (self._child, self._freeze_dir) if self._split else (self._freeze_dir,)
        self._split = False
        self._awake = set()
        for group in groups:
            path, _, thawed = self._freeze_file(group)
            try:
                _write(path, thawed)
            except TenantsError:
                if os.path.exists(path):  # a group that is gone (destroyed) is thawed
                    raise

    def _pin(self, cpus: set[int]) -> None:
        if self._cpuset_dir is None:
            _pin_threads(self._pids(), cpus)
            return
        # The kernel moves every thread of every member, and future children, onto the set
        # (the freezer's child group, which enables no controller, included).
        _write(os.path.join(self._cpuset_dir, "cpuset.cpus"), format_cpu_list(cpus))

    def _destroy(self) -> None:
        self._thaw()
        deadline = time.monotonic() + _MOVE_TIMEOUT_S
        problems = []
        # The child first: a group with a child cannot be removed.
        for mount, group in [(self._groups[0][0], self._child), *self._groups]:
            delay = 0.0005
            while os.path.isdir(group):
                for pid in _procs(group):
                    # ESRCH and the like: the process is exiting, which empties the group too.
                    with contextlib.suppress(TenantsError):
                        _write(os.path.join(mount, "cgroup.procs"), str(pid))
                try:
                    os.rmdir(group)
                except FileNotFoundError:
                    break
                except OSError as e:
                    # EBUSY while members (or exiting ones) remain: move them again.
                    if time.monotonic() >= deadline:
                        problems.append(f"{group} ({e.strerror}; processes {_procs(group)})")
                        break
                    delay = _wait(deadline, delay)
            # The root directory goes with its last tenant; other tenants keep it busy.
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(group))
        if problems:
            raise TenantsError(f"Cannot remove the cgroup {'; '.join(problems)}.")


def _move(group: str, pid: int) -> None:
    """Move `pid` into the cgroup `group`; one that exited meanwhile is not an error."""
    try:
        _write(os.path.join(group, "cgroup.procs"), str(pid))
    except TenantsError:
        if _start_time(pid) is not None:
            raise


class _V2Group(_CgroupGroup):
    kind = FreezerKind.CGROUP_V2

    def __init__(self, root: str, tenant: int) -> None:
        super().__init__(root, tenant)
        if not _is_mount(V2_MOUNT, "cgroup2"):
            raise TenantsError(f"Cannot create a cgroup-v2 group: {V2_MOUNT} is not cgroup2.")
        top = os.path.join(V2_MOUNT, root)
        _mkdir(top)
        self.pin_fallback_reason = self._enable_cpuset(top)
        group = os.path.join(top, f"t{tenant}")
        _mkdir(group)
        self._groups = [(V2_MOUNT, group)]
        self._freeze_dir = group
        if os.path.exists(os.path.join(group, "cpuset.cpus")):
            self._cpuset_dir = group
        elif self.pin_fallback_reason is None:
            self.pin_fallback_reason = f"{group} has no cpuset.cpus"

    @staticmethod
    def _enable_cpuset(top: str) -> str | None:
        """Enable the cpuset controller for <root>'s children; why not, when it cannot."""
        offered = (_read(os.path.join(top, "cgroup.controllers")) or "").split()
        if "cpuset" not in offered:
            return f"the cpuset controller is not enabled for {top}"
        enabled = (_read(os.path.join(top, "cgroup.subtree_control")) or "").split()
        if "cpuset" in enabled:
            return None
        try:
            _write(os.path.join(top, "cgroup.subtree_control"), "+cpuset")
        except TenantsError as e:
            return str(e)
        return None

    def _freeze_file(self, group: str) -> tuple[str, str, str]:
        return os.path.join(group, "cgroup.freeze"), "1", "0"

    def _is_frozen(self, group: str) -> bool:
        events = _read(os.path.join(group, "cgroup.events")) or ""
        return "frozen 1" in events.splitlines()

    def _check_split(self) -> None:
        # A group that enables a controller for its children may hold no process itself.
        enabled = _read(os.path.join(self._freeze_dir, "cgroup.subtree_control"))
        if enabled:
            raise TenantsError(f"{self._freeze_dir} enables {enabled} for its children")


class _V1Group(_CgroupGroup):
    kind = FreezerKind.CGROUP_V1

    def __init__(self, root: str, tenant: int) -> None:
        super().__init__(root, tenant)
        if not _is_mount(V1_FREEZER, "cgroup", "freezer"):
            raise TenantsError(
                f"Cannot create a cgroup-v1 group: no freezer hierarchy is mounted at {V1_FREEZER}."
            )
        top = os.path.join(V1_FREEZER, root)
        _mkdir(top)
        group = os.path.join(top, f"t{tenant}")
        _mkdir(group)
        self._groups = [(V1_FREEZER, group)]
        self._freeze_dir = group
        self.pin_fallback_reason = self._make_cpuset(root, tenant)

    def _make_cpuset(self, root: str, tenant: int) -> str | None:
        """Join the cpuset hierarchy too when it is there; why not, when it cannot."""
        if not _is_mount(V1_CPUSET, "cgroup", "cpuset"):
            return f"no cgroup v1 cpuset hierarchy is mounted at {V1_CPUSET}"
        if not os.access(V1_CPUSET, os.W_OK):
            return f"{V1_CPUSET} is not writable"
        parent = V1_CPUSET
        group = parent
        try:
            for name in (root, f"t{tenant}"):
                group = os.path.join(parent, name)
                _mkdir(group)
                # A v1 cpuset starts with no CPUs and no memory nodes, and no task may join it
                # until both are set: inherit the parent's.
                for key in ("cpuset.cpus", "cpuset.mems"):
                    if not _read(os.path.join(group, key)):
                        _write(os.path.join(group, key), _read(os.path.join(parent, key)) or "")
                parent = group
        except TenantsError as e:
            with contextlib.suppress(OSError):
                os.rmdir(group)
            return str(e)
        self._groups.append((V1_CPUSET, group))
        self._cpuset_dir = group
        return None

    def _freeze_file(self, group: str) -> tuple[str, str, str]:
        return os.path.join(group, "freezer.state"), "FROZEN", "THAWED"

    def _is_frozen(self, group: str) -> bool:
        # FREEZING while some task has not stopped yet.
        return _read(os.path.join(group, "freezer.state")) == "FROZEN"


class _SignalGroup(TenantGroup):
    """No cgroup: the processes added and every descendant of them, stopped with SIGSTOP.

    Limits of signals: a process whose parent exits is reparented away from the tree and is
    only tracked if it was seen before; one forked by a process that exits between two scans of
    a freeze escapes it.
    """

    kind = FreezerKind.SIGNAL

    def __init__(self, root: str, tenant: int) -> None:
        super().__init__(root, tenant)
        self._known: dict[int, int] = {}  # pid -> start time: added ones and descendants seen
        self._stopped: dict[int, int] = {}  # pid -> start time: what thaw() must continue
        self._frozen = False

    def _scan(self) -> dict[int, int]:
        """The tenant's live processes (pid -> start time), checked against recycled pids."""
        children: dict[int, list[int]] = {}
        starts: dict[int, int] = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if not name.isdigit():
                continue
            st = _stat(f"/proc/{name}/stat")
            if st is None or st[0] in "ZX":
                continue
            pid = int(name)
            starts[pid] = st[2]
            children.setdefault(st[1], []).append(pid)
        live = {pid: t for pid, t in self._known.items() if starts.get(pid) == t}
        stack = list(live)
        me = os.getpid()
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in live and child != me:
                    live[child] = starts[child]
                    stack.append(child)
        self._known = live
        return live

    def _stop(self, procs: dict[int, int]) -> None:
        # Recorded before stopped, so that recover() can continue them after a crash.
        _state_edit(self.root, add=set(procs.items()), drop=set())
        self._stopped.update(procs)
        for pid in procs:
            # EPERM (another user's process): it stays running and freeze() times out.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)

    def _add(self, pid: int) -> None:
        start = _start_time(pid)
        if start is None:
            raise TenantsError(f"Process {pid} does not exist.")
        self._known[pid] = start
        if self._frozen:  # as with a cgroup: joining a frozen group freezes the newcomer
            self._stop({pid: start})

    def _remove(self, pid: int) -> None:
        self._known.pop(pid, None)

    def _pids(self) -> list[int]:
        return sorted(self._scan())

    def _freeze(self, deadline: float, awake: set[int]) -> bool:
        self._frozen = True
        all_stopped = False
        delay = 0.0002
        known = set(self._scan())
        keep = awake & known
        while True:
            tree = self._scan()
            keep = _forked_by(keep, tree, known) & tree.keys()
            self._awake = keep
            want = {p: t for p, t in tree.items() if p not in keep}
            new = {p: t for p, t in want.items() if self._stopped.get(p) != t}
            # Stopped processes cannot fork, so a scan made after all were seen stopped is the
            # whole tree, but for what the awake ones fork (awake too): nothing new in it
            # means done.
            if not new and all_stopped:
                return True
            if time.monotonic() >= deadline:
                return False
            if new:
                self._stop(new)
            all_stopped = all(_fully_stopped(p) for p in want)
            if not all_stopped:
                delay = _wait(deadline, delay, _FREEZE_POLL_S)

    def _thaw(self) -> None:
        self._frozen = False
        self._awake = set()
        if not self._stopped:
            return
        for pid, start in self._stopped.items():
            if _start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGCONT)
        # A line left behind only makes recover() continue a running process: harmless.
        with contextlib.suppress(OSError, TenantsError):
            _state_edit(self.root, add=set(), drop=set(self._stopped.items()))
        self._stopped.clear()

    def _pin(self, cpus: set[int]) -> None:
        _pin_threads(self._pids(), cpus)

    def _destroy(self) -> None:
        self._thaw()
        self._known.clear()


# --- after a crash -----------------------------------------------------------------------------


def _walk(top: str, topdown: bool) -> list[str]:
    if not os.path.isdir(top):
        return []
    return [d for d, _, _ in os.walk(top, topdown=topdown)]


def prune(root: str, keep: set[int]) -> int:
    """Remove the empty groups under `root` of tenants not in `keep` (those left by a
    predecessor whose tenants have finished since); returns how many went."""
    _check_root(root)
    removed = 0
    candidates = (
        (V2_MOUNT, "cgroup2", None),
        (V1_FREEZER, "cgroup", "freezer"),
        (V1_CPUSET, "cgroup", "cpuset"),
    )
    mounts = [m for m, kind, opt in candidates if _is_mount(m, kind, opt)]
    for mount in mounts:
        top = os.path.join(mount, root)
        with contextlib.suppress(OSError):
            for name in os.listdir(top):
                if name.startswith("t") and name[1:].isdigit() and int(name[1:]) not in keep:
                    with contextlib.suppress(OSError):  # EBUSY: still has processes
                        with contextlib.suppress(FileNotFoundError):
                            os.rmdir(os.path.join(top, name, SPLIT_NAME))
                        os.rmdir(os.path.join(top, name))
                        removed += 1
    return removed


def recover(root: str) -> int:
    """Undo what a crashed controller left under `root`; returns how many cgroups it thawed.

    Thaws every frozen cgroup under <root> (v2, and the v1 freezer hierarchy; a tenant's
    child group of a freeze that left some processes awake included), removes the empty
    ones, and sends SIGCONT to each process in the signal freezer's record whose start time
    still matches (a recycled pid is left alone), then deletes the record. Missing hierarchies
    or files are not errors.
    """
    _check_root(root)
    thawed = 0
    hierarchies: list[tuple[str, str, str, str]] = []  # mount, freeze file, frozen?, thaw text
    if _is_mount(V2_MOUNT, "cgroup2"):
        hierarchies.append((V2_MOUNT, "cgroup.freeze", "1", "0"))
    if _is_mount(V1_FREEZER, "cgroup", "freezer"):
        hierarchies.append((V1_FREEZER, "freezer.state", "FROZEN FREEZING", "THAWED"))
    for mount, name, frozen, thaw in hierarchies:
        # Top-down: a v1 child stays frozen while its parent is.
        for group in _walk(os.path.join(mount, root), topdown=True):
            path = os.path.join(group, name)
            state = _read(path)
            if state and state in frozen.split():
                with contextlib.suppress(TenantsError):
                    _write(path, thaw)
                    thawed += 1
    cpuset = [V1_CPUSET] if _is_mount(V1_CPUSET, "cgroup", "cpuset") else []
    for mount in [h[0] for h in hierarchies] + cpuset:
        for group in _walk(os.path.join(mount, root), topdown=False):
            with contextlib.suppress(OSError):  # EBUSY: its tenant still runs; leave it
                os.rmdir(group)

    try:
        entries = _parse_state(_state_path(root).read_text())
    except OSError:
        entries = set()
    for pid, start in entries:
        if _start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
    if entries:
        with contextlib.suppress(OSError, TenantsError):
            _state_edit(root, add=set(), drop=entries)
    return thawed
