"""The torch and triton releases whose internals auto-regions were read from, what they cover
on each (docs/user-guide.md, "Releases"), and the one warning a process gets per library when
something is not in regions on the release it has.

torch (torch/_inductor/runtime/benchmarking.py and codegen/multi_kernel.py of each release):
2.11 has no `set_gpu_benchmark_lock_context`, so its benchmarkers' `benchmark_gpu` are wrapped
(INDUCTOR_FALLBACK); 2.12 has no hook and its benchmarkers are not wrapped (not read for it);
2.13 and 2.14 enter the hook's context in every `benchmark_gpu` (re-entrant: one benchmark
delegates to another); 2.15 also enters it once around multi-kernel's comparison of its
sub-kernels (`MultiKernelCall.benchmark_sub_kernels`). A torch with the hook is covered through
it whatever its release. triton (triton/runtime/autotuner.py and jit.py of 3.6 to 3.9):
`Autotuner._bench`, its `do_bench` property and `JITFunction.run(..., warmup=True)` alike.
"""

from __future__ import annotations

import sys
import threading

from krex.tenant import cudnn

INDUCTOR_HOOK = "set_gpu_benchmark_lock_context"
TORCH_READ = ("2.11.", "2.12.", "2.13.", "2.14.", "2.15.")
INDUCTOR_FALLBACK_TORCH = ("2.11.",)  # benchmark_gpu wrapped where there is no hook
TORCH_HOOKED = ("2.13.", "2.14.", "2.15.")  # the hook, as read
TRITON_READ = ("3.6.", "3.7.", "3.8.", "3.9.")
_lock = threading.Lock()
_warned: set[str] = set()  # the libraries this process has warned about


def version(library: str) -> str:
    """The imported `library`'s __version__ ("" when unknown)."""
    return str(getattr(sys.modules.get(library), "__version__", "") or "")


def named(releases: tuple[str, ...]) -> str:
    """("2.11.", "2.13.") -> "2.11, 2.13"."""
    return ", ".join(v.rstrip(".") for v in releases)


def torch_gaps(has_hook: bool | None) -> list[str]:
    """What is not in regions on the imported torch (`has_hook`: whether its benchmarking module
    has the lock hook; None: not imported yet, taken from the releases read)."""
    release = version("torch")
    if has_hook is None:
        has_hook = release.startswith(TORCH_HOOKED) or not release.startswith(TORCH_READ)
    gaps = []
    if not has_hook and not release.startswith(INDUCTOR_FALLBACK_TORCH):
        gaps.append(
            f"Inductor's GPU benchmarks are in no region (it has no {INDUCTOR_HOOK}, and "
            f"its benchmarkers are wrapped on torch {named(INDUCTOR_FALLBACK_TORCH)} only)"
        )
    if not release.startswith(cudnn.INDUCTOR_TORCH):
        gaps.append(
            "cuDNN's searches in torch.compile'd convolutions are in no region (Inductor's "
            f"extern kernels were read from torch {named(cudnn.INDUCTOR_TORCH)})"
        )
    return gaps


def triton_gaps() -> list[str]:
    """What is not covered on the imported triton, as it is on the releases read."""
    if version("triton").startswith(TRITON_READ):
        return []
    return [
        "Triton's autotuner compiles each configuration inside its timing's region (the "
        "siblings wait that long)",
        "its timings are not candidates', and a do_bench given to it is in no region unless "
        "it is a timer named in KREX_AUTO_REGIONS",
    ]


def warn_once(library: str, gaps: list[str], read: tuple[str, ...]) -> None:
    """One `krex:` line per process and library saying `gaps`; none when there are none."""
    if not gaps:
        return
    with _lock:
        if library in _warned:
            return
        _warned.add(library)
    release = version(library) or "(unknown)"
    unread = "" if release.startswith(read) else f" (auto-regions were read from {named(read)})"
    print(
        f"krex: auto-regions: on {library} {release}{unread}: " + "; ".join(gaps),
        file=sys.stderr,
    )
