"""CPU slices: physical cores, the GPU's NUMA node, the default split and config validation.

Most tests run on a fake sysfs (the module's two sysfs readers are monkeypatched); one runs on
this machine's real topology.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable

import pytest

from krex.core import slices
from krex.core.slices import (
    Slice,
    SliceError,
    default_slices,
    format_cpu_list,
    gpu_numa_node,
    parse_cpu_list,
    physical_cores,
    validate_slices,
)

FakeFs = Callable[..., None]  # install(files, keep_nvml=False)


@pytest.fixture
def fake_sysfs(monkeypatch: pytest.MonkeyPatch) -> FakeFs:
    """Install a fake sysfs: `files` maps paths to contents; directories are derived from them.

    Unless `keep_nvml`, NVML is made absent so that the sysfs path is the one under test, even
    where pynvml is installed and a GPU is present.
    """

    def install(files: dict[str, str], keep_nvml: bool = False) -> None:
        def read(path: str) -> str | None:
            return files.get(path)

        def listdir(path: str) -> list[str]:
            prefix = path.rstrip("/") + "/"
            return sorted({p[len(prefix) :].split("/")[0] for p in files if p.startswith(prefix)})

        monkeypatch.setattr(slices, "_read", read)
        monkeypatch.setattr(slices, "_listdir", listdir)
        if not keep_nvml:
            monkeypatch.setattr(slices, "_nvml_bus_id", lambda gpu: None)

    return install


def smt_topology(n_cores: int, smt: int = 2) -> dict[str, str]:
    """Sibling lists of a machine numbered like Linux does: core c has CPUs c, c+n, c+2n..."""
    files = {}
    for core in range(n_cores):
        sibs = ",".join(str(core + k * n_cores) for k in range(smt))
        for k in range(smt):
            files[f"{slices.SYS_CPU}/cpu{core + k * n_cores}/topology/thread_siblings_list"] = sibs
    return files


def nodes(*cpulists: str) -> dict[str, str]:
    return {f"{slices.SYS_NODE}/node{i}/cpulist": cl for i, cl in enumerate(cpulists)}


def pci(bus: str, vendor: str, cls: str, node: int) -> dict[str, str]:
    base = f"{slices.SYS_PCI}/{bus}"
    return {f"{base}/vendor": vendor, f"{base}/class": cls, f"{base}/numa_node": str(node)}


def test_cpu_list_round_trip() -> None:
    """The kernel's CPU-list syntax parses and formats both ways; junk is a SliceError."""
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("") == set()
    assert format_cpu_list({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert format_cpu_list([]) == ""
    for bad in ("a", "3-1", "1-", "-2"):
        with pytest.raises(SliceError):
            parse_cpu_list(bad)


def test_physical_cores_groups_smt_siblings(fake_sysfs: FakeFs) -> None:
    """Hyperthreads of one core form one group; groups are ordered by their lowest CPU."""
    fake_sysfs(smt_topology(4))
    assert physical_cores(set(range(8))) == [{0, 4}, {1, 5}, {2, 6}, {3, 7}]


def test_physical_cores_only_given_cpus_and_missing_topology(fake_sysfs: FakeFs) -> None:
    """Siblings outside the given CPUs are left out; a CPU without topology is its own core."""
    files = smt_topology(2)  # CPUs 0-3, core 0 = {0, 2}, core 1 = {1, 3}
    fake_sysfs(files)
    assert physical_cores({0, 1, 3}) == [{0}, {1, 3}]
    assert physical_cores({0, 9}) == [{0}, {9}]  # cpu9 has no topology file


def test_gpu_numa_node_from_sysfs(fake_sysfs: FakeFs) -> None:
    """Without NVML, GPUs are NVIDIA display/3D devices in bus order; -1 or no GPU is None."""
    fake_sysfs(
        {
            **pci("0000:00:03.0", "0x8086", "0x020000", 0),  # a NIC
            **pci("0000:3b:00.0", "0x10de", "0x030200", 1),
            **pci("0000:1a:00.0", "0x10de", "0x030200", 0),
            **pci("0000:1a:00.1", "0x10de", "0x040300", 0),  # the GPU's audio function
            **pci("0000:5e:00.0", "0x10de", "0x030000", -1),  # a VGA one, node unknown
        }
    )
    assert [gpu_numa_node(g) for g in range(4)] == [0, 1, None, None]
    assert gpu_numa_node(-1) is None


def test_gpu_numa_node_asks_nvml_for_the_bus_id(
    fake_sysfs: FakeFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With pynvml importable, the GPU's PCI address comes from NVML (32-bit domain, upper case)."""
    fake_sysfs(
        {
            **pci("0000:1a:00.0", "0x10de", "0x030200", 0),
            **pci("0000:3b:00.0", "0x10de", "0x030200", 1),
        },
        keep_nvml=True,
    )
    calls: list[str] = []
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    # NVML's index 0 is the device on bus 3b here: the opposite of bus order.
    fake.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    fake.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        busId=[b"00000000:3B:00.0", b"00000000:1A:00.0"][h]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_numa_node(0) == 1
    assert gpu_numa_node(1) == 0
    assert calls == ["init", "shutdown", "init", "shutdown"]


def test_default_slices_even_split_without_numa(fake_sysfs: FakeFs) -> None:
    """16 cores, 2 GPUs: 8 disjoint cores each; 8 cores reserve a quarter (2) for regions."""
    fake_sysfs({})
    out = default_slices(2, set(range(16)))
    assert out == [
        Slice(0, frozenset({0, 1}), frozenset(range(2, 8))),
        Slice(1, frozenset({8, 9}), frozenset(range(10, 16))),
    ]
    validate_slices(out, set(range(16)))


def test_default_slices_small_slices_reserve_one_core(fake_sysfs: FakeFs) -> None:
    """Fewer than 8 cores: the region is the first core; an uneven split differs by one core."""
    fake_sysfs({})
    out = default_slices(2, {0, 1, 2, 3, 4})
    assert out == [
        Slice(0, frozenset({0}), frozenset({1, 2})),
        Slice(1, frozenset({3}), frozenset({4})),
    ]


def test_default_slices_region_is_a_whole_physical_core(fake_sysfs: FakeFs) -> None:
    """With SMT the region takes both hyperthreads of its core, so none runs shared work."""
    fake_sysfs(smt_topology(4))
    (only,) = default_slices(1, set(range(8)))
    assert only.region_cores == {0, 4}
    assert only.shared_cores == {1, 2, 3, 5, 6, 7}


def test_default_slices_single_core_slice_has_nothing_to_reserve(fake_sysfs: FakeFs) -> None:
    """One core per slice: region and shared cores are that same core."""
    fake_sysfs({})
    assert default_slices(2, {0, 1}) == [
        Slice(0, frozenset({0}), frozenset({0})),
        Slice(1, frozenset({1}), frozenset({1})),
    ]


def test_default_slices_prefers_the_gpus_numa_node(fake_sysfs: FakeFs) -> None:
    """GPU 0 sits on node 1 and GPU 1 on node 0: each gets its own node's cores."""
    fake_sysfs(
        {
            **nodes("0-3", "4-7"),
            **pci("0000:1a:00.0", "0x10de", "0x030200", 1),
            **pci("0000:3b:00.0", "0x10de", "0x030200", 0),
        }
    )
    out = default_slices(2, set(range(8)))
    assert out[0].region_cores | out[0].shared_cores == {4, 5, 6, 7}
    assert out[1].region_cores | out[1].shared_cores == {0, 1, 2, 3}
    assert out[0].region_cores == {4}


def test_default_slices_more_gpus_than_cores_overlap(fake_sysfs: FakeFs) -> None:
    """3 GPUs on 2 cores share cores, spread evenly; only allow_overlap accepts that."""
    fake_sysfs({})
    out = default_slices(3, {0, 1})
    assert [sorted(s.region_cores) for s in out] == [[0], [1], [0]]
    assert all(s.region_cores == s.shared_cores for s in out)
    with pytest.raises(SliceError, match="GPUs 0 and 2"):
        validate_slices(out, {0, 1})
    validate_slices(out, {0, 1}, allow_overlap=True)


def test_default_slices_refuses_nothing_to_split(fake_sysfs: FakeFs) -> None:
    """No GPU or no CPU is a SliceError, not an empty or division-by-zero result."""
    fake_sysfs({})
    with pytest.raises(SliceError, match="0 GPUs"):
        default_slices(0, {0})
    with pytest.raises(SliceError, match="no CPUs"):
        default_slices(1, set())


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            [Slice(0, frozenset({0}), frozenset({1})), Slice(0, frozenset({2}), frozenset())],
            "GPU 0 appears twice",
        ),
        ([Slice(1, frozenset({0}), frozenset({7, 8}))], r"GPU 1's cores 7-8 are not available"),
        (
            [Slice(0, frozenset({0, 1}), frozenset()), Slice(1, frozenset({1}), frozenset({2}))],
            "GPUs 0 and 1 both have region cores 1",
        ),
        ([Slice(2, frozenset(), frozenset())], "GPU 2 has neither region nor shared cores"),
        ([Slice(-1, frozenset({0}), frozenset())], "GPU -1"),
    ],
)
def test_validate_slices_refuses(bad: list[Slice], message: str) -> None:
    """Each unusable configuration is refused with a sentence naming the GPU and the cores."""
    with pytest.raises(SliceError, match=message):
        validate_slices(bad, set(range(4)))


def test_validate_slices_accepts_shared_cores_across_gpus() -> None:
    """GPUs may share their shared cores, and a region core may also be a shared core."""
    validate_slices(
        [
            Slice(0, frozenset({0}), frozenset({0, 2, 3})),
            Slice(1, frozenset({1}), frozenset({2, 3})),
            Slice(2, frozenset(), frozenset({3})),
        ],
        set(range(4)),
    )


def test_default_slices_on_this_machine() -> None:
    """This machine, one GPU: the slice covers exactly our CPUs, its region is one whole core."""
    avail = set(os.sched_getaffinity(0))
    (only,) = default_slices(1)
    assert only.gpu == 0
    assert only.region_cores | only.shared_cores == avail
    validate_slices([only], avail)
    cores = physical_cores(avail)
    n_region = max(1, len(cores) // 4) if len(cores) >= 8 else 1
    assert only.region_cores == set().union(*cores[:n_region])
    if len(cores) > 1:
        assert not only.region_cores & only.shared_cores
    else:
        assert only.region_cores == only.shared_cores
