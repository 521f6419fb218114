"""A differential harness (issue #48, "a warm command is the command"): a probe program run three
ways, natively (`python probe.py`, no krex), cold (`krex run --no-pool -- python probe.py`) and
warm (`krex run -- python probe.py`, forked by a fork server: docs/pool.md), with the same
caller each time: environment, cwd, stdin, descriptors, resource limits, umask, nice, signal
dispositions and mask, and a session of its own (`start_new_session`, so that a probe that
signals its own process group natively reaches nobody else). What each run observed (its exit
status, its output, the one JSON value it prints) is reduced by the probe's view and compared.

Independent of pytest and of the simulated GPU: `run_probe` and `run_catalogue` take how to
start krex and the daemon's socket (`Krex`), so the same catalogue runs against a real GPU's
daemon (tests/test_warm_native.py's `main`, or pytest with KREX_PROBE_SOCKET set).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("native", "cold", "warm")
PYTHON = "{python}"  # in a probe's argv: the interpreter the warm workers run
_PR_SET_NO_NEW_PRIVS = 38

# Variables krex sets for every command by design (docs/protocol.md, krex/daemon/daemon.py's
# tenant_env): compared after filtering, on every side. Library paths are compared with krex's
# own entries taken out (the caller's entries must arrive, in order).
KREX_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
)
KREX_PREFIX = "KREX_"
KREX_PATH_LISTS = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT")


def krex_library_dirs() -> list[str]:
    """Where krex's own libraries live (the shim, the simulated driver): entries of a library
    path under these are krex's, not the caller's."""
    spec = importlib.util.find_spec("krex")
    if spec is None or spec.origin is None:
        return []
    return [os.path.join(os.path.dirname(spec.origin), "_lib")]


def filter_env(env: Mapping[str, str], lib_dirs: Sequence[str]) -> dict[str, str]:
    """An environment without what krex adds by design (see KREX_VARIABLES)."""
    out = {}
    for k, v in env.items():
        if k.startswith(KREX_PREFIX) or k in KREX_VARIABLES:
            continue
        if k in KREX_PATH_LISTS:
            parts = [p for p in re.split(r"[: ]", v) if p]
            mine = [p for p in parts if not any(p.startswith(d) for d in lib_dirs)]
            if not mine:
                continue
            v = ":".join(mine)
        out[k] = v
    return out


@dataclass(frozen=True)
class Caller:
    """What the caller of a run sets up, the same for all three ways (what `krex run` is
    given, natively what python is given)."""

    env: Mapping[str, str | None] = field(default_factory=dict)  # over the base (None: unset)
    clear_env: bool = False  # start from an empty environment, not the base (`env -i`)
    rlimits: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    umask: int | None = None
    nice: int = 0
    sched_batch: bool = False  # SCHED_BATCH, as `chrt -b 0`
    ignore: tuple[int, ...] = ()  # signals set to SIG_IGN (as nohup and `cmd &` do)
    block: tuple[int, ...] = ()  # signals blocked in the mask
    groups: tuple[int, ...] | None = None  # supplementary groups (root only; else left)
    oom_score_adj: int | None = None
    no_new_privs: bool = False
    stdin: bytes | None = None  # piped to the command (None: /dev/null)
    close_stdin: bool = False  # started with fd 0 closed
    stdout: str = "pipe"  # pipe, pty (a terminal), devfull (/dev/full), broken (no reader)
    merge_stderr: bool = False  # stderr to the same pipe as stdout (2>&1)
    pass_fd: int | None = None  # a pipe's read end arrives at this fd (pass_fds)
    pass_data: bytes = b"through fd\n"  # what that pipe holds (its writer closed)

    def apply(self, pipe_r: int | None) -> None:
        """In the caller's forked child, before its exec (subprocess's preexec_fn)."""
        for which, limits in self.rlimits.items():
            resource.setrlimit(which, limits)
        if self.umask is not None:
            os.umask(self.umask)
        if self.nice:
            os.nice(self.nice)
        if self.sched_batch:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        for s in self.ignore:
            signal.signal(s, signal.SIG_IGN)
        if self.block:
            signal.pthread_sigmask(signal.SIG_BLOCK, set(self.block))
        if self.groups is not None and os.geteuid() == 0:
            os.setgroups(list(self.groups))
        if self.oom_score_adj is not None:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(self.oom_score_adj))
        if self.no_new_privs:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if self.pass_fd is not None and pipe_r is not None:
            os.dup2(pipe_r, self.pass_fd)  # inheritable; the original is closed by close_fds
        if self.close_stdin:
            os.close(0)


@dataclass
class Outcome:
    """One run of a probe: how it ended and what it printed."""

    mode: str
    status: int | str  # the exit status as a shell sees it (128+N: signal N), or "timeout"
    out: str  # stdout (CRLF from a terminal made LF; undecodable bytes escaped)
    err: str
    report: dict[str, Any] | None  # krex run's --report (cold and warm)
    wall_s: float
    dir: Path  # the probe's directory (its cwd)
    python: str
    ended: float = 0.0  # time.monotonic() when the run was over
    preload: tuple[str, ...] = ()  # the warm workers' preloaded modules
    teardown_s: float | None = None  # the daemon's bound on a warm command's leftovers
    seen: Any = None  # the probe's view of this run, taken as soon as it was over

    @property
    def value(self) -> Any:
        """The JSON value of the last line of stdout (None when it is not JSON)."""
        for line in reversed(self.out.splitlines()):
            if line.strip():
                try:
                    return json.loads(line)
                except ValueError:
                    return None
        return None

    def norm(self, text: str) -> str:
        """Text with the run's own paths and addresses made comparable."""
        for path, name in (
            (str(self.dir.resolve()), "<dir>"),
            (str(self.dir), "<dir>"),
            (self.python, "<python>"),
            (sys.prefix, "<prefix>"),
        ):
            text = text.replace(path, name)
        return re.sub(r"0x[0-9a-fA-F]+", "0x?", text)

    def err_lines(self) -> list[str]:
        return [line for line in self.norm(self.err).splitlines() if line.strip()]


View = Callable[[Outcome], Any]


def status_and_value(o: Outcome) -> Any:
    """The default view: the exit status and the printed value."""
    return {"status": o.status, "value": o.value}


@dataclass(frozen=True)
class Probe:
    """A probe program and how it is run and judged."""

    name: str
    doc: str  # what it observes, one line
    code: str  # the program (probe.py in its own directory)
    files: Mapping[str, str] = field(default_factory=dict)  # more files there (path -> text)
    argv: tuple[str, ...] = (PYTHON, "probe.py")  # the command (PYTHON: the interpreter)
    caller: Caller = field(default_factory=Caller)
    view: View = status_and_value
    expect: Mapping[str, Any] | None = None  # per mode, what its view must be (else: equal)
    needs: frozenset[str] = frozenset()  # torch, gpu, teardown (a daemon's short bound)
    signal_when_ready: int | None = None  # sent by the caller once the probe printed a line
    expect_pool: str = "warm"  # what the warm run must be ("cold": krex must fall back)
    # Natively under a stand-in parent that forwards signals and exits with the command's
    # status, as `krex run` does (for a probe that signals its parent: natively the caller).
    native_parent: bool = False
    timeout_s: float = 60.0


class HarnessError(AssertionError):
    """The harness could not run a probe as asked (not a difference the probe found)."""


class Difference(AssertionError):
    """The probe's runs observed different things."""


def krex_command(python: str = sys.executable) -> list[str]:
    """krex as a user starts it: the console script beside the interpreter (`python -m
    krex.cli` would put the cwd first on krex run's own sys.path, where a probe's json.py is)."""
    script = Path(python).parent / "krex"
    return [str(script)] if script.exists() else [python, "-m", "krex.cli"]


@dataclass
class Krex:
    """How to reach krex: the command that starts it (`krex` or `python -m krex.cli`), the
    daemon's socket, whether the GPU is the simulated one, and the interpreter the daemon's
    warm workers run (the probes' interpreter). `before_warm` waits until a warm worker is
    ready (a probe may have killed one)."""

    command: Sequence[str]
    socket: Path
    sim: bool
    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=lambda: base_env(os.environ))
    before_warm: Callable[[], object] | None = None
    preload: tuple[str, ...] = ()  # the daemon's [pool] preload
    teardown_s: float | None = None  # its bound on a warm command's leftovers (None: unknown)
    # The daemon's counts of warm and cold runs (its status): how a run went that left no
    # report (krex run killed).
    counts: Callable[[], tuple[int, int]] | None = None

    def run_argv(self, mode: str, report: Path) -> list[str]:
        return [
            *self.command,
            "run",
            *(["--sim"] if self.sim else []),
            "--socket",
            str(self.socket),
            "--report",
            str(report),
            *(["--no-pool"] if mode == "cold" else []),
            "--",
        ]


# Variables of the harness's own environment that probes run without: the emulated start-up
# variables (so that a worker started with them shows through) and krex's own.
_UNSET_FOR_PROBES = ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED")


def base_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment every probe starts from: the harness's, without krex's variables and
    without the variables the warm workers emulate per command."""
    return {
        k: v
        for k, v in env.items()
        if not k.startswith(KREX_PREFIX) and k not in _UNSET_FOR_PROBES and k != "LD_PRELOAD"
    }


def prepare(probe: Probe, root: Path) -> Path:
    """The probe's directory under root: probe.py and its files."""
    d = root / probe.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "probe.py").write_text(textwrap.dedent(probe.code).lstrip("\n"))
    for rel, text in probe.files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    return d


class _Reader(threading.Thread):
    """Reads a stream to its end; `first_line` is set at its first newline."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.data = bytearray()
        self.first_line = threading.Event()

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: a terminal's last writer closed it
                chunk = b""
            if not chunk:
                break
            self.data += chunk
            if b"\n" in self.data:
                self.first_line.set()
        self.first_line.set()
        os.close(self.fd)

    def text(self) -> str:
        return bytes(self.data).replace(b"\r\n", b"\n").decode("utf-8", "backslashreplace")


# A parent that forwards the signals krex run forwards and exits with the command's status.
STAND_IN_PARENT = """
import signal, subprocess, sys
p = subprocess.Popen(sys.argv[1:])
def forward(n, _frame):
    try:
        p.send_signal(n)
    except ProcessLookupError:
        pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
          signal.SIGUSR2):
    signal.signal(s, forward)
rc = p.wait()
sys.exit(128 - rc if rc < 0 else rc)
"""


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_probe(probe: Probe, mode: str, krex: Krex, d: Path) -> Outcome:
    """Run `probe` (prepared in d) one way; HarnessError when krex did not run it as asked."""
    c = probe.caller
    argv = [krex.python if a == PYTHON else a for a in probe.argv]
    report = d.parent / f".{probe.name}.{mode}.report.json"
    with contextlib.suppress(FileNotFoundError):
        report.unlink()
    if mode != "native":
        argv = [*krex.run_argv(mode, report), *argv]
    elif probe.native_parent:
        argv = [krex.python, "-c", STAND_IN_PARENT, *argv]
    if mode == "warm" and krex.before_warm is not None:
        krex.before_warm()
    env = {} if c.clear_env else dict(krex.env)
    for k, v in c.env.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v.replace("{dir}", str(d))
    opened: list[int] = []  # ours, closed once the command has them
    pipe_r = None
    if c.pass_fd is not None:
        pipe_r, pipe_w = os.pipe()
        os.write(pipe_w, c.pass_data)
        os.close(pipe_w)
        opened.append(pipe_r)
    out_r: int | None = None
    if c.stdout == "pty":
        out_r, out_w = os.openpty()
    elif c.stdout == "devfull":
        out_w = os.open("/dev/full", os.O_WRONLY)
    else:
        out_r, out_w = os.pipe()
        if c.stdout == "broken":
            os.close(out_r)
            out_r = None
    opened.append(out_w)
    err_r, err_w = os.pipe()
    opened.append(err_w)
    stderr = out_w if c.merge_stderr else err_w
    stdin: int = subprocess.DEVNULL
    in_w = None
    if c.stdin is not None:
        in_r, in_w = os.pipe()
        opened.append(in_r)
        stdin = in_r
    counted = krex.counts() if krex.counts is not None and mode != "native" else None
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=d,
            env=env,
            stdin=stdin,
            stdout=out_w,
            stderr=stderr,
            start_new_session=True,
            pass_fds=(c.pass_fd,) if c.pass_fd is not None else (),
            preexec_fn=lambda: c.apply(pipe_r),
        )
    finally:
        for fd in opened:
            os.close(fd)
    readers = [_Reader(fd) for fd in (out_r, err_r) if fd is not None]
    for r in readers:
        r.start()
    if in_w is not None:
        assert c.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            os.write(in_w, c.stdin)
        os.close(in_w)
    status: int | str
    try:
        if probe.signal_when_ready is not None and out_r is not None:
            if not readers[0].first_line.wait(probe.timeout_s):
                raise subprocess.TimeoutExpired(argv, probe.timeout_s)
            proc.send_signal(probe.signal_when_ready)
        status = _status(proc.wait(timeout=max(0.1, probe.timeout_s - (time.monotonic() - t0))))
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        # What the run left in its session (natively the probe's, under krex krex run's).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for r in readers:
        r.join(timeout=10)
    wall = time.monotonic() - t0
    rep: dict[str, Any] | None = None
    if mode != "native" and report.exists():
        with contextlib.suppress(ValueError):
            rep = json.loads(report.read_text())
    if mode != "native" and rep is None and counted is not None and krex.counts is not None:
        # No report (krex run was killed): a lease counts a warm run at once, a cold run is
        # counted when krex run says it finished.
        rep = {"pool": "warm" if krex.counts()[0] > counted[0] else "cold", "from": "counts"}
    o = Outcome(
        mode=mode,
        status=status,
        out=readers[0].text() if out_r is not None else "",
        err=readers[-1].text(),
        report=rep,
        wall_s=wall,
        dir=d,
        python=krex.python,
        ended=time.monotonic(),
        preload=tuple(krex.preload),
        teardown_s=krex.teardown_s,
    )
    _check_pool(probe, o, _expected_pool(probe, mode, env, krex.env))
    # At once: a view may look at what the run left (processes, files) before the next run.
    o.seen = probe.view(o)
    return o


def _expected_pool(probe: Probe, mode: str, env: Mapping[str, str], base: Mapping[str, str]) -> str:
    """How krex should run it: cold cold, warm as the probe expects, except that a command
    started from an empty environment (`env -i`) on a machine whose environment, and so the warm
    workers', sets a start-up variable (OPENBLAS_CORETYPE on some CI machines: docs/pool.md) runs
    cold by design, the variable being read before the worker could change it."""
    if mode == "cold":
        return "cold"
    if probe.caller.clear_env and probe.expect_pool == "warm":
        from krex.pool.plan import preinit

        if any(preinit(k) and base[k] != env.get(k) for k in base):
            return "cold"
    return probe.expect_pool


def _check_pool(probe: Probe, o: Outcome, want: str) -> None:
    """The run went the way it was meant to (`want`: _expected_pool), as krex run's report
    says."""
    if o.mode == "native":
        return
    got = (o.report or {}).get("pool")
    if got != want:
        raise HarnessError(
            f"probe {probe.name}: the {o.mode} run was not {want} (report's pool: {got!r}, "
            f"reason: {(o.report or {}).get('pool_reason')!r}; status {o.status}; "
            f"stderr: {o.err[-1500:]!r})"
        )


def unmet(probe: Probe, krex: Krex, have: Mapping[str, bool] | None = None) -> str | None:
    """Why the probe cannot run here (None: it can)."""
    have = dict(have or {})
    for need in sorted(probe.needs, key=lambda n: (n != "torch", n)):
        if need == "torch" and not have.get("torch", _importable(krex.python, "torch")):
            return "torch is not installed for the probes' interpreter"
        if need == "gpu" and not have.get("gpu", not krex.sim and Path("/dev/nvidia0").exists()):
            return "needs a real NVIDIA GPU and its daemon (KREX_PROBE_SOCKET, KREX_PROBE_SIM=0)"
        if need == "teardown" and not have.get("teardown", krex.teardown_s is not None):
            return "the daemon's teardown bound is not known (KREX_PROBE_TEARDOWN_S)"
        if need not in ("torch", "gpu", "teardown") and not have.get(need, False):
            return f"needs {need}"
    return None


_importable_cache: dict[tuple[str, str], bool] = {}


def _importable(python: str, module: str) -> bool:
    key = (python, module)
    if key not in _importable_cache:
        p = subprocess.run(
            [
                python,
                "-c",
                f"import importlib.util as u; print(u.find_spec({module!r}) is not None)",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        _importable_cache[key] = p.stdout.strip() == "True"
    return _importable_cache[key]


def run_three(probe: Probe, krex: Krex, root: Path) -> dict[str, Outcome]:
    """The probe natively, cold and warm, one after the other, in one directory."""
    d = prepare(probe, root)
    return {mode: run_probe(probe, mode, krex, d) for mode in MODES}


def views(outcomes: Mapping[str, Outcome]) -> dict[str, Any]:
    """What each run observed, as the probe's view took it."""
    return {mode: o.seen for mode, o in outcomes.items()}


def compare(probe: Probe, seen: Mapping[str, Any], scope: str = "all") -> None:
    """Difference unless the views agree: per mode with the probe's `expect`; else all three
    (scope "all"), cold and warm (scope "krex", natively differing by design) or none (scope
    "none": recorded only)."""
    if probe.expect is not None:
        wrong = [m for m in seen if seen[m] != probe.expect.get(m)]
        if wrong:
            raise Difference(_describe(probe, seen, MODES, expected=probe.expect))
        return
    modes = {"all": MODES, "krex": ("cold", "warm"), "none": ()}[scope]
    first = [m for m in modes if m in seen][:1]
    wrong = [m for m in modes if m in seen and first and seen[m] != seen[first[0]]]
    if wrong:
        raise Difference(_describe(probe, seen, list(modes), expected=None))


def _describe(
    probe: Probe, seen: Mapping[str, Any], modes: Sequence[str], expected: Mapping[str, Any] | None
) -> str:
    """The runs' views side by side: where they are dicts, only their differing keys (against
    each other, or against what was expected)."""
    lines = [f"probe {probe.name} ({probe.doc}): the runs differ"]
    values = [seen[m] for m in modes if m in seen]
    if expected is not None:
        values += [expected.get(m) for m in modes]
    keys: list[str] = []
    if values and all(isinstance(v, dict) for v in values):
        every = sorted({k for v in values for k in v})
        keys = [k for k in every if len({json.dumps(v.get(k), sort_keys=True) for v in values}) > 1]
    for m in MODES:
        if m not in seen:
            continue
        v = seen[m]
        shown = {k: v.get(k) for k in keys} if keys and isinstance(v, dict) else v
        want = ""
        if expected is not None:
            e = expected.get(m)
            e = {k: e.get(k) for k in keys} if keys and isinstance(e, dict) else e
            want = f" (expected {e!r})"
        lines.append(f"  {m:6}: {shown!r}{want}")
    if keys:
        lines.append(f"  differing: {', '.join(keys)}")
    return "\n".join(lines)


@dataclass
class Result:
    probe: str
    skipped: str | None = None
    views: dict[str, Any] = field(default_factory=dict)
    difference: str | None = None
    error: str | None = None
    wall_s: float = 0.0


def run_catalogue(
    probes: Sequence[Probe],
    krex: Krex,
    root: Path,
    scopes: Mapping[str, str] | None = None,
    have: Mapping[str, bool] | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Every probe three ways against krex's daemon; what each observed and how they compare
    (`scopes`: the probe's comparison where it is not all three, see `compare`); `on_result`
    is told each as it is known (a run cut short keeps what it had)."""
    results: list[Result] = []
    for probe in probes:
        t0 = time.monotonic()
        why = unmet(probe, krex, have)
        if why is not None:
            results.append(Result(probe.name, skipped=why))
            if on_result is not None:
                on_result(results[-1])
            continue
        res = Result(probe.name)
        try:
            seen = views(run_three(probe, krex, root))
            res.views = seen
            compare(probe, seen, (scopes or {}).get(probe.name, "all"))
        except Difference as e:
            res.difference = str(e)
        except Exception as e:
            res.error = f"{type(e).__name__}: {e}"
        res.wall_s = time.monotonic() - t0
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results


def wait_gone(pids: Sequence[int], within_s: float) -> list[int]:
    """The pids still alive after within_s (polled)."""
    deadline = time.monotonic() + within_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _alive(p)]
    return [p for p in alive if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_all(pids: Sequence[int]) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def wait_for_file(path: Path, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        select.select([], [], [], 0.05)
    return True
