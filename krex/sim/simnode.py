"""The simulated node as the controller sees it (shim/sim/krexsim.h): who uses a simulated
GPU, and who holds the simulated driver's shared locks. Nothing here runs on a real GPU."""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path
from typing import Any

from krex.core.paths import sim_library_dir
from krex.core.procs import tgid

# shim/sim/krexsim.h: where the simulated node publishes who holds its two locks.
HOLDER_OFFSETS = (32, 36)  # KREXSIM_MODEL_HOLDER_OFFSET, KREXSIM_CTX_HOLDER_OFFSET: pids
LOCK_OFFSETS = (40, 80)  # KREXSIM_MODEL_LOCK_OFFSET, KREXSIM_CTX_LOCK_OFFSET: robust mutexes
_HEAD = 128
_MAX_PIDS = 256

_lib: Any = None


def segment_name(krex_segment: str) -> str:
    """The simulated node's segment beside a daemon's gates segment."""
    return krex_segment + "-sim"


def _library() -> Any:
    """The simulated driver, for its krexsim_* hooks (loaded once); OSError when absent."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(sim_library_dir() / "libcuda.so.1"))
        pids = ctypes.POINTER(ctypes.c_int)
        lib.krexsim_users.argtypes = [ctypes.c_char_p, ctypes.c_uint, pids, ctypes.c_int]
        lib.krexsim_busy.argtypes = [
            ctypes.c_char_p,
            ctypes.c_uint,
            ctypes.c_longlong,
            pids,
            ctypes.c_int,
            pids,
        ]
        _lib = lib
    return _lib


def users(sim_shm: str, gpu: int) -> set[int] | None:
    """Processes holding streams on a simulated GPU, or creating a context there
    (krexsim_users); None when unknown; nobody, where the node has no segment yet."""
    try:
        pids = (ctypes.c_int * _MAX_PIDS)()
        n = int(_library().krexsim_users(sim_shm.encode(), gpu, pids, _MAX_PIDS))
    except OSError:
        return None
    if n < 0:
        return None if Path("/dev/shm", sim_shm.lstrip("/")).exists() else set()
    return set(pids[:n])


def busy(sim_shm: str, gpu: int, since: float | None) -> tuple[set[int], bool] | None:
    """What the simulated driver's own record (krexsim_busy; the tenants write it only through
    the driver API) says of a simulated GPU: the processes with work queued or running on it,
    and with `since` (time.monotonic(), CLOCK_MONOTONIC) also those whose work there completed
    at or after it; with whether the record lost someone who did (more processes than it keeps
    completed work since). None when unknown; nobody, where the node has no segment yet (no
    process has used a simulated GPU of it)."""
    since_ns = 0 if since is None else max(1, int(since * 1e9))
    try:
        pids = (ctypes.c_int * _MAX_PIDS)()
        lost = ctypes.c_int(0)
        n = int(
            _library().krexsim_busy(
                sim_shm.encode(), gpu, since_ns, pids, _MAX_PIDS, ctypes.byref(lost)
            )
        )
    except OSError:
        return None
    if n < 0:
        return None if Path("/dev/shm", sim_shm.lstrip("/")).exists() else (set(), False)
    return set(pids[:n]), bool(lost.value)


def ours(st: os.stat_result) -> bool:
    """Whether a simulated node's segment is this user's alone (shim/sim: sim_shm_ours)."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def lock_holders(sim_shm: str) -> set[int]:
    """Pids holding the simulated driver's shared locks (empty when none, or no segment)."""
    try:
        fd = os.open(Path("/dev/shm", sim_shm.lstrip("/")), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return set()
    with os.fdopen(fd, "rb") as f:
        if not ours(os.fstat(fd)):
            return set()  # another uid's: its pids are not our GPUs' (as shim/sim refuses it)
        head = f.read(_HEAD)
    if len(head) < _HEAD:
        return set()
    pids = {int.from_bytes(head[o : o + 4], "little") for o in HOLDER_OFFSETS}
    for o in LOCK_OFFSETS:
        tid = int.from_bytes(head[o : o + 4], "little") & 0x3FFFFFFF  # robust mutex: owner tid
        if tid and (pid := tgid(tid)) is not None:
            pids.add(pid)
    pids.discard(0)
    return pids


def mapped_by(sim_shm: str) -> set[int]:
    """Processes (other than this one) that have the simulated node's segment mapped: every
    process that has used a simulated GPU of the node, whether it holds streams or not."""
    where = f" /dev/shm/{sim_shm.lstrip('/')}"
    pids = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry.name}/maps") as f:
                    # A name that is gone shows with " (deleted)" after it: not this segment.
                    if any(line.rstrip("\n").endswith(where) for line in f):
                        pids.add(int(entry.name))
            except OSError:  # exited meanwhile, or another user's (who cannot map ours)
                continue
    return pids


def remove(sim_shm: str) -> bool:
    """At a clean stop: remove the simulated node's segment unless a process still maps it
    (it would go on with the old node while new processes made another). True when no
    segment is left under the name."""
    if mapped_by(sim_shm):
        return False
    path = Path("/dev/shm", sim_shm.lstrip("/"))
    try:
        if os.lstat(path).st_uid != os.geteuid():
            return False  # someone else's: not ours to remove (and sticky /dev/shm forbids it)
        path.unlink()
    except FileNotFoundError:
        pass
    except PermissionError:
        return False
    return True
