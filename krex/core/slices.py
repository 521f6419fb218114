"""CPU slices: which cores each GPU's tenants share, and which ones its region owner measures on.

A slice gives one GPU's commands their `shared_cores`; a command that enters a region is moved
onto the slice's `region_cores`, which the GPU's other commands never use while it measures
(they are frozen). Region cores are whole physical cores (all SMT siblings), so no sibling
hyperthread steals cycles from the measurement.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

from krex.core.errors import KrexError
from krex.core.kernelfs import read as _read

SYS_CPU = "/sys/devices/system/cpu"
MAX_CPU = 8191  # a CPU list's highest (the kernel's NR_CPUS is at most 8192)
SYS_NODE = "/sys/devices/system/node"
SYS_PCI = "/sys/bus/pci/devices"
_NVIDIA_VENDOR = "0x10de"
# PCI classes of a 3D controller (0x0302, data-centre GPUs) and a VGA controller (0x0300).
_GPU_CLASSES = ("0x0302", "0x0300")


@dataclass(frozen=True)
class Slice:
    """One GPU's CPU slice: cores reserved for its region owner, and cores its tenants share."""

    gpu: int
    region_cores: frozenset[int]
    shared_cores: frozenset[int]


class SliceError(KrexError, ValueError):
    """A CPU slice that cannot be used; the message is one sentence naming the GPU and cores."""


def _listdir(path: str) -> list[str]:
    """The names in a sysfs directory (empty when it is missing)."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def parse_cpu_list(text: str) -> set[int]:
    """Parse a kernel CPU list such as ``0-3,8,10-11`` (empty text is the empty set)."""
    cpus: set[int] = set()
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise SliceError(f"{text!r} is not a CPU list such as 0-3,8.") from None
        if first < 0 or last < first:
            raise SliceError(f"{text!r} is not a CPU list such as 0-3,8.")
        if last > MAX_CPU:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise SliceError(f"{shown!r} names CPU {last}: CPUs are 0..{MAX_CPU}.")
        cpus.update(range(first, last + 1))
    return cpus


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Format CPUs the way the kernel does (``0-3,8``); the empty set is the empty string."""
    out: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [cpu]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def physical_cores(cpus: set[int]) -> list[set[int]]:
    """Group logical CPUs into physical cores (SMT siblings together), ordered by lowest CPU.

    Only CPUs in `cpus` appear. A CPU whose topology cannot be read is a core of its own.
    """
    cores: list[set[int]] = []
    seen: set[int] = set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        text = _read(f"{SYS_CPU}/cpu{cpu}/topology/thread_siblings_list")
        try:
            siblings = parse_cpu_list(text) if text else set()
        except SliceError:
            siblings = set()
        core = ((siblings & cpus) - seen) | {cpu}
        seen |= core
        cores.append(core)
    return cores


def _cpu_nodes() -> dict[int, int]:
    """Logical CPU -> NUMA node, from sysfs (empty when the machine reports no nodes)."""
    nodes: dict[int, int] = {}
    for name in _listdir(SYS_NODE):
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        text = _read(f"{SYS_NODE}/{name}/cpulist")
        try:
            cpus = parse_cpu_list(text) if text else set()
        except SliceError:
            continue
        for cpu in cpus:
            nodes[cpu] = int(name[4:])
    return nodes


def _pci_numa_node(bus_id: str) -> int | None:
    text = _read(f"{SYS_PCI}/{bus_id}/numa_node")
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    # The kernel says -1 when the platform does not tell (single-node machines, most VMs).
    return node if node >= 0 else None


def _nvml_bus_id(gpu: int) -> str | None:
    """The sysfs PCI address of GPU `gpu` according to NVML, or None without NVML or GPU."""
    try:
        # Optional dependency (nvidia-ml-py); imported by name so that it stays optional.
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError: no driver, no GPU
        return None
    try:
        raw = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(gpu)).busId
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        # NVML says 00000000:3B:00.0 (32-bit domain); sysfs says 0000:3b:00.0.
        domain, bus, devfn = text.lower().split(":")
        return f"{int(domain, 16):04x}:{bus}:{devfn}"
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _sysfs_nvidia_gpus() -> list[str]:
    """PCI addresses of NVIDIA GPUs in bus order (the order NVML numbers them by default)."""
    found: list[str] = []
    for dev in _listdir(SYS_PCI):
        if _read(f"{SYS_PCI}/{dev}/vendor") != _NVIDIA_VENDOR:
            continue
        cls = _read(f"{SYS_PCI}/{dev}/class") or ""
        if cls.startswith(_GPU_CLASSES):
            found.append(dev)
    return sorted(found)


def gpu_numa_node(gpu: int) -> int | None:
    """The NUMA node GPU `gpu` is attached to, or None when unknown.

    Asks NVML (nvidia-ml-py, when installed and a GPU is there) for the GPU's PCI address, else
    numbers NVIDIA GPUs in PCI bus order from sysfs; the node is that device's numa_node.
    """
    if gpu < 0:
        return None
    bus_id = _nvml_bus_id(gpu)
    if bus_id is None:
        gpus = _sysfs_nvidia_gpus()
        if gpu >= len(gpus):
            return None
        bus_id = gpus[gpu]
    return _pci_numa_node(bus_id)


def _split(cores: list[set[int]]) -> tuple[frozenset[int], frozenset[int]]:
    """Region and shared CPUs of one slice's physical cores (in core order)."""
    if len(cores) == 1:
        only = frozenset(cores[0])
        return only, only
    n_region = max(1, len(cores) // 4) if len(cores) >= 8 else 1
    region = frozenset().union(*cores[:n_region])
    shared = frozenset().union(*cores[n_region:])
    return region, shared


def default_slices(n_gpus: int, cpus: set[int] | None = None) -> list[Slice]:
    """Split the CPUs (default: this process's affinity) into one slice per GPU.

    Physical cores are dealt out evenly and disjointly, each GPU taking cores of its own NUMA
    node first when that is known. In a slice, the region cores are its first physical core (about
    a quarter of its cores, at least one, when it has 8 or more) and the rest are shared.
    A slice of a single core has nothing to reserve: its region and shared sets are that core.
    With more GPUs than physical cores, GPUs share cores (one core each, spread as evenly as
    possible), so slices overlap; this is allowed for the default only (see `validate_slices`).
    """
    if n_gpus < 1:
        raise SliceError(f"Cannot make CPU slices for {n_gpus} GPUs; at least 1 is needed.")
    avail = set(os.sched_getaffinity(0)) if cpus is None else set(cpus)
    if not avail:
        raise SliceError("Cannot make CPU slices: no CPUs are available.")
    cores = physical_cores(avail)
    cpu_node = _cpu_nodes()
    core_node = [cpu_node.get(min(core)) for core in cores]
    gpu_node = [gpu_numa_node(g) for g in range(n_gpus)]

    if n_gpus > len(cores):
        use = [0] * len(cores)
        out: list[Slice] = []
        for g in range(n_gpus):
            near = [
                i
                for i, node in enumerate(core_node)
                if gpu_node[g] is not None and node == gpu_node[g]
            ]
            pick = min(near or range(len(cores)), key=lambda i: (use[i], i))
            use[pick] += 1
            region, shared = _split([cores[pick]])
            out.append(Slice(g, region, shared))
        return out

    base, extra = divmod(len(cores), n_gpus)
    size = [base + (1 if g < extra else 0) for g in range(n_gpus)]
    free = list(range(len(cores)))
    taken: list[list[int]] = [[] for _ in range(n_gpus)]
    # First each GPU takes cores on its own node, then the rest fill up from what is left.
    for g in range(n_gpus):
        if gpu_node[g] is None:
            continue
        for i in [i for i in free if core_node[i] == gpu_node[g]][: size[g]]:
            taken[g].append(i)
            free.remove(i)
    for g in range(n_gpus):
        while len(taken[g]) < size[g]:
            taken[g].append(free.pop(0))
    slices = []
    for g in range(n_gpus):
        region, shared = _split([cores[i] for i in sorted(taken[g])])
        slices.append(Slice(g, region, shared))
    return slices


def validate_slices(
    slices: list[Slice], available: set[int], *, allow_overlap: bool = False
) -> None:
    """Raise SliceError (one sentence naming the GPU and cores) when the slices cannot be used.

    Refused: a GPU listed twice or negative, a core outside `available`, a GPU with neither
    region nor shared cores, and region cores shared by two GPUs (unless `allow_overlap`, which
    is meant only for `default_slices` on a machine with more GPUs than physical cores).
    """
    seen: dict[int, Slice] = {}
    for s in slices:
        if s.gpu < 0:
            raise SliceError(f"GPU {s.gpu} in the CPU slices is not a GPU index (0 or more).")
        if s.gpu in seen:
            raise SliceError(f"GPU {s.gpu} appears twice in the CPU slices.")
        seen[s.gpu] = s
        if not s.region_cores and not s.shared_cores:
            raise SliceError(f"GPU {s.gpu} has neither region nor shared cores.")
        missing = (s.region_cores | s.shared_cores) - available
        if missing:
            raise SliceError(
                f"GPU {s.gpu}'s cores {format_cpu_list(missing)} are not available "
                f"(available: {format_cpu_list(available) or 'none'})."
            )
    if allow_overlap:
        return
    ordered = sorted(seen.values(), key=lambda s: s.gpu)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            both = a.region_cores & b.region_cores
            if both:
                raise SliceError(
                    f"GPUs {a.gpu} and {b.gpu} both have region cores {format_cpu_list(both)}; "
                    "region cores cannot be shared."
                )
