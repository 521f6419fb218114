"""A warm pool worker: a Python interpreter that holds a context on its GPU and has imported the
configured modules, and runs Python benchmarking commands in-process, one at a time.

Started and supervised by the daemon (`python -m krex.worker`, with the pool tenant's
environment, so the shim gates it like any tenant). It tells the daemon it is ready over a
connection of its own, then waits for jobs. For each job the command's client connects to the
worker's socket and hands over the command (argv, cwd, environment) and its stdin, stdout and
stderr (SCM_RIGHTS); the worker runs it as `__main__`, sends back the exit status, resets what
the command changed, and tells the daemon whether it can be used again (docs/pool.md).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import gc
import importlib
import importlib.machinery
import io
import linecache
import logging
import os
import random
import runpy
import signal
import socket
import sys
import threading
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from krex import wire
from krex.errors import ProtocolError
from krex.pool import Invocation
from krex.procs import children

JOB_ACCEPT_S = 30.0  # a leased worker waits this long for its client
_RUNNER_FILES = {os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
_NATIVE_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)
# Native modules a command may leave loaded without retiring its worker: Triton compiles one
# small launcher extension per kernel signature and loads it under this name. It holds no state
# beyond its one function, and the next command's kernels load their own (from their own
# cache), so the old one only costs its mapping; a worker that has kept this many retires.
_LEFT_LOADED = frozenset({"__triton_launcher"})
_MAX_LEFT_LOADED = 1000
# torch's default seed in a fresh process (c10's default_rng_seed_val).
_TORCH_DEFAULT_SEED = 67280421310721


@dataclass
class Baseline:
    """The worker's state after warm-up: what every command starts from."""

    modules: set[str]
    packages: set[str]
    environ: dict[str, str]
    cwd: str
    argv: list[str]
    path: list[str]  # sys.path without the worker's own first entry and PYTHONPATH entries
    signals: dict[int, Any]
    threads: set[int]
    atexit_count: int
    recursion_limit: int
    umask: int
    warnings_filters: list[Any]
    log_handlers: list[logging.Handler]
    log_level: int
    device_bytes: int | None
    excepthook: Callable[..., Any]
    displayhook: Callable[..., Any]


def _signals() -> dict[int, Any]:
    out = {}
    for s in signal.valid_signals():
        if s in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            out[int(s)] = signal.getsignal(s)
    return out


def _torch() -> Any | None:
    return sys.modules.get("torch")


def _device_bytes() -> int | None:
    torch = _torch()
    if torch is None or not torch.cuda.is_initialized():
        return None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return int(torch.cuda.memory_allocated())


def _torch_flags() -> list[tuple[Callable[[], Any], Callable[[Any], None]]]:
    """Process-wide torch settings a command may change: (read, restore) pairs."""
    torch = _torch()
    if torch is None:
        return []
    b = torch.backends
    pairs: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def attr(obj: Any, name: str) -> None:
        if hasattr(obj, name):
            pairs.append((lambda: getattr(obj, name), lambda v: setattr(obj, name, v)))

    for name in ("benchmark", "deterministic", "enabled", "allow_tf32"):
        attr(b.cudnn, name)
    for name in (
        "allow_tf32",
        "allow_fp16_reduced_precision_reduction",
        "allow_bf16_reduced_precision_reduction",
    ):
        attr(b.cuda.matmul, name)
    pairs += [
        (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        (torch.get_default_dtype, torch.set_default_dtype),
        (torch.is_grad_enabled, torch.set_grad_enabled),
        (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
        (torch.get_num_threads, torch.set_num_threads),
    ]
    return pairs


class Worker:
    """One warm worker (module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.own_path0 = sys.path[0] if sys.path else ""
        self.warm_up(args.preload)
        self.baseline = self.snapshot()
        self.left_loaded = 0  # _LEFT_LOADED modules past commands left mapped
        self.flags = [(get, put, get()) for get, put in _torch_flags()]

    # Warm-up.
    def warm_up(self, preload: list[str]) -> None:
        for name in preload:
            importlib.import_module(name)
        self._ctx = _hold_context()
        torch = _torch()
        if torch is not None and torch.cuda.is_available():
            # The allocator, cuBLAS's handle and workspace: what a command's first op pays.
            x = torch.ones(64, 64, device="cuda")
            (x @ x).sum().item()
            del x
        if "triton" in sys.modules:
            with contextlib.suppress(Exception):
                sys.modules["triton"].runtime.driver.active.get_current_device()

    def snapshot(self) -> Baseline:
        own = os.environ.get("PYTHONPATH", "")
        own_entries = {os.path.abspath(p) for p in own.split(os.pathsep) if p}
        path = [p for p in sys.path[1:] if os.path.abspath(p) not in own_entries]
        return Baseline(
            modules=set(sys.modules),
            packages={n.split(".")[0] for n in sys.modules},
            environ=dict(os.environ),
            cwd=os.getcwd(),
            argv=list(sys.argv),
            path=path,
            signals=_signals(),
            threads={t.ident for t in threading.enumerate() if t.ident is not None},
            atexit_count=atexit._ncallbacks(),
            recursion_limit=sys.getrecursionlimit(),
            umask=_umask(),
            warnings_filters=list(warnings.filters),
            log_handlers=list(logging.root.handlers),
            log_level=logging.root.level,
            device_bytes=_device_bytes(),
            excepthook=sys.excepthook,
            displayhook=sys.displayhook,
        )

    # The job loop.
    def serve(self) -> int:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.args.listen)
        listener.bind(self.args.listen)
        os.chmod(self.args.listen, 0o600)
        listener.listen(4)
        daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        daemon.connect(self.args.socket)
        ctl = daemon.makefile("rwb")

        def tell(msg: dict[str, Any]) -> None:
            ctl.write(wire.encode(msg))
            ctl.flush()

        tell(
            {
                "op": "worker_ready",
                "worker": self.args.worker,
                "secret": os.environ.get("KREX_WORKER_SECRET", ""),
                "pid": os.getpid(),
            }
        )
        while True:
            line = ctl.readline(wire.MAX_LINE + 1)
            if not line:
                return 0  # the daemon is gone or let us go
            msg = wire.decode(line, request=False)  # the daemon's messages carry no version
            if msg.get("op") == "exit":
                return 0
            if msg.get("op") != "job":
                continue
            retire = self.one_job(listener, msg)
            tell({"op": "done", "retire": retire})
            if retire:
                return 0

    def one_job(self, listener: socket.socket, job: dict[str, Any]) -> str | None:
        """Run the leased job; returns why this worker must retire, or None."""
        listener.settimeout(JOB_ACCEPT_S)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            return None  # the client never came: still clean
        with conn:
            conn.settimeout(None)
            try:
                msg, fds = wire.recv_frame(conn, max_fds=3)
            except (OSError, ProtocolError) as e:
                return f"a bad job message: {e}"
            if msg is None or msg.get("token") != job.get("token") or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                why = "no job" if msg is None else "no stdio" if len(fds) != 3 else "wrong token"
                print(f"krex worker {self.args.worker}: refused a client ({why})", file=sys.stderr)
                return None
            inv = Invocation(**msg["invocation"])
            env = {str(k): str(v) for k, v in msg["env"].items()}
            ended = threading.Event()
            watcher = threading.Thread(target=_watch_client, args=(conn, ended), daemon=True)
            status, retire = self.run_command(inv, str(msg["cwd"]), env, fds, watcher)
            ended.set()
            with contextlib.suppress(OSError):
                wire.send_frame(conn, {"status": status})
                conn.shutdown(socket.SHUT_RDWR)
            watcher.join(5.0)
        return retire or self.reset()

    # One command.
    def run_command(
        self,
        inv: Invocation,
        cwd: str,
        env: dict[str, str],
        fds: list[int],
        watcher: threading.Thread,
    ) -> tuple[int, str | None]:
        """Run inv as __main__ with the client's stdio; returns (exit status, retire reason)."""
        saved = [os.dup(i) for i in (0, 1, 2)]
        old_streams = (sys.stdin, sys.stdout, sys.stderr)
        old_dunder = (sys.__stdin__, sys.__stdout__, sys.__stderr__)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        unbuffered = inv.unbuffered or bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin, sys.stdout, sys.stderr = _stdio(unbuffered)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
        retire: str | None = None
        try:
            self.enter(inv, cwd, env)
            watcher.start()
            status = _execute(inv)
            _join_new_threads(self.baseline.threads | {watcher.ident or 0})
            if atexit._ncallbacks() > self.baseline.atexit_count:
                # As at interpreter exit; the worker's own handlers run too, so it retires.
                atexit._run_exitfuncs()
                retire = "the command registered atexit handlers"
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    status = status or 120  # CPython's status when flushing stdout fails
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            sys.stdin, sys.stdout, sys.stderr = old_streams
            sys.__stdin__, sys.__stdout__, sys.__stderr__ = old_dunder  # type: ignore[misc]
            for i, fd in enumerate(saved):
                os.dup2(fd, i)
                os.close(fd)
        return status, retire

    def enter(self, inv: Invocation, cwd: str, env: dict[str, str]) -> None:
        """The state a fresh interpreter would give the command."""
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if inv.kind == "script":
            first = os.path.dirname(os.path.realpath(inv.target))
        elif inv.kind == "module":
            first = os.getcwd()
        else:
            first = ""
        sys.path[:] = [first, *extra, *self.baseline.path]
        sys.argv[:] = [inv.argv0(), *inv.args]
        sys.dont_write_bytecode = inv.dont_write_bytecode or bool(
            env.get("PYTHONDONTWRITEBYTECODE")
        )
        _set_warning_filters(self.baseline.warnings_filters)
        for opt in inv.warnings:
            warnings._setoption(opt)  # type: ignore[attr-defined]
        importlib.invalidate_caches()
        linecache.clearcache()
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        torch = _torch()
        if torch is not None:
            torch.manual_seed(_TORCH_DEFAULT_SEED)

    def reset(self) -> str | None:
        """Undo what the last command changed; returns why the worker must retire, or None."""
        b = self.baseline
        why: str | None = None
        # New modules go, except the standard library's (kept, as if preloaded) and new
        # submodules of packages loaded before the command (their parents refer to them).
        # krex's own do go: they hold per-process state (krex.markers reads the tenant once).
        keep = b.packages | set(sys.stdlib_module_names)
        drop = [
            n
            for n in set(sys.modules) - b.modules
            if n.split(".")[0] not in keep or (n.startswith("krex.") and n != "krex.worker")
        ]
        native = sorted(
            n
            for n in drop
            if str(getattr(sys.modules[n], "__file__", "") or "").endswith(_NATIVE_SUFFIXES)
        )
        self.left_loaded += sum(n in _LEFT_LOADED for n in native)
        native = [n for n in native if n not in _LEFT_LOADED]
        if native:
            why = f"the command imported native code ({native[0]}), which cannot be unloaded"
        elif self.left_loaded > _MAX_LEFT_LOADED:
            why = f"{self.left_loaded} Triton launchers loaded by past commands"
        for name in drop:
            module = sys.modules.pop(name)
            parent, _, attr = name.rpartition(".")
            if parent in sys.modules and getattr(sys.modules[parent], attr, None) is module:
                delattr(sys.modules[parent], attr)  # the next import binds the fresh one
        krex_package = sys.modules["krex"]
        for attr in krex_package._MARKERS:  # re-exported from krex.markers on first use
            krex_package.__dict__.pop(attr, None)
        os.chdir(b.cwd)
        os.environ.clear()
        os.environ.update(b.environ)
        sys.path[:] = [self.own_path0, *b.path]
        sys.argv[:] = b.argv
        sys.dont_write_bytecode = False
        sys.excepthook, sys.displayhook = b.excepthook, b.displayhook
        sys.setrecursionlimit(b.recursion_limit)
        os.umask(b.umask)
        _set_warning_filters(b.warnings_filters)
        logging.root.handlers[:] = b.log_handlers
        logging.root.setLevel(b.log_level)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in b.signals.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                if handler is not None and signal.getsignal(s) != handler:
                    signal.signal(s, handler)
        for get, put, value in self.flags:
            with contextlib.suppress(Exception):
                if get() != value:
                    put(value)
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            with contextlib.suppress(Exception):
                dynamo.reset()
        left = [t.name for t in threading.enumerate() if t.ident not in b.threads and t.is_alive()]
        if left and why is None:
            why = f"the command left {len(left)} thread(s) running ({left[0]})"
        if why is None and children():
            why = "the command left child processes running"
        device = _device_bytes()
        grown = None if device is None or b.device_bytes is None else device - b.device_bytes
        if why is None and grown is not None and grown > 0:
            why = f"device memory above the warm baseline (+{grown} bytes)"
        return why


def _hold_context() -> Any:
    """Retain the GPU's primary context (the one the CUDA runtime and frameworks share), make it
    current, and make one call the shim gates (a 4-byte memset), so that the shim registers
    this process's slot before the daemon looks for it. Returns the context, kept for the
    worker's life.

    Through cuda-python's driver bindings (the `cuda` extra) where installed, on a real GPU;
    else through ctypes. The ctypes path is the fallback for two cases: no cuda-python (it is
    optional), and the simulated GPU, whose libcuda.so.1 (shim/sim/) the tests run against
    without cuda-python (not a test dependency), so that only the path they exercise runs there.
    Either way the calls go through the preloaded shim like any tenant's.
    """
    if not os.environ.get("KREX_SIM_SHM"):  # set by the daemon for tenants of the simulated GPU
        try:
            driver = importlib.import_module("cuda.bindings.driver")
        except ImportError:
            pass
        else:
            return _hold_context_cuda_python(driver)
    return _hold_context_ctypes()


def _hold_context_cuda_python(cu: Any) -> Any:
    def ok(ret: Any, what: str) -> Any:
        err = ret[0]
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what} failed ({err.name})")
        return ret[1] if len(ret) == 2 else None

    ok(cu.cuInit(0), "cuInit")
    dev = ok(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev), "cannot create a context on the GPU: retaining it")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ok(cu.cuMemAlloc(4), "the first driver calls: cuMemAlloc")
    ok(cu.cuMemsetD8(ptr, 0, 4), "the first driver calls: cuMemsetD8")
    ok(cu.cuCtxSynchronize(), "the first driver calls: cuCtxSynchronize")
    ok(cu.cuMemFree(ptr), "the first driver calls: cuMemFree")
    return ctx


def _hold_context_ctypes() -> Any:
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for rc in (
        cu.cuInit(0),
        cu.cuDeviceGet(ctypes.byref(dev), 0),
        cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
        cu.cuCtxSetCurrent(ctx),
    ):
        if rc != 0:
            raise RuntimeError(f"cannot create a context on the GPU (CUresult {rc})")
    ptr = ctypes.c_uint64()
    for rc in (
        cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4)),
        cu.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0), ctypes.c_size_t(4)),
        cu.cuCtxSynchronize(),
        cu.cuMemFree_v2(ptr),
    ):
        if rc != 0:
            raise RuntimeError(f"the first driver calls failed (CUresult {rc})")
    return ctx


def _set_warning_filters(filters: list[Any]) -> None:
    current: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
    current[:] = filters
    mutated = getattr(warnings, "_filters_mutated", None) or getattr(
        warnings, "_filters_mutated_lock_held", None
    )
    if mutated is not None:  # the warnings module caches its filters' version
        mutated()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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


def _watch_client(conn: socket.socket, ended: threading.Event) -> None:
    """Signals the client forwards reach the command; a vanished client ends it (and us)."""
    while True:
        try:
            msg, _ = wire.recv_frame(conn)
        except (OSError, ProtocolError):
            msg = None
        if ended.is_set():
            return
        if msg is None:
            # `krex run` is gone: like a cold command (PR_SET_PDEATHSIG), this one dies with it.
            os.kill(os.getpid(), signal.SIGKILL)
            return
        n = msg.get("signal")
        if wire.is_int(n):
            main = threading.main_thread().ident
            with contextlib.suppress(OSError, ValueError):
                # To the main thread, so that a blocking call there is interrupted and a Python
                # handler runs at once (SIGINT: KeyboardInterrupt); a default action ends the
                # process, as it would have ended the command.
                signal.pthread_kill(main, n) if main is not None else signal.raise_signal(n)


def _execute(inv: Invocation) -> int:
    """Run the command as __main__; its exit status as CPython would give it."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    old_main = sys.modules["__main__"]
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
    finally:
        sys.modules["__main__"] = old_main


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


def _join_new_threads(known: set[int]) -> None:
    """Like interpreter shutdown: wait for the non-daemon threads the command started."""
    for t in threading.enumerate():
        if t.ident not in known and not t.daemon and t is not threading.current_thread():
            t.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m krex.worker")
    ap.add_argument("--socket", required=True, help="the daemon's socket")
    ap.add_argument("--listen", required=True, help="this worker's socket for its clients")
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--preload", default="", help="comma-separated modules to import")
    args = ap.parse_args(argv)
    args.preload = [m for m in args.preload.split(",") if m]
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        worker = Worker(args)
    except Exception as e:
        print(f"krex worker {args.worker}: warm-up failed: {e}", file=sys.stderr)
        return 3
    try:
        return worker.serve()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.listen)


if __name__ == "__main__":
    sys.exit(main())
