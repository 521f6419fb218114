"""A warm pool worker: a fork server (docs/pool.md).

The worker is a Python interpreter that has imported the configured modules (torch, triton,
Inductor) and touched no GPU: CUDA is not initialised in it, so a child forked from it is as
good as a fresh interpreter that has already paid for its imports. Started and supervised by
the daemon (`python -m krex.pool.worker`); it tells the daemon it is ready over a connection of its
own, then serves clients: for each job the daemon authorises (a one-time token), the command's
client connects to the worker's socket and hands over the command (argv, cwd, environment) and
its stdin, stdout and stderr (SCM_RIGHTS). The worker forks; the child becomes the command:
its environment, cwd, argv and stdio, its own tenant's slot (the shim attaches at the child's
first context), and a process of its own that ends when the command has.

Why a fresh process per command rather than one interpreter running command after command:
on the H200 a compute-bound kernel's later measurements in one process read 12-15 % slower
than its first (docs/pool.md), and atexit handlers, compile worker pools,
threads and module state all end with the process, as they would natively.

The child reports the command's exit status as soon as the command's own work and its own
exit handlers are done (`krex run` returns then); the framework's teardown (Inductor's compile
workers, the interpreter's finalisation) follows with its stdio detached (docs/pool.md, "No
exit tax").
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import errno
import fcntl
import importlib
import importlib.machinery
import io
import math
import os
import random
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from krex.core import messages, wire
from krex.core.errors import KrexError, ProtocolError
from krex.pool.plan import MAX_PASSED_FDS, Invocation, ProcState

JOB_ACCEPT_S = 30.0  # an authorised job waits this long for its client
FRAME_S = 5.0  # a connected client sends its job within this
GO_S = 60.0  # a forked child waits this long for `krex run` to say go
_RUNNER_FILES = {os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
# Exit handlers of these packages are the framework's teardown, not the command's own: they
# run after the exit status is reported (docs/pool.md).
_FRAMEWORK = ("torch", "triton", "multiprocessing", "concurrent", "logging", "asyncio", "jax")
# Helper processes a framework leaves to its exit handlers; ended at once after the report
# (Inductor's compile workers took 5.5-8 s to shut down: docs/pool.md).
_FRAMEWORK_HELPERS = ("torch._inductor.compile_worker",)


def _driver_loaded() -> str | None:
    """The path of the CUDA (or HIP) driver library mapped in this process, or None."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            path = line.split(maxsplit=5)[-1].strip()
            if "libcuda.so" in path or "libamdhip64.so" in path:
                return path
    return None


_CUDA_ERROR_NOT_INITIALIZED = 3


def driver_initialized() -> bool:
    """Whether the GPU driver is initialised in this process: then a child forked from it
    could not use the GPU. Loaded is not initialised (importing torch loads libcuda on the
    H200 box and forked children use the GPU fine: docs/pool.md); the real
    driver answers any call before cuInit with CUDA_ERROR_NOT_INITIALIZED. The simulated one
    initialises on any call, so there loaded counts as initialised."""
    path = _driver_loaded()
    if path is None:
        return False
    if os.environ.get("KREX_SIM_SHM") or "libcuda.so" not in path:
        return True  # the simulated driver, or HIP's: none we can ask
    torch = sys.modules.get("torch")
    with contextlib.suppress(Exception):
        if torch is not None and torch.cuda.is_initialized():
            return True
    try:
        cu = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return True
    ask = getattr(cu, "cuDeviceGetCount", None)
    if ask is None:
        return True
    count = ctypes.c_int()
    return bool(ask(ctypes.byref(count)) != _CUDA_ERROR_NOT_INITIALIZED)


class DriverInitialized(KrexError, RuntimeError):
    """A preload module initialised the GPU driver: children forked after it could not use
    the GPU."""

    def __init__(self, module: str) -> None:
        super().__init__(
            f"importing {module} initialised the GPU driver: children forked after it could "
            "not use the GPU (leave it out of [pool] preload)"
        )
        self.module = module


# warnings.filters as they were before the preload's imports (see _warning_options).
_FILTERS_BEFORE_PRELOAD: list[Any] = []


def warm_up(preload: list[str]) -> list[str]:
    """Import the preload modules; returns those skipped, each with why. DriverInitialized
    when one's import initialises the GPU driver (the process is then unfit to fork)."""
    _FILTERS_BEFORE_PRELOAD[:] = warnings.filters
    skipped = []
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as e:  # a module that cannot be imported here is just not preloaded
            skipped.append(f"{name} ({type(e).__name__}: {e})")
        if driver_initialized():
            raise DriverInitialized(name)
    return skipped


@dataclass
class Job:
    """A command handed to a forked child: what krex run sent, and the pipe that lets it go."""

    inv: Invocation
    argv: list[str]  # the command line as krex run got it (for a fresh interpreter)
    cwd: str
    env: dict[str, str]
    state: ProcState  # what the command inherits from krex run besides the above
    fds: list[int]  # stdin, stdout, stderr, then state.fds's descriptors, as received
    go: int  # read end: a byte when krex run lets the command start, EOF when it does not
    report: str  # krex run's socket, where the child reports its status (or a cold start)


@dataclass
class Child:
    """A forked child as the fork server keeps it: its client's connection and pid."""

    conn: socket.socket
    client: int  # krex run's pid: a signal the child sends its parent (us) is forwarded there
    go: int | None  # write end of its go pipe until krex run lets it go
    done: bool = False  # its status went to krex run


# Signals a child may send its parent (the fork server): forwarded to its krex run, as a cold
# command's reach krex run (which passes them on to the command). The fork server keeps them
# blocked and takes them with their sender; from anyone else they act as their default would.
RELAYED = frozenset(
    {
        signal.SIGHUP,
        signal.SIGINT,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
        signal.SIGTERM,
        signal.SIGTSTP,
        signal.SIGCONT,
    }
)


@dataclass
class Zygote:
    """The fork server's state: its sockets, the jobs the daemon authorised, its children."""

    listener: socket.socket
    ctl: socket.socket
    tokens: dict[str, tuple[float, int]] = field(default_factory=dict)  # -> deadline, client
    strangers: int = 0  # connections closed unread: from a process that has no job here
    children: dict[int, Child] = field(default_factory=dict)
    buf: bytes = b""

    def tell(self, msg: messages.Message) -> None:
        self.ctl.sendall(wire.encode(msg.to_wire()))

    def serve(self, wake: int) -> Job | None:
        """Serve until the daemon lets us go (None), or, in a forked child, its job."""
        while True:
            self.reap()
            self.relay()
            conns = {c.conn.fileno(): pid for pid, c in self.children.items() if not c.done}
            fds = [self.ctl.fileno(), self.listener.fileno(), wake, *conns]
            # Briefly while children live: a signal they send us is taken by polling.
            ready, _, _ = select.select(fds, [], [], 0.05 if self.children else 1.0)
            if wake in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 512)
            if fds[0] in ready and not self.control():
                return None
            for fd in ready:
                if fd in conns:
                    self.client_says(conns[fd])
            if fds[1] in ready:
                job = self.accept()
                if job is not None:
                    return job

    def control(self) -> bool:
        """One read of the daemon's messages; False when the daemon is gone or says exit."""
        data = self.ctl.recv(65536)
        if not data:
            return False
        self.buf += data
        now = time.monotonic()
        self.tokens = {t: d for t, d in self.tokens.items() if d[0] > now}
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg = wire.decode(line, request=False)
            try:
                told = messages.parse(msg, messages.Exit, messages.Job)
            except ProtocolError:
                continue  # nothing a worker acts on
            if isinstance(told, messages.Exit):
                return False
            if isinstance(told, messages.Job):
                self.tokens[told.token] = (now + JOB_ACCEPT_S, told.client)
        return True

    def accept(self) -> Job | None:
        """A client's job (checked, then forked: in the parent None, in the child its Job).
        Only a process the daemon leased a job to is read from (at most FRAME_S): any other
        connection is closed unread, so that a flood of them delays nobody's job."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return None
            try:
                peer = _peer_pid(conn)
            except OSError:
                conn.close()
                continue
            now = time.monotonic()
            if any(d > now and c in (peer, 0) for d, c in self.tokens.values()):
                return self._job(conn, peer)
            conn.close()
            self.strangers += 1
            if math.log10(self.strangers).is_integer():  # the 1st, 10th, 100th, ...
                print(
                    f"krex worker: refused a client: no job for its token (pid {peer}; "
                    f"{self.strangers} connection(s) so far from processes with no job)",
                    file=sys.stderr,
                )

    def _job(self, conn: socket.socket, peer: int) -> Job | None:
        conn.settimeout(FRAME_S)
        fds: list[int] = []
        try:
            msg, fds = wire.recv_frame(conn, max_fds=3 + MAX_PASSED_FDS)
            token = self.tokens.pop(str(msg.get("token")), None) if msg is not None else None
            if msg is None or token is None or token[0] <= time.monotonic():
                raise ProtocolError("no job for its token")
            if token[1] not in (peer, 0):
                raise ProtocolError(f"its job is process {token[1]}'s, not {peer}'s")
            state = ProcState(**msg["state"])
            if len(fds) != 3 + len(state.fds):
                raise ProtocolError("not the descriptors announced (stdio, then the others)")
            if why := state.unfit():
                wire.send_frame(conn, {"refused": why})
                _close(conn, fds)
                return None
            job = Job(
                inv=Invocation(**msg["invocation"]),
                argv=[str(a) for a in msg["argv"]],
                cwd=str(msg["cwd"]),
                env={str(k): str(v) for k, v in msg["env"].items()},
                state=state,
                fds=fds,
                go=-1,
                report=str(msg["report"]),
            )
        except (OSError, ProtocolError, KeyError, TypeError, AttributeError, ValueError) as e:
            print(f"krex worker: refused a client: {e}", file=sys.stderr)
            _close(conn, fds)
            return None
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            job.go = go_r
            conn.close()
            return job
        os.close(go_r)
        for fd in fds:
            os.close(fd)
        self.children[pid] = Child(conn=conn, client=peer, go=go_w)
        try:
            conn.settimeout(FRAME_S)
            wire.send_frame(conn, {"pid": pid})
            conn.settimeout(None)
        except OSError:
            self.end(pid)
        return None

    def client_says(self, pid: int) -> None:
        """krex run lets its child go; or has its status (the child's framework teardown
        goes on); or is gone: then the child goes too (a cold command dies with its client)."""
        child = self.children[pid]
        try:
            msg, _ = wire.recv_frame(child.conn)
        except (OSError, ProtocolError):
            msg = None
        if msg is not None and msg.get("go") is True and child.go is not None:
            os.write(child.go, b"g")
            os.close(child.go)
            child.go = None
            return
        if msg is not None and msg.get("done") is True and child.go is None:
            self._finish(child, {})
            return
        self.end(pid)

    def _finish(self, child: Child, msg: dict[str, Any]) -> None:
        child.done = True
        with contextlib.suppress(OSError):
            wire.send_frame(child.conn, msg)
            child.conn.shutdown(socket.SHUT_RDWR)
        child.conn.close()
        if child.go is not None:
            os.close(child.go)
            child.go = None

    def end(self, pid: int) -> None:
        """Its krex run is gone (or never let it go): the child ends now."""
        child = self.children[pid]
        if child.done:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._finish(child, {})

    def reap(self) -> None:
        """Each child that ended: its exit status to its krex run (where the child did not
        report it: os._exit, a signal, a crash) and to the daemon."""
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            child = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status) if done == pid else 0
            code = code if code >= 0 else 128 - code
            if not child.done:
                self._finish(child, {"status": code})
            self.tell(messages.Exited(pid, code))

    def relay(self) -> None:
        """Signals sent to us: a child's go to its krex run; anyone else's act as they would
        on a process that never blocked them."""
        while (info := signal.sigtimedwait(RELAYED, 0)) is not None:
            child = self.children.get(info.si_pid)
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.client, info.si_signo)
                continue
            signal.signal(info.si_signo, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {info.si_signo})
            os.kill(os.getpid(), info.si_signo)


def _peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def _close(conn: socket.socket, fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    conn.close()


def _report(path: str, msg: dict[str, Any]) -> None:
    """Tell krex run (a connection of its own: the child keeps no descriptor of krex's while
    the command runs, so closing every descriptor is harmless, and a fork server the command
    killed loses nothing)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(FRAME_S)
        s.connect(path)
        wire.send_frame(s, msg)


# The child: from the worker's state to the command's.
def become(job: Job, zygote: Zygote, pipe: tuple[int, int]) -> list[str]:
    """In a forked child: a session of its own, the worker's sockets, handlers and
    descriptors dropped, the caller's descriptors at their numbers, its limits, umask, nice and
    the rest of its process state, and the command's environment, cwd, argv and path, as a
    fresh interpreter started by krex run would have them. Returns the command's own entries
    of sys.path (its script's directory or cwd, PYTHONPATH's), before the worker's."""
    os.setsid()  # signals to its group reach it and its descendants, not the fork server's
    _leave_the_server(zygote, pipe)
    _take_descriptors(job)
    job.state.apply()
    _signals_as_started(job.state)
    _stdio_as_started(job)
    own = _paths_as_started(job)
    # Every child would otherwise draw the worker's random numbers.
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    # A fresh torch seeds its CPU generator from the system's entropy (not a constant); its
    # CUDA generators are made when the command starts CUDA, as natively (the worker never
    # does), so they are left alone.
    generator = getattr(sys.modules.get("torch"), "default_generator", None)
    if generator is not None:
        generator.seed()
    return own


def _leave_the_server(zygote: Zygote, pipe: tuple[int, int]) -> None:
    """Drop what the fork server holds: its wake-up pipe, sockets and children's connections."""
    signal.set_wakeup_fd(-1)
    zygote.listener.close()
    zygote.ctl.close()
    for child in zygote.children.values():
        child.conn.close()
        if child.go is not None:
            os.close(child.go)
    zygote.children.clear()
    for fd in pipe:
        os.close(fd)


def _signals_as_started(state: ProcState) -> None:
    """Every handler at its default, then what the caller ignored stays ignored; then CPython's
    own choices at start-up (SIGINT raises KeyboardInterrupt unless ignored); the caller's
    mask."""
    for s in signal.valid_signals():
        if s in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, signal.SIG_DFL)
    for ign in state.sigign:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(ign, signal.SIG_IGN)
    if signal.SIGINT not in state.sigign:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, state.sigmask)


def _stdio_as_started(job: Job) -> None:
    """sys.stdin, stdout and stderr over the caller's descriptors, buffered as it asked."""
    unbuffered = job.inv.unbuffered or bool(job.env.get("PYTHONUNBUFFERED"))
    streams: list[Any] = list(_stdio(unbuffered))
    for fd in job.state.closed:  # closed in the caller (sent as /dev/null): closed here too,
        os.close(fd)  # and its stream None, as CPython leaves one it found closed
        streams[fd] = None
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]


def _paths_as_started(job: Job) -> list[str]:
    """The command's cwd, environment, sys.path, argv and interpreter flags; the command's own
    entries of sys.path."""
    inv, env = job.inv, job.env
    os.chdir(job.cwd)
    own = os.environ.get("PYTHONPATH", "")
    own_entries = {os.path.abspath(p) for p in own.split(os.pathsep) if p}
    base = [p for p in sys.path[1:] if os.path.abspath(p) not in own_entries]
    os.environ.clear()
    os.environ.update(env)
    time.tzset()  # TZ, as the interpreter's start reads it (the worker read its own)
    # As CPython sets them: PYTHONPATH's entries absolute; first the script's directory
    # (symlinks resolved), a directory or zip run as a script itself, or cwd.
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if inv.kind == "script" and not os.path.isfile(inv.target):
        first = os.path.abspath(inv.target)  # a directory or zip with a __main__
    elif inv.kind == "script":
        first = os.path.dirname(os.path.realpath(inv.target))
    elif inv.kind == "module":
        first = os.getcwd()
    else:
        first = ""
    sys.path[:] = [first, *extra, *base]
    sys.argv[:] = [inv.argv0(), *inv.args]
    sys.orig_argv[:] = job.argv  # the interpreter's command line, as it got it
    sys.dont_write_bytecode = inv.dont_write_bytecode or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    _warning_options(inv.warnings)
    importlib.invalidate_caches()
    return [first, *extra]


def _warning_options(options: list[str]) -> None:
    """The command's -W options where a fresh interpreter has them once it has imported the
    preload modules: behind the filters those imports added. Natively `python -W error` comes
    first and `import torch` then puts torch's own ignores in front of it; applied in front of
    them, a warning torch ignores would be raised as an error in a warm command only."""
    if not options:
        return
    now, before = list(warnings.filters), _FILTERS_BEFORE_PRELOAD
    at = next((i for i in range(len(now) - len(before) + 1) if now[i : i + len(before)] == before),
              None)  # fmt: skip
    if at is None:  # the preload rewrote the interpreter's filters: options go first
        before, at = [], 0
    filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
    filters[:] = before
    for opt in options:
        warnings._setoption(opt)  # type: ignore[attr-defined]
    filters[:0] = now[:at]  # what the preload put in front (filterwarnings)
    filters.extend(now[at + len(before) :])  # and behind (append=True)
    # The filters' version, which warn()'s caches follow (3.14 renamed the function).
    mutated = getattr(warnings, "_filters_mutated", None) or getattr(
        warnings, "_filters_mutated_lock_held", None
    )
    if mutated is not None:
        mutated()


def _take_descriptors(job: Job) -> None:
    """Exactly what a cold command has open: stdin, stdout, stderr and the caller's other
    inheritable descriptors, at their numbers; nothing of the worker's (its sockets, what its
    preloaded modules opened), and only the go pipe of krex's own until the command starts."""
    wanted = [0, 1, 2, *job.state.fds]
    # First out of the way (a received descriptor may sit on a wanted number), then in place.
    floor = max([*wanted, *job.fds, job.go]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in job.fds]
    go = fcntl.fcntl(job.go, fcntl.F_DUPFD_CLOEXEC, floor)
    keep = set(moved) | {go}
    for fd in _open_fds():
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    for src, dst in zip(moved, wanted, strict=True):
        os.dup2(src, dst, inheritable=True)
        os.close(src)
    job.go = go


def _open_fds() -> list[int]:
    return [int(n) for n in os.listdir("/proc/self/fd")]


_MODULE_SUFFIXES = tuple(importlib.machinery.all_suffixes())


def _shadowed(own: list[str]) -> str | None:
    """A module the worker imported that the command's own path entries (`own`: its script's
    directory or cwd, PYTHONPATH's entries) give in another file: natively the project's
    json.py shadows the stdlib's, in the command and in every module that imports it. None
    when there is none."""
    names: dict[str, str] = {}
    # krex/tenant/_auto, found from here: importing krex.tenant.autoregions would put its
    # modules into every warm command.
    here = os.path.dirname(os.path.abspath(__file__))
    auto = os.path.realpath(os.path.join(os.path.dirname(here), "tenant", "_auto"))
    for entry in own:
        d = entry or os.getcwd()
        if os.path.realpath(d) == auto:
            continue  # krex's own auto-regions sitecustomize: emulated (_auto_regions)
        try:
            listing = os.listdir(d)
        except OSError:
            continue
        for item in listing:
            path = os.path.join(d, item)
            if os.path.isfile(os.path.join(path, "__init__.py")):
                names.setdefault(item, os.path.realpath(path))
            for suffix in _MODULE_SUFFIXES:
                if item.endswith(suffix) and os.path.isfile(path):
                    names.setdefault(item[: -len(suffix)].split(".")[0], os.path.realpath(path))
    for hook in ("sitecustomize", "usercustomize"):
        if hook in names:  # natively it runs at the interpreter's start: a fresh one does
            return f"the command's own {hook} ({names[hook]}) runs at an interpreter's start"
    for name, module in list(sys.modules.items()):
        if "." in name or name not in names or module is None or name == "__main__":
            continue
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None)
        if origin in (None, "built-in", "frozen"):
            continue  # found before any path entry: nothing on a path shadows it
        where = os.path.realpath(origin)
        if where != names[name] and not where.startswith(names[name] + os.sep):
            return f"the command's own {name} ({names[name]}) shadows a module warm workers import"
    return None


class ExitHandlers:
    """atexit while the command runs: its registrations are kept here (in order), so that its
    own handlers run before its exit status is reported and the framework's after."""

    def __init__(self) -> None:
        self.handlers: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
        self._register = atexit.register
        self._unregister = atexit.unregister

    def __enter__(self) -> ExitHandlers:
        def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
            self.handlers.append((func, args, kwargs))
            return func

        def unregister(func: Callable[..., Any]) -> None:
            self.handlers = [h for h in self.handlers if h[0] != func]
            self._unregister(func)

        atexit.register, atexit.unregister = register, unregister  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        atexit.register, atexit.unregister = self._register, self._unregister

    def run(self, own: bool) -> None:
        """The command's own handlers (own) or the framework's, last registered first, each
        failure printed as CPython prints it."""
        for func, args, kwargs in reversed([h for h in self.handlers if _own(h[0]) == own]):
            try:
                func(*args, **kwargs)
            except BaseException as e:
                with contextlib.suppress(Exception):
                    print(f"Exception ignored in atexit callback: {func!r}", file=sys.stderr)
                    tb = e.__traceback__  # from the handler's frame on, not ours
                    traceback.print_exception(e.with_traceback(tb.tb_next if tb else None))
                    sys.stderr.flush()


def _own(func: Callable[..., Any]) -> bool:
    """Whether an exit handler is the command's own (not a framework's teardown)."""
    inner = getattr(func, "func", None) or getattr(func, "__func__", None) or func
    module = getattr(inner, "__module__", None) or type(inner).__module__ or ""
    return module.split(".")[0] not in _FRAMEWORK


def run_child(job: Job, own_path: list[str]) -> int:
    """The command, in its forked child; returns the process's exit status."""
    go = os.read(job.go, 1) if job.go >= 0 else b""
    os.close(job.go)
    if go != b"g":
        return 125  # krex run did not let it start (it reports why)
    if why := _shadowed(own_path):
        # Natively its own module would be the one everybody imports: a fresh interpreter,
        # here in the command's process, is the command (a cold start, and krex run says so).
        _report(job.report, {"cold": why})
        try:
            os.execvpe(job.argv[0], job.argv, job.env)
        except OSError as e:
            print(f"krex: cannot start {job.argv[0]}: {e}", file=sys.stderr)
            return 127
    with ExitHandlers() as handlers:
        if os.environ.get("KREX_AUTO_REGIONS", "").strip():
            _auto_regions(os.environ["KREX_AUTO_REGIONS"])  # its exit note is ours: before
        status = _execute(job.inv)
        _shutdown_threads()
        handlers.run(own=True)
        _end_lingering_regions()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError) as e:
            status = status or 120  # CPython's status when flushing stdout fails, and its word
            with contextlib.suppress(Exception):
                sys.stderr.write(f"Exception ignored in: {stream!r}\n")
                sys.stderr.write("".join(traceback.format_exception_only(e)))
                sys.stderr.flush()
    # The command is over: report, then let go of its stdio (whoever reads it to its end, the
    # agent's harness, stops waiting) before the framework's teardown.
    _detach_stdio()
    _report(job.report, {"status": status})
    _end_helpers()
    handlers.run(own=False)
    return status


def _auto_regions(value: str) -> None:
    """What krex/tenant/_auto/sitecustomize.py does at a cold interpreter's start-up."""
    try:
        import krex.tenant.autoregions as auto

        auto.install(auto.parse(value))
        log = os.environ.get(auto.LOG_VAR)
        if log:
            auto.note_at_exit(log)
    except Exception as exc:
        print(f"krex: auto-regions are off in this process: {exc}", file=sys.stderr)


def _end_lingering_regions() -> None:
    """The command's auto-regions still held (krex/tenant/markers.py) ended now, before its status
    is reported, so that its report has every region and the siblings are not held for it."""
    markers = sys.modules.get("krex.tenant.markers")
    if markers is not None:
        markers.flush()


def _shutdown_threads() -> None:
    """What the interpreter does first at exit: threading's own exit hooks (executors shut
    down their workers) and a join of every non-daemon thread."""
    for hook in list(getattr(threading, "_threading_atexits", [])):
        with contextlib.suppress(Exception):
            hook()
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()


def _detach_stdio() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _end_helpers() -> None:
    """Framework helper processes among our descendants, ended now rather than by their slow
    graceful shutdown in the exit handlers (their work for the command is done)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any(h in " ".join(p.cmdline()) for h in _FRAMEWORK_HELPERS):
                    for q in [p, *p.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            q.kill()


# How this interpreter made its streams at start-up (encoding and error handler follow the
# locale, which a command shares with the worker or runs cold: krex/pool/plan.py).
_STREAM_ENCODING = (sys.__stdout__.encoding if sys.__stdout__ else None) or "utf-8"
_STREAM_ERRORS = (sys.__stdout__.errors if sys.__stdout__ else None) or "strict"


def _stdio(unbuffered: bool) -> tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]:
    """sys.stdin, stdout, stderr over fds 0-2 as CPython makes them (create_stdio): named
    <stdin>, <stdout>, <stderr>, their mode, newline "\n", buffered unless -u (stdin always),
    line-buffered to a terminal (stderr always), stderr's errors backslashreplace."""

    def stream(fd: int, name: str, errors: str) -> io.TextIOWrapper:
        reading = fd == 0
        raw = io.FileIO(fd, "rb" if reading else "wb", closefd=False)
        raw.name = name
        binary: Any = (
            io.BufferedReader(raw) if reading else raw if unbuffered else io.BufferedWriter(raw)
        )
        text = io.TextIOWrapper(
            binary,
            encoding=_STREAM_ENCODING,
            errors=errors,
            newline="\n",
            line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)) and not reading,
            write_through=unbuffered and not reading,
        )
        text.mode = "r" if reading else "w"  # type: ignore[misc]
        return text

    return (
        stream(0, "<stdin>", _STREAM_ERRORS),
        stream(1, "<stdout>", _STREAM_ERRORS),
        stream(2, "<stderr>", "backslashreplace"),
    )


def _execute(inv: Invocation) -> int:
    """Run the command as __main__, with the globals and file names CPython gives it; its exit
    status as CPython would give it."""
    import builtins

    main = types.ModuleType("__main__")
    main.__dict__.update(
        {"__package__": None, "__spec__": None, "__annotations__": {}, "__builtins__": builtins}
    )
    sys.modules["__main__"] = main
    try:
        if inv.kind == "script" and os.path.isfile(inv.target):
            # `python file.py`: its code named by the absolute path, as CPython names it
            # (tracebacks, warnings, __file__); sys.argv[0] as given.
            path = os.path.abspath(inv.target)
            loader = importlib.machinery.SourceFileLoader("__main__", path)
            main.__dict__.update({"__file__": path, "__cached__": None, "__loader__": loader})
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
            exec(code, main.__dict__)
        elif inv.kind == "script":
            # A directory or zip with a __main__: found on sys.path, whose first entry it is.
            runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        elif inv.kind == "module":
            runpy._run_module_as_main(inv.target, alter_argv=True)  # type: ignore[attr-defined]
        else:
            main.__dict__["__loader__"] = importlib.machinery.BuiltinImporter
            exec(compile(inv.target, "<string>", "exec", dont_inherit=True), main.__dict__)
        return 0
    except SystemExit as e:
        return _exit_status(e.code)
    except KeyboardInterrupt:
        _print_exception(*sys.exc_info())
        return 128 + signal.SIGINT  # CPython ends by SIGINT, so the shell sees 130
    except BaseException:
        _print_exception(*sys.exc_info())
        return 1


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):  # True too: an int to CPython, status 1
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _print_exception(kind: Any, value: Any, tb: Any) -> None:
    # Drop the worker's and runpy's frames: the traceback starts in the command, as it would.
    while tb is not None and tb.tb_frame.f_code.co_filename in _RUNNER_FILES:
        tb = tb.tb_next
    if value is not None:
        value = value.with_traceback(tb)  # what the default hook prints from
    try:
        sys.excepthook(kind, value, tb)
    except Exception:
        traceback.print_exception(kind, value, tb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m krex.pool.worker")
    ap.add_argument("--socket", required=True, help="the daemon's socket")
    ap.add_argument("--listen", required=True, help="this worker's socket for its clients")
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--preload", default="", help="comma-separated modules to import")
    args = ap.parse_args(argv)
    me = os.getpid()
    if not _warmed_up(args.worker, [m for m in args.preload.split(",") if m]):
        return 3
    listener = _listen(args.listen)
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ctl.connect(args.socket)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # A child's signals to its parent are its krex run's (Zygote.relay): taken with their sender.
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    z = Zygote(listener, ctl)
    z.tell(messages.WorkerReady(args.worker, os.environ.get("KREX_WORKER_SECRET", ""), me))
    try:
        job = z.serve(wake_r)
    except OSError as e:
        if e.errno not in (errno.ECONNRESET, errno.EPIPE):
            raise
        job = None
    finally:
        if os.getpid() == me:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(args.listen)
    if job is None:
        return 0
    own = become(job, z, (wake_r, wake_w))
    return run_child(job, own)


def _warmed_up(worker: int, preload: list[str]) -> bool:
    """Import what the worker preloads; False when that failed. A module that initialised
    the driver: the worker starts again without it (a fresh image, the same process for the
    daemon)."""
    try:
        skipped = warm_up(preload)
    except DriverInitialized as e:
        print(f"krex worker {worker}: {e}; starting again without it", file=sys.stderr)
        rest = ",".join(m for m in preload if m != e.module)
        argv = [a for a in sys.argv[1:] if not a.startswith("--preload")]
        os.execv(
            sys.executable, [sys.executable, "-m", "krex.pool.worker", *argv, f"--preload={rest}"]
        )
    except Exception as e:
        print(f"krex worker {worker}: warm-up failed: {e}", file=sys.stderr)
        return False
    for s in skipped:
        print(f"krex worker {worker}: not preloaded: {s}", file=sys.stderr)
    return True


def _listen(path: str) -> socket.socket:
    """The worker's socket for its clients, at path (0600), non-blocking."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    # Created 0600 under a umask (krex.core.trust.bind_private, not imported here: the fork server
    # imports little), not chmod by name after the bind, which would follow a swapped link.
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    listener.setblocking(False)
    return listener


if __name__ == "__main__":
    sys.exit(main())
