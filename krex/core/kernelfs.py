"""Reading the kernel's small text files (/proc, /sys, cgroup files)."""

from __future__ import annotations


def read(path: str) -> str | None:
    """The stripped text of a file, or None when it (or the thing it describes) is gone."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None
