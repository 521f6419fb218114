"""Which commands a warm pool worker can run, and how (shared by the client and the worker).

A warm worker is a fork server: a Python interpreter that has already imported the configured
modules (torch, triton) and touched no GPU. A child it forks can run `python [-u] [-B] [-W arg]
script.py ...`, `python -m module ...` and `python -c code ...` as `__main__`, exactly when the
command would have started the same interpreter with the same start-up state. `plan()` says
whether that holds, and if not, why: the command then runs cold, as its own process.
"""

from __future__ import annotations

import ctypes
import locale
import os
import resource
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Environment variables read when the interpreter, the CUDA driver or a framework start: a
# worker started long before the command cannot honour a value that differs from its own.
_PREINIT_PREFIXES = (
    "CUDA_",
    "PYTORCH_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "TRITON_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "NCCL_",
    "CUBLAS",
    "CUDNN_",
    "NVIDIA_",
    "PYTHON",
    "LD_",
)
# ... except these: ours (krex sets them per tenant), read lazily at use, or emulated per command.
_NOT_PREINIT = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "LD_PRELOAD",  # krex's shim: the worker has it; the command's own entries are checked
        "TRITON_CACHE_DIR",  # triton reads it at each compile
        "TRITON_HOME",
        "TORCHINDUCTOR_CACHE_DIR",  # inductor reads it at each use
        "TORCH_HOME",
        "TORCH_EXTENSIONS_DIR",
        "PYTHONPATH",  # emulated: its entries go first on the command's sys.path
        "PYTHONUNBUFFERED",  # emulated: the command's stdio buffering
        "PYTHONDONTWRITEBYTECODE",  # emulated: sys.dont_write_bytecode
        "PYTHONBREAKPOINT",  # read at each breakpoint()
        "PYTHONSTARTUP",  # interactive sessions only
    }
)
# Interpreter options a worker emulates per command; any other runs cold.
_FLAGS = {"-u": "unbuffered", "-B": "dont_write_bytecode"}


def preinit(name: str) -> bool:
    """Whether environment variable `name` must take effect before the interpreter, CUDA or a
    framework start (so a warm worker cannot honour a new value)."""
    return (
        name.startswith(_PREINIT_PREFIXES)
        and name not in _NOT_PREINIT
        and not name.startswith("KREX_")
    )


@dataclass
class Invocation:
    """A Python command line taken apart: what the worker runs and how."""

    kind: str  # "script", "module" or "code"
    target: str  # the script's path, the module's name, or the code
    args: list[str]  # sys.argv[1:]
    unbuffered: bool = False
    dont_write_bytecode: bool = False
    warnings: list[str] = field(default_factory=list)  # -W options, in order

    def argv0(self) -> str:
        """sys.argv[0] as CPython sets it."""
        return {"script": self.target, "module": "-m", "code": "-c"}[self.kind]


@dataclass
class Plan:
    """warm: run in a worker (invocation set); else cold, with the reason."""

    warm: bool
    reason: str
    invocation: Invocation | None = None


def _same_interpreter(path: str, worker_python: str) -> bool:
    """The same binary and the same environment (a venv's python is a link to its base)."""

    def identity(p: str) -> tuple[str, str | None]:
        bindir = os.path.dirname(os.path.abspath(p))
        cfg = os.path.join(os.path.dirname(bindir), "pyvenv.cfg")
        return os.path.realpath(p), (os.path.dirname(bindir) if os.path.isfile(cfg) else None)

    return identity(path) == identity(worker_python)


def parse_python(args: Sequence[str]) -> Invocation | str:
    """Parse a Python command line after the interpreter; a reason string when it cannot run
    warm."""
    flags: dict[str, bool] = {}
    warnings: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "-c"):
            if i + 1 >= len(args):
                return f"{a} without an argument"
            kind = "module" if a == "-m" else "code"
            return Invocation(kind, args[i + 1], list(args[i + 2 :]), warnings=warnings, **flags)
        if a == "-W" or (a.startswith("-W") and len(a) > 2):
            if a == "-W":
                if i + 1 >= len(args):
                    return "-W without an argument"
                warnings.append(args[i + 1])
                i += 2
            else:
                warnings.append(a[2:])
                i += 1
            continue
        if a.startswith("-") and a != "-":
            if a == "--":
                i += 1
                break
            # Combined single-letter flags (-uB) are taken apart.
            letters = [f"-{c}" for c in a[1:]] if not a.startswith("--") else [a]
            for flag in letters:
                if flag not in _FLAGS:
                    return f"interpreter option {flag} is not emulated in a warm worker"
                flags[_FLAGS[flag]] = True
            i += 1
            continue
        break
    if i >= len(args) or args[i] == "-":
        return "an interactive or stdin program"
    return Invocation("script", args[i], list(args[i + 1 :]), warnings=warnings, **flags)


def startup_locale() -> dict[str, object]:
    """What this interpreter made of its locale at start-up (LC_ALL, LC_CTYPE, LANG): its
    UTF-8 mode, the locale's encoding and name, which decide its streams' encoding and error
    handler. A warm worker's children have the worker's."""
    return {
        "utf8_mode": sys.flags.utf8_mode,
        "encoding": locale.getpreferredencoding(False),
        "ctype": locale.setlocale(locale.LC_CTYPE),
    }


def plan(
    argv: Sequence[str],
    env: Mapping[str, str],
    worker_python: str | None,
    worker_env: Mapping[str, str],
    *,
    no_pool: bool = False,
    worker_locale: Mapping[str, object] | None = None,
) -> Plan:
    """Whether `argv`, run with environment `env`, can run in a warm worker whose interpreter is
    `worker_python` and whose environment at start was `worker_env`."""
    if no_pool:
        return Plan(False, "--no-pool")
    if worker_python is None:
        return Plan(False, "no pool on this GPU")
    exe = shutil.which(argv[0], path=env.get("PATH")) if argv else None
    if exe is None:
        return Plan(False, "not a Python command")
    base = os.path.basename(exe)
    if not base.startswith("python"):
        return Plan(False, "not a Python command")
    if not _same_interpreter(exe, worker_python):
        return Plan(False, f"another interpreter ({exe}; warm workers run {worker_python})")
    inv = parse_python(argv[1:])
    if isinstance(inv, str):
        return Plan(False, inv)
    for name in sorted(set(env) | set(worker_env)):
        if preinit(name) and env.get(name) != worker_env.get(name):
            theirs = "unset" if name not in worker_env else f"{name}={worker_env[name]!r}"
            mine = f"{name}={env[name]!r}" if name in env else f"{name} unset"
            return Plan(
                False,
                f"{mine} must take effect before CUDA or the interpreter start "
                f"(warm workers have {theirs})",
            )
    here = startup_locale()  # krex run started with the command's locale variables
    if worker_locale is not None and dict(worker_locale) != here:
        return Plan(
            False,
            f"the locale ({here}) is read at the interpreter's start (warm workers have "
            f"{dict(worker_locale)})",
        )
    own_preload = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if own_preload:
        return Plan(False, "LD_PRELOAD of the command's own")
    return Plan(True, "warm worker", inv)


# The caller's process state a cold command inherits from `krex run` (fork and exec keep it),
# which a warm child must take on (docs/pool.md): what a program or its harness can observe or
# rely on besides argv, environment, cwd and stdio.
_RLIMITS = tuple(
    name
    for name in (
        "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE",
        "RLIMIT_RSS", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS",
        "RLIMIT_LOCKS", "RLIMIT_SIGPENDING", "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_RTPRIO",
        "RLIMIT_RTTIME",
    )
    if hasattr(resource, name)
)  # fmt: skip
MAX_PASSED_FDS = 64  # descriptors beyond stdio a warm command can be handed (else: cold)
_SCHED_UNPRIVILEGED = {os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE}


@dataclass
class ProcState:
    """What a process passes on to its children besides argv, environment, cwd and stdio."""

    uid: int
    gid: int
    groups: list[int]
    umask: int
    nice: int
    sched: int  # scheduling policy (os.SCHED_*)
    rlimits: dict[str, list[int]]  # name -> [soft, hard] (RLIM_INFINITY: -1)
    oom_score_adj: int | None
    fds: list[int]  # inheritable descriptors beyond 0-2, in the order they are passed
    closed: list[int] = field(default_factory=list)  # of 0, 1, 2: those not open (sent as
    # /dev/null, closed again in the child)
    sigmask: list[int] = field(default_factory=list)  # blocked signals
    sigign: list[int] = field(default_factory=list)  # ignored signals (nohup's SIGHUP)
    no_new_privs: bool = False

    @classmethod
    def capture(cls) -> ProcState:
        """This process's state, as a child it forks and execs would inherit it."""
        mask = os.umask(0)
        os.umask(mask)
        return cls(
            uid=os.getuid(),
            gid=os.getgid(),
            groups=sorted(os.getgroups()),
            umask=mask,
            nice=os.getpriority(os.PRIO_PROCESS, 0),
            sched=os.sched_getscheduler(0),
            rlimits={n: list(resource.getrlimit(getattr(resource, n))) for n in _RLIMITS},
            oom_score_adj=_oom_score_adj(),
            fds=_inheritable_fds(),
            closed=_closed_stdio(),
            sigmask=sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            sigign=sorted(ignored_signals()),
            no_new_privs=_no_new_privs(),
        )

    def unfit(self) -> str | None:
        """Why a child of *this* process could not take on the state (a cold command then
        gets it, from krex run itself), or None."""
        me = ProcState.capture()
        root = os.geteuid() == 0
        if self.uid != me.uid:
            return f"the command's user ({self.uid}) is not the warm worker's ({me.uid})"
        if not root and (self.gid != me.gid or self.groups != me.groups):
            return "the command's groups are not the warm worker's"
        if len(self.fds) > MAX_PASSED_FDS:
            return f"more than {MAX_PASSED_FDS} inherited descriptors"
        for name, (_, hard) in self.rlimits.items():
            mine = me.rlimits.get(name)
            if mine is not None and not root and _above(hard, mine[1]):
                return f"{name}'s hard limit is above the warm worker's"
        if not root and self.nice < me.nice:
            return f"nice {self.nice} is below the warm worker's {me.nice}"
        if not root and self.sched not in _SCHED_UNPRIVILEGED and self.sched != me.sched:
            return "a real-time scheduling policy"
        if me.no_new_privs and not self.no_new_privs:
            return "the warm worker runs with no_new_privs"
        own, theirs = me.oom_score_adj, self.oom_score_adj
        if not root and own is not None and theirs is not None and theirs < own:
            return "an oom_score_adj below the warm worker's"
        return None

    def apply(self) -> None:
        """Take the state on, in a freshly forked child (unfit() said it can)."""
        if os.geteuid() == 0:
            if sorted(os.getgroups()) != self.groups:
                os.setgroups(self.groups)
            if os.getgid() != self.gid:
                os.setgid(self.gid)
        os.umask(self.umask)
        for name, (soft, hard) in self.rlimits.items():
            which = getattr(resource, name)
            if resource.getrlimit(which) != (soft, hard):
                resource.setrlimit(which, (soft, hard))
        if os.getpriority(os.PRIO_PROCESS, 0) != self.nice:
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)
        if os.sched_getscheduler(0) != self.sched:
            os.sched_setscheduler(0, self.sched, os.sched_param(0))
        if self.oom_score_adj is not None and _oom_score_adj() != self.oom_score_adj:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(self.oom_score_adj))
        if self.no_new_privs and not _no_new_privs():
            _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def ignored_signals() -> set[int]:
    """The signals this process ignores as it inherited them (SIGPIPE and SIGXFSZ aside:
    CPython ignores those itself at start-up, and sets them back in every command)."""
    out = set()
    for s in signal.valid_signals():
        if s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ):
            continue
        try:
            if signal.getsignal(s) == signal.SIG_IGN:
                out.add(int(s))
        except (OSError, ValueError):
            continue
    return out


_PR_SET_NO_NEW_PRIVS, _PR_GET_NO_NEW_PRIVS = 38, 39


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0))


def _no_new_privs() -> bool:
    return _prctl(_PR_GET_NO_NEW_PRIVS) == 1


def _above(a: int, b: int) -> bool:
    """Whether limit a is above limit b (RLIM_INFINITY above all)."""
    inf = resource.RLIM_INFINITY
    return b != inf and (a == inf or a > b)


def _closed_stdio() -> list[int]:
    """Which of 0, 1, 2 were closed when this interpreter started (it then left the stream
    None: the descriptor may have been taken by something else since)."""
    streams = (sys.__stdin__, sys.__stdout__, sys.__stderr__)
    return [fd for fd, stream in enumerate(streams) if stream is None]


def _oom_score_adj() -> int | None:
    try:
        with open("/proc/self/oom_score_adj") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _inheritable_fds() -> list[int]:
    """This process's descriptors beyond 0-2 that a child it execs would keep (krex run's own
    are close-on-exec)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    out.append(fd)
            except OSError:  # the listing's own, closed by now
                continue
    return sorted(out)
