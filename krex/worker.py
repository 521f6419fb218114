"""A warm pool worker: a fork server (docs/pool.md).

The worker is a Python interpreter that has imported the configured modules (torch, triton,
Inductor) and touched no GPU: CUDA is not initialised in it, so a child forked from it is as
good as a fresh interpreter that has already paid for its imports. Started and supervised by
the daemon (`python -m krex.worker`); it tells the daemon it is ready over a connection of its
own, then serves clients: for each job the daemon authorises (a one-time token), the command's
client connects to the worker's socket and hands over the command (argv, cwd, environment) and
its stdin, stdout and stderr (SCM_RIGHTS). The worker forks; the child becomes the command:
its environment, cwd, argv and stdio, its own tenant's slot (the shim attaches at the child's
first context), and a process of its own that ends when the command has.

Why a fresh process per command rather than one interpreter running command after command:
on the H200 a compute-bound kernel's later measurements in one process read 12-15 % slower
than its first (docs/results/h200-fidelity/run2/), and atexit handlers, compile worker pools,
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
import importlib
import io
import os
import random
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from krex import wire
from krex.errors import ProtocolError
from krex.pool import Invocation

JOB_ACCEPT_S = 30.0  # an authorised job waits this long for its client
FRAME_S = 5.0  # a connected client sends its job within this
GO_S = 60.0  # a forked child waits this long for `krex run` to say go
_RUNNER_FILES = {os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
# torch's default seed in a fresh process (c10's default_rng_seed_val).
_TORCH_DEFAULT_SEED = 67280421310721
# Exit handlers of these packages are the framework's teardown, not the command's own: they
# run after the exit status is reported (docs/pool.md).
_FRAMEWORK = ("torch", "triton", "multiprocessing", "concurrent", "logging", "asyncio", "jax")
# Helper processes a framework leaves to its exit handlers; ended at once after the report
# (Inductor's compile workers took 5.5-8 s to shut down: docs/results/h200-pool/probe/).
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
    H200 box and forked children use the GPU fine: docs/results/h200-pool/probe/); the real
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


class DriverInitialized(RuntimeError):
    """A preload module initialised the GPU driver: children forked after it could not use
    the GPU."""

    def __init__(self, module: str) -> None:
        super().__init__(
            f"importing {module} initialised the GPU driver: children forked after it could "
            "not use the GPU (leave it out of [pool] preload)"
        )
        self.module = module


def warm_up(preload: list[str]) -> list[str]:
    """Import the preload modules; returns those skipped, each with why. DriverInitialized
    when one's import initialises the GPU driver (the process is then unfit to fork)."""
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
    """A command handed to a forked child: what krex run sent, and its connection."""

    conn: socket.socket
    inv: Invocation
    cwd: str
    env: dict[str, str]
    fds: list[int]


@dataclass
class Zygote:
    """The fork server's state: its sockets and the jobs the daemon authorised."""

    listener: socket.socket
    ctl: socket.socket
    tokens: dict[str, float] = field(default_factory=dict)  # token -> deadline
    children: set[int] = field(default_factory=set)
    buf: bytes = b""

    def tell(self, msg: dict[str, Any]) -> None:
        self.ctl.sendall(wire.encode(msg))

    def serve(self, wake: int) -> Job | None:
        """Serve until the daemon lets us go (None), or, in a forked child, its job."""
        while True:
            self.reap()
            fds = [self.ctl.fileno(), self.listener.fileno(), wake]
            ready, _, _ = select.select(fds, [], [], 1.0)
            if wake in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 512)
            if fds[0] in ready and not self.control():
                return None
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
        self.tokens = {t: d for t, d in self.tokens.items() if d > now}
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg = wire.decode(line, request=False)
            if msg.get("op") == "exit":
                return False
            if msg.get("op") == "job" and isinstance(msg.get("token"), str):
                self.tokens[msg["token"]] = now + JOB_ACCEPT_S
        return True

    def accept(self) -> Job | None:
        """A client's job: checked, then forked. In the parent None; in the child its Job."""
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return None
        conn.settimeout(FRAME_S)
        fds: list[int] = []
        try:
            msg, fds = wire.recv_frame(conn, max_fds=3)
            if msg is None or self.tokens.pop(str(msg.get("token")), None) is None:
                raise ProtocolError("no job for its token")
            if len(fds) != 3:
                raise ProtocolError("no stdin, stdout and stderr with it")
            job = Job(
                conn=conn,
                inv=Invocation(**msg["invocation"]),
                cwd=str(msg["cwd"]),
                env={str(k): str(v) for k, v in msg["env"].items()},
                fds=fds,
            )
        except (OSError, ProtocolError, KeyError, TypeError, AttributeError) as e:
            print(f"krex worker: refused a client: {e}", file=sys.stderr)
            _close(conn, fds)
            return None
        pid = os.fork()
        if pid == 0:
            return job
        self.children.add(pid)
        _close(conn, fds)
        return None

    def reap(self) -> None:
        """Each child that ended: its exit status to the daemon (the client asks it when the
        child vanished without a report: os._exit, a signal, a crash)."""
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            self.children.discard(pid)
            code = os.waitstatus_to_exitcode(status) if done == pid else 0
            self.tell({"op": "exited", "pid": pid, "status": code if code >= 0 else 128 - code})


def _close(conn: socket.socket, fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    conn.close()


# The child: from the worker's state to the command's.
def become(job: Job, zygote: Zygote, pipe: tuple[int, int]) -> None:
    """In a forked child: drop the worker's sockets and handlers, take the command's stdio,
    environment, cwd, argv and path, as a fresh interpreter would have them."""
    signal.set_wakeup_fd(-1)
    zygote.listener.close()
    zygote.ctl.close()
    for fd in pipe:
        os.close(fd)
    for s in signal.valid_signals():
        if s in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, signal.SIG_DFL)
    # CPython's own choices at start-up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for i, fd in enumerate(job.fds):
        os.dup2(fd, i)
        os.close(fd)
    inv, env = job.inv, job.env
    unbuffered = inv.unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin, sys.stdout, sys.stderr = _stdio(unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    os.chdir(job.cwd)
    own = os.environ.get("PYTHONPATH", "")
    own_entries = {os.path.abspath(p) for p in own.split(os.pathsep) if p}
    base = [p for p in sys.path[1:] if os.path.abspath(p) not in own_entries]
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if inv.kind == "script":
        first = os.path.dirname(os.path.realpath(inv.target))
    elif inv.kind == "module":
        first = os.getcwd()
    else:
        first = ""
    sys.path[:] = [first, *extra, *base]
    sys.argv[:] = [inv.argv0(), *inv.args]
    sys.dont_write_bytecode = inv.dont_write_bytecode or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    for opt in inv.warnings:
        warnings._setoption(opt)  # type: ignore[attr-defined]
    importlib.invalidate_caches()
    # Every child would otherwise draw the worker's random numbers.
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(_TORCH_DEFAULT_SEED)


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
            except SystemExit:
                pass
            except BaseException:
                with contextlib.suppress(Exception):
                    print(f"Exception ignored in atexit callback: {func!r}", file=sys.stderr)
                    traceback.print_exc()


def _own(func: Callable[..., Any]) -> bool:
    """Whether an exit handler is the command's own (not a framework's teardown)."""
    inner = getattr(func, "func", None) or getattr(func, "__func__", None) or func
    module = getattr(inner, "__module__", None) or type(inner).__module__ or ""
    return module.split(".")[0] not in _FRAMEWORK


def run_child(job: Job) -> int:
    """The command, in its forked child; returns the process's exit status."""
    conn = job.conn
    conn.settimeout(None)
    wire.send_frame(conn, {"pid": os.getpid()})
    conn.settimeout(GO_S)
    try:
        go, _ = wire.recv_frame(conn)
    except (OSError, ProtocolError):
        go = None
    if not go or go.get("go") is not True:
        return 125  # krex run did not let it start (it reports why)
    conn.settimeout(None)
    # Processes the command forks (a process pool's workers) must not hold krex run's
    # connection: it ends when the command has.
    os.register_at_fork(after_in_child=lambda: os.close(conn.detach()))
    reported = threading.Event()
    threading.Thread(target=_watch_client, args=(conn, reported), daemon=True).start()
    with ExitHandlers() as handlers:
        if os.environ.get("KREX_AUTO_REGIONS", "").strip():
            _auto_regions(os.environ["KREX_AUTO_REGIONS"])  # its exit note is ours: before
        status = _execute(job.inv)
        _shutdown_threads()
        handlers.run(own=True)
        _end_lingering_regions()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120  # CPython's status when flushing stdout fails
    # The command is over: report, then let go of its stdio (whoever reads it to its end, the
    # agent's harness, stops waiting) before the framework's teardown.
    _detach_stdio()
    reported.set()
    with contextlib.suppress(OSError):
        wire.send_frame(conn, {"status": status})
        conn.shutdown(socket.SHUT_RDWR)
    conn.close()
    _end_helpers()
    handlers.run(own=False)
    return status


def _auto_regions(value: str) -> None:
    """What krex/_auto/sitecustomize.py does at a cold interpreter's start-up."""
    try:
        import krex.autoregions as auto

        auto.install(auto.parse(value))
        log = os.environ.get(auto.LOG_VAR)
        if log:
            auto.note_at_exit(log)
    except Exception as exc:
        print(f"krex: auto-regions are off in this process: {exc}", file=sys.stderr)


def _end_lingering_regions() -> None:
    """The command's auto-regions still held (krex/markers.py) ended now, before its status is
    reported, so that its report has every region and the siblings are not held for it."""
    markers = sys.modules.get("krex.markers")
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


def _watch_client(conn: socket.socket, reported: threading.Event) -> None:
    """A vanished `krex run` ends the command (as a cold one dies with its client)."""
    while True:
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if reported.is_set():
            return
        if not data:
            os.kill(os.getpid(), signal.SIGKILL)
            return


def _stdio(unbuffered: bool) -> tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]:
    """sys.stdin, stdout, stderr over fds 0-2, buffered as CPython buffers them."""
    enc = (sys.__stdout__.encoding if sys.__stdout__ else None) or "utf-8"

    def out(fd: int, errors: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "wb", closefd=False)
        binary: io.RawIOBase | io.BufferedWriter = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            binary,  # type: ignore[arg-type]
            encoding=enc,
            errors=errors,
            line_buffering=line,
            write_through=unbuffered,
        )

    stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding=enc, errors="strict"
    )
    tty = os.isatty(1)
    return stdin, out(1, "strict", tty), out(2, "backslashreplace", True)


def _execute(inv: Invocation) -> int:
    """Run the command as __main__; its exit status as CPython would give it."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try:
        if inv.kind == "script":
            runpy.run_path(inv.target, run_name="__main__")
        elif inv.kind == "module":
            runpy._run_module_as_main(inv.target, alter_argv=True)  # type: ignore[attr-defined]
        else:
            exec(compile(inv.target, "<string>", "exec"), main.__dict__)
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
    if isinstance(code, int) and not isinstance(code, bool):
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
    ap = argparse.ArgumentParser(prog="python -m krex.worker")
    ap.add_argument("--socket", required=True, help="the daemon's socket")
    ap.add_argument("--listen", required=True, help="this worker's socket for its clients")
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--preload", default="", help="comma-separated modules to import")
    args = ap.parse_args(argv)
    me = os.getpid()
    preload = [m for m in args.preload.split(",") if m]
    try:
        skipped = warm_up(preload)
    except DriverInitialized as e:
        # Start again without it: a fresh image, the same process for the daemon.
        print(f"krex worker {args.worker}: {e}; starting again without it", file=sys.stderr)
        rest = ",".join(m for m in preload if m != e.module)
        argv = [a for a in sys.argv[1:] if not a.startswith("--preload")]
        os.execv(sys.executable, [sys.executable, "-m", "krex.worker", *argv, f"--preload={rest}"])
    except Exception as e:
        print(f"krex worker {args.worker}: warm-up failed: {e}", file=sys.stderr)
        return 3
    for s in skipped:
        print(f"krex worker {args.worker}: not preloaded: {s}", file=sys.stderr)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.listen)
    listener.bind(args.listen)
    os.chmod(args.listen, 0o600)
    listener.listen(64)
    listener.setblocking(False)
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ctl.connect(args.socket)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    z = Zygote(listener, ctl)
    z.tell(
        {
            "op": "worker_ready",
            "worker": args.worker,
            "secret": os.environ.get("KREX_WORKER_SECRET", ""),
            "pid": me,
        }
    )
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
    become(job, z, (wake_r, wake_w))
    return run_child(job)


if __name__ == "__main__":
    sys.exit(main())
