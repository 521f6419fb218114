"""Which build of krex this is (docs/security.md): `krex run`, the shim it preloads and the daemon
must be one build, or a command silently runs under the rules of another checkout or version.

A build is the version and a hash over what runs: the package's Python sources and its native
parts (krex._native, which compiles the segment layout, and krex/_lib: the preload shim and the
simulated drivers). Read once per process, when first asked (a few milliseconds): a daemon
knows the build it started as, a checkout rebuilt since is another build. The client sends its
identity with `admit`; the daemon refuses another build with one error and answers with its
own, which the client checks too (a daemon older than this check sends none). The shim a
command preloads is the daemon's (its `env`), so one build id covers all three: a shim rebuilt
on disk after the daemon started makes the client's build differ, and the client is refused
before it execs anything.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

from krex.core.paths import package_dir
from krex.core.version import __version__


@functools.cache
def build_id() -> str:
    """12 hex digits: the version, and every Python source and native library of the package."""
    root = package_dir()
    digest = hashlib.sha256(f"krex {__version__}\0".encode())
    files = sorted(
        p
        for p in root.rglob("*")
        if "__pycache__" not in p.parts and (p.suffix == ".py" or ".so" in p.name) and p.is_file()
    )
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def identity() -> dict[str, str]:
    """This build as the protocol carries it (`admit`'s and `hello`'s `build`)."""
    return {"version": __version__, "build": build_id(), "path": str(package_dir())}


def describe(ident: Mapping[str, Any]) -> str:
    return (
        f"krex {ident.get('version', '?')} (build {ident.get('build', '?')}, "
        f"{ident.get('path', '?')})"
    )


def mismatch(client: Mapping[str, Any], daemon: Mapping[str, Any], sock: object) -> str | None:
    """The one error for a client and a daemon of two builds; None when they are one."""
    if client.get("build") == daemon.get("build"):
        return None
    return (
        f"{describe(client)} found a daemon of another build, {describe(daemon)}, at {sock}: "
        f"stop it with `krex daemon stop --socket {sock}` (its running commands carry on) and "
        "run again, or use that build's krex; a daemon of this build's own on another "
        "--socket (or KREX_SOCKET) does not coordinate with that one on a real GPU"
    )


def older(reply: Mapping[str, Any]) -> dict[str, str]:
    """The identity of a daemon that sent none (older than this check)."""
    return {
        "version": str(reply.get("version", "older")),
        "build": "unknown: older than build checks",
        "path": "?",
    }
