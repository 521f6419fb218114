"""NVIDIA MPS for off-region concurrency (`[mps] enabled`): a control daemon of krex's own,
with its pipe and log directories beside the krex socket."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

from krex.core.config import ConfigError

log = logging.getLogger("krex.daemon")

_CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"  # the process that runs every client's work on the GPU


class Mps:
    """One MPS control daemon; `env()` is what a tenant needs to reach it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def start(cls, directory: Path) -> Mps:
        control = shutil.which(_CONTROL)
        if not control:
            raise ConfigError(f"mps.enabled is set but {_CONTROL} is not on PATH")
        mps = cls(directory)
        for d in (directory, directory / "pipe", directory / "log"):
            d.mkdir(parents=True, exist_ok=True)
            st = os.lstat(d)  # beside the socket: ours, not a link someone planted there
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise ConfigError(
                    f"mps: {d} is not a directory of ours (a symlink, or uid "
                    f"{st.st_uid}'s): refusing to use it"
                )
        subprocess.run([control, "-d"], env=dict(os.environ, **mps.env()), check=True, timeout=30)
        log.info("started MPS (pipe directory %s)", directory / "pipe")
        return mps

    def env(self) -> dict[str, str]:
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.directory / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(self.directory / "log"),
        }

    def owns(self, pid: int) -> bool:
        """Whether pid is this daemon's MPS server: the server's binary, run by our user, with
        our pipe directory in its environment or its parent's (the control daemon we started).
        NVML lists it as the GPU's user and its samples show it working for every client; the
        clients, not it, are gated, drained and frozen, so it is not a foreign process."""
        proc = Path("/proc", str(pid))
        try:
            if os.path.basename(os.readlink(proc / "exe")) != SERVER:
                return False
            if proc.stat().st_uid != os.geteuid():
                return False
            ours = f"CUDA_MPS_PIPE_DIRECTORY={self.directory / 'pipe'}".encode()
            if ours in (proc / "environ").read_bytes().split(b"\0"):
                return True
            parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            return ours in Path("/proc", parent, "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            return False

    def stop(self) -> None:
        control = shutil.which(_CONTROL)
        if not control:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [control], input="quit\n", text=True, timeout=30, env=dict(os.environ, **self.env())
            )
