"""Whom krex trusts, checked before use (docs/security.md, "Shared objects").

A per-user daemon's runtime directory, its socket's peer, the files a daemon asks a client to
preload and the environment it hands out are all things another local user could plant. Each
check here refuses with one clear error (`TrustError`) instead of using what it cannot vouch
for.
"""

from __future__ import annotations

import errno
import functools
import grp
import os
import pwd
import socket
import stat
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

from krex.core.errors import KrexError

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class TrustError(KrexError):
    """A shared object is not ours (or root's) to trust; the message says which and why."""


def trusted_uids() -> set[int]:
    """Who may own what we use: ourselves and root (a node's service daemon runs as root)."""
    return {os.geteuid(), 0}


def private_dir(path: Path) -> Path:
    """path as a directory only we can use: created 0700 when missing; refused when it is a
    symlink, not a directory, not ours, or open to group or others."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as e:
        raise TrustError(f"cannot create {path}: {e.strerror}") from e
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise TrustError(f"{path} is not a directory of its own (a symlink or a file)")
    if st.st_uid != os.geteuid():
        raise TrustError(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")
    if st.st_mode & 0o077:
        raise TrustError(f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):o})")
    return path


def runtime_dir() -> Path:
    """Where the per-user daemon keeps its socket, lock and log: $XDG_RUNTIME_DIR/krex, else
    /tmp/krex-<uid>; when that is not safe (someone else made it first), ~/.krex/run."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    first = Path(xdg) / "krex" if xdg else Path(f"/tmp/krex-{os.getuid()}")
    try:
        return private_dir(first)
    except TrustError as first_problem:
        try:
            return private_dir(Path.home() / ".krex" / "run")
        except TrustError as e:
            raise TrustError(f"no safe runtime directory: {first_problem}; {e}") from e


def open_beside(
    path: str | os.PathLike[str], flags: int, mode: int = 0o600, owners: set[int] | None = None
) -> int:
    """os.open of a file krex keeps beside a path someone chose (a socket's pid, lock, peaks
    and log files; a report's temporary file): never through a symlink (O_NOFOLLOW), and only
    a regular file of ours (`owners`: default ourselves) with no other name (a hard link to
    someone's file would pass the owner check). O_CREAT makes it with `mode`; with O_EXCL only
    a new one. TrustError says which and why; other failures are OSError."""
    truncate = flags & os.O_TRUNC  # only once it is known to be ours
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TrustError(f"{path} is a symlink: refusing to use it") from None
        raise
    st = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file"
    elif st.st_uid not in (owners if owners is not None else {os.geteuid()}):
        why = f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    elif st.st_nlink != 1:
        why = f"has {st.st_nlink} names (a hard link)"
    if why:
        os.close(fd)
        raise TrustError(f"{path} {why}: refusing to use it")
    if truncate:
        os.ftruncate(fd, 0)
    return fd


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return int(_PEERCRED.unpack(raw)[1])


def check_daemon(sock: socket.socket, where: Path) -> None:
    """Refuse a daemon that runs as someone else (neither us nor root)."""
    uid = peer_uid(sock)
    if uid not in trusted_uids():
        raise TrustError(
            f"the process listening at {where} runs as uid {uid}, not as you (uid "
            f"{os.geteuid()}) or root: not a krex daemon of yours, refusing it"
        )


def trusted_file(path: str) -> bool:
    """Whether path is a regular file that only we or root can change (it and every directory
    above it owned by us or root, none writable by group or others unless sticky)."""
    return _trusted(path, stat.S_ISREG)


def _trusted(path: str, kind: Callable[[int], bool]) -> bool:
    """path is absolute, of `kind`, ours or root's and not writable by others; and so is every
    directory above it, except that sticky ones (/tmp) may be: nobody can replace what is
    ours in them."""
    p = Path(path)
    if not p.is_absolute():
        return False
    try:
        st = os.stat(p)
    except OSError:
        return False
    if not kind(st.st_mode) or not safe_stat(st):
        return False
    for parent in p.resolve().parents:
        try:
            pst = os.stat(parent)
        except OSError:
            return False
        if not safe_stat(pst) and not pst.st_mode & stat.S_ISVTX:
            return False
    return True


def safe_stat(st: os.stat_result) -> bool:
    """Owned by us or root, writable by nobody else: not by others, and by its group only when
    that group is ours alone (a user private group, as umask 002 systems give everyone)."""
    if st.st_uid not in trusted_uids() or st.st_mode & 0o002:
        return False
    return not st.st_mode & 0o020 or _private_group(st.st_gid)


@functools.cache
def _private_group(gid: int) -> bool:
    """Whether nobody but us is in group gid (as a member or by primary group)."""
    me = os.geteuid()
    try:
        members = grp.getgrgid(gid).gr_mem
        name = pwd.getpwuid(me).pw_name
        if any(m != name for m in members):
            return False
        return all(u.pw_uid == me for u in pwd.getpwall() if u.pw_gid == gid)
    except (KeyError, OSError):
        return False


# What a daemon may set in a tenant's environment (docs/protocol.md, `admit`), and how each
# value is checked: a library to preload must be a file only we or root can change.
_PLAIN = {
    "KREX_SOCKET",
    "KREX_TENANT",
    "KREX_GPU",
    "KREX_SHM",
    "KREX_SLOTS",
    "KREX_MEM_WAIT_S",
    "KREX_PACE_US",
    "KREX_SIM_SHM",
    "KREX_SIM_GPUS",
    "KREX_SIM_MEM_BYTES",
    "KREX_AUTO_REGIONS",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
}
_FILES = {"LD_PRELOAD", "LD_AUDIT"}  # each entry a trusted file
_DIRS = {"LD_LIBRARY_PATH", "PYTHONPATH"}  # each entry a directory only we or root can change


def check_env(env: Mapping[str, str], where: Path) -> dict[str, str]:
    """The daemon's `env` for a tenant, if every variable is one a krex daemon sets and every
    library or directory it names is one only we or root can change; else TrustError."""
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TrustError(f"the daemon at {where} sent an environment that is not strings")
        if key in _FILES:
            bad = [v for v in value.split(":") if v and not trusted_file(v)]
        elif key in _DIRS:
            bad = [v for v in value.split(os.pathsep) if v and not _trusted_dir(v)]
        elif key in _PLAIN:
            bad = []
        else:
            raise TrustError(f"the daemon at {where} sent {key}, which no krex daemon sets")
        if bad:
            raise TrustError(
                f"the daemon at {where} asked for {key}={bad[0]}, which someone other than "
                "you or root can change: refusing it"
            )
        out[key] = value
    return out


def _trusted_dir(path: str) -> bool:
    return _trusted(path, stat.S_ISDIR)


def bind_private(path: Path) -> socket.socket:
    """A unix socket bound at path, created 0600 (under a umask, not chmod after the bind: a
    chmod by name would follow a link swapped in for the socket in a shared directory)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    return sock
