"""Look-ups of processes by pid, through psutil: whether one runs, when it started, its
parent, the process a thread belongs to, this process's ancestors and children. A process that
is gone is an answer (False, None, nothing), never an error.
"""

from __future__ import annotations

import os

import psutil

from krex.core.kernelfs import read as _read

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def running(pid: int) -> bool:
    """Whether process `pid` exists in our pid namespace and is not a zombie (a zombie has no
    GPU context any more)."""
    if pid <= 0:
        return False
    try:
        return bool(psutil.Process(pid).status() not in _GONE)
    except psutil.Error:
        return False


def start_time(pid: int) -> float | None:
    """When process `pid` started (tells a reused pid apart); None when there is none."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def parent(pid: int) -> int | None:
    """The parent of process `pid` (0 for one whose parent is outside our pid namespace);
    None when there is no such process."""
    if pid <= 0:
        return None
    try:
        return int(psutil.Process(pid).ppid())
    except psutil.Error:
        return None


def tgid(tid: int) -> int | None:
    """The process that thread `tid` belongs to; None when there is no such thread."""
    # psutil has no thread-to-process look-up (psutil.Process(tid) answers for the thread
    # itself, with pid == tid): the kernel says it in /proc/<tid>/status.
    if tid <= 0:
        return None
    for line in (_read(f"/proc/{tid}/status") or "").splitlines():
        if line.startswith("Tgid:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def self_and_ancestors() -> set[int]:
    """This process and its ancestors (up to the first that is gone, or outside our pid
    namespace)."""
    out = {os.getpid()}
    proc: psutil.Process | None = psutil.Process()
    while proc is not None:
        try:
            proc = proc.parent()  # checks the parent is older than the child: pid reuse
        except psutil.Error:
            break
        if proc is None or proc.pid in out:
            break
        out.add(proc.pid)
    return out


def children() -> list[int]:
    """The pids of this process's children (zombies included: not reaped yet)."""
    try:
        return [p.pid for p in psutil.Process().children()]
    except psutil.Error:
        return []
