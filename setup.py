"""Build glue over setuptools (metadata lives in pyproject.toml).

Besides the cffi module krex._native (cffi_modules), build_ext compiles the plain shared
libraries of shim/ into the package:

    krex/_lib/libkrex.so            the preload library: shim/layout.c, shim/proc.c, shim/log.c,
                                    shim/preload/*
    krex/_lib/sim/libcuda.so.1      the simulated CUDA driver: shim/sim/*.c, shim/log.c
    krex/_lib/sim/libamdhip64.so    the simulated HIP runtime: shim/sim_hip/*.c, linked against
                                    the simulated libcuda.so.1 beside it (so built after it), and
                                    without -Bsymbolic: its internal calls to its own exported
                                    names go through the PLT, as in ROCm (shim/sim_hip/hipsim.h)
    krex/_lib/libkrex-hip.so        the HIP wrappers (krex_hip_<name>, no hip* export) with the
                                    same gate and markers: shim/hip/hip_*.c and the shared parts
    krex/_lib/libkrex-hip-audit.so  the LD_AUDIT module routing HIP bindings to them (docs/hip.md)

`pip install .` puts them into the wheel; `pip install -e .` into the source tree's krex/_lib/.
The compiler is $CC (default cc). No library links Python: they load into any process.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from glob import glob

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

ROOT = os.path.dirname(os.path.abspath(__file__))

CFLAGS = ["-std=gnu11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-Werror"]
CFLAGS += ["-fvisibility=hidden", "-pthread", "-Ishim"]
LDLIBS = ["-ldl", "-lrt", "-lpthread"]
SHARED = ["shim/layout.c", "shim/proc.c"]  # also compiled into krex._native
LOG = "shim/log.c"  # the log writer of the preload, HIP and simulated-driver libraries

# output (relative to the package), source globs, version script, soname, extra link flags
LIBRARIES = [
    (
        "_lib/libkrex.so",
        [*SHARED, LOG, "shim/preload/*.c", "shim/preload/*.S"],
        "shim/preload/exports.map",
        "libkrex.so",
        [],
    ),
    (
        "_lib/sim/libcuda.so.1",
        [LOG, "shim/sim/*.c"],
        "shim/sim/simcuda.map",
        "libcuda.so.1",
        ["-Wl,-Bsymbolic-functions"],
    ),
    (
        "_lib/sim/libamdhip64.so",
        ["shim/sim_hip/*.c"],
        "shim/sim_hip/hipsim.map",
        "libamdhip64.so",
        [
            "-L{outdir}",  # where libcuda.so.1 was just built (source tree or build/lib*)
            "-Wl,--push-state,--no-as-needed",  # it comes before the objects that need it
            "-l:libcuda.so.1",
            "-Wl,--pop-state",
            "-Wl,-rpath,$ORIGIN",
        ],
    ),
    (
        "_lib/libkrex-hip.so",
        [
            *SHARED,
            LOG,
            "shim/preload/gate.c",
            "shim/preload/log.c",
            "shim/preload/region.c",
            "shim/preload/drain_thread.c",
            "shim/hip/hip_*.c",
        ],
        "shim/hip/exports.map",
        "libkrex-hip.so",
        [],
    ),
    (
        "_lib/libkrex-hip-audit.so",
        ["shim/hip/audit.c"],
        "shim/hip/audit.map",
        "libkrex-hip-audit.so",
        [],
    ),
]


def _sources(patterns: list[str]) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        matches = sorted(glob(pattern, root_dir=ROOT))
        if not matches:
            raise CompileError(f"krex: no source matches {pattern} (in {ROOT})")
        found += matches
    return found


class BuildExt(build_ext):
    """build_ext that also compiles libkrex.so and the simulated libcuda.so.1."""

    def run(self) -> None:
        super().run()  # the cffi module
        for out, patterns, version_script, soname, extra in LIBRARIES:
            out_path = os.path.join(self._package_dir(), out)
            self._link(out_path, patterns, version_script, soname, extra)

    def _package_dir(self) -> str:
        if self.inplace:  # pip install -e . / build_ext --inplace: into the source tree
            build_py = self.get_finalized_command("build_py")
            return os.path.join(ROOT, build_py.get_package_dir("krex"))
        return os.path.join(self.build_lib, "krex")

    def _link(self, out: str, patterns: list[str], script: str, soname: str, extra: list[str]):
        if not os.path.isfile(os.path.join(ROOT, script)):
            raise CompileError(f"krex: version script {script} is missing")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cc = shlex.split(os.environ.get("CC", "cc"))
        ldflags = [
            "-shared",
            f"-Wl,--version-script={script}",
            f"-Wl,-soname,{soname}",
            "-Wl,-z,defs",
        ]
        extra = [x.replace("{outdir}", os.path.dirname(out)) for x in extra]
        cmd = [*cc, *CFLAGS, *ldflags, *extra, "-o", out, *_sources(patterns), *LDLIBS]
        print(" ".join(shlex.quote(c) for c in cmd), flush=True)
        try:
            status = subprocess.run(cmd, cwd=ROOT).returncode
        except OSError as exc:
            raise CompileError(f"krex: cannot run the C compiler {cc[0]!r} ($CC): {exc}") from exc
        if status != 0:
            raise CompileError(f"krex: building {soname} failed: {cc[0]} exited with {status}")

    def get_outputs(self) -> list[str]:
        outputs: list[str] = super().get_outputs()
        return outputs + [os.path.join(self._package_dir(), out) for out, *_ in LIBRARIES]


setup(
    cffi_modules=["krex/_native_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
)
