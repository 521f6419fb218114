"""Segments a stopped daemon had to leave, removed by the last user (docs/security.md).

A daemon that stops while commands run cannot remove their segments' names: new processes of
those commands attach by name (the shim: KREX_SHM and KREX_SLOTS; the simulated driver:
KREX_SIM_SHM), and a simulated GPU's processes must all share one node (docs/simulator.md). So the
names stay until the commands end, and the `krex run` whose command ends last (nobody maps a
segment any more) removes them, unless a daemon answers at the socket again: a successor has
taken them over and removes them itself. A `krex run` killed before it could is covered by the
next daemon on the socket, which adopts or removes what its predecessor left
(krex/daemon/segments.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from krex.client.watch import answers
from krex.core.liveness import daemon_holds
from krex.sim.simnode import mapped_by


def reclaim(env: Mapping[str, str]) -> list[str]:
    """After a command whose daemon went away: remove the segments named in its environment
    (the daemon's `env` at admission) that no process maps any more; the names removed."""
    sock = env.get("KREX_SOCKET")
    if not sock or answers(Path(sock)):
        return []
    removed = []
    for key in ("KREX_SLOTS", "KREX_SIM_SHM", "KREX_SHM"):
        name = env.get(key, "").lstrip("/")
        if name and "/" not in name and name.startswith("krex") and _remove(name, key):
            removed.append("/" + name)
    return removed


def _remove(name: str, key: str) -> bool:
    path = Path("/dev/shm", name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return False
        if key == "KREX_SHM" and daemon_holds(fd):
            return False
        if mapped_by("/" + name):
            return False
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()
                return True
        return False
    finally:
        os.close(fd)
