"""`krex run` and `krex status`: the client side of docs/protocol.md.

`krex run -- CMD` asks the daemon for a slot (starting the per-user daemon if none answers),
forks CMD held before exec until the daemon has put it in the tenant's group and on its GPU's
shared cores, then execs it with the tenant's environment. CMD's stdin, stdout, stderr and exit
status are its own (killed by signal N: 128+N); signals sent to `krex run` once it is admitted
are forwarded to it, whenever they come (a terminal's Ctrl-C reaches CMD directly, once).
Exit statuses of krex itself: 125 (krex could not do its part), 127 (CMD could not start).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krex.client.leftovers import reclaim
from krex.client.watch import DaemonWatch, answers
from krex.core import messages, wire
from krex.core.build import describe, identity, mismatch, older
from krex.core.config import default_socket, load
from krex.core.errors import KrexError, ProtocolError
from krex.core.trust import TrustError, check_daemon, check_env, open_beside
from krex.pool.plan import Invocation, ProcState, ignored_signals, plan
from krex.tenant.autoregions import DEFAULT_AUTO_REGIONS, unresolved
from krex.tenant.autoregions import LOG_VAR as AUTO_LOG_VAR

EXIT_KREX = 125
EXIT_NOT_STARTED = 127
GONE_WAIT_S = 0.5  # how long a command the daemon could not place may take to be reaped
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Signals meant for the command: held (blocked) in `krex run` from its admission until its
# report is written, so that none is lost before the command can take it, and none that
# arrives as the command ends kills `krex run` before its report.
HELD = frozenset({signal.SIGINT, *FORWARDED})
# The signals our caller had us ignore, read before we change any disposition: a command
# inherits them ignored, cold or warm (docs/pool.md).
CALLER_IGNORED = frozenset(ignored_signals())
_SI_KERNEL = 0x80  # siginfo.si_code of a signal the kernel sent (a terminal's Ctrl-C, hang-up)


class ClientError(KrexError):
    """krex could not do its part; the message is for the user."""


class Connection:
    """One conversation with the daemon: JSON lines over its unix socket."""

    def __init__(self, path: Path, timeout_s: float | None = 10.0) -> None:
        self.path = path
        self.sock = _connect(path, timeout_s)
        try:
            check_daemon(self.sock, path)  # never talk to someone else's listener
        except TrustError as e:
            self.sock.close()
            raise ClientError(str(e)) from e
        self.file = self.sock.makefile("rwb")
        self.watch: DaemonWatch | None = None  # while a command runs (krex/client/watch.py)
        # How long a tenant's `started` and `finished` may take: the admission's `step_s`.
        self.step_s = 10.0

    def send(self, msg: dict[str, Any]) -> None:
        """Send one request. A daemon that refused the connection before reading it (too many
        open) may have closed it mid-send: its one error line, when there, is the error."""
        try:
            self.file.write(wire.encode(msg))
            self.file.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.sock.settimeout(1.0)
            with contextlib.suppress(OSError, ProtocolError):
                reply = wire.decode(self.file.readline(), request=False, limit=None)
                if not reply.get("ok") and reply.get("error"):
                    raise ClientError(str(reply["error"])) from None
            raise

    def recv(self, timeout_s: float | None = 10.0) -> dict[str, Any]:
        self.sock.settimeout(timeout_s)
        try:
            line = self.file.readline()
        except TimeoutError as e:
            raise ClientError(f"the daemon at {self.path} did not answer in time") from e
        if not line:
            raise ClientError(f"the daemon at {self.path} closed the connection")
        try:
            msg = wire.decode(line, request=False, limit=None)  # a report lists every region
        except ProtocolError as e:
            raise ClientError(f"the daemon at {self.path} sent a bad reply: {e}") from e
        if not msg.get("ok"):
            raise ClientError(str(msg.get("error", "the daemon refused")))
        return dict(msg)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        with contextlib.suppress(OSError):
            self.file.close()
            self.sock.close()


def _connect(path: Path, timeout_s: float | None) -> socket.socket:
    """A connection to the socket at path; tried again while its backlog is full (EAGAIN: a
    burst of connections the daemon has yet to take), for up to timeout_s (10 s if None)."""
    deadline = time.monotonic() + (timeout_s or 10.0)
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            return sock
        except BlockingIOError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
        except BaseException:
            sock.close()
            raise


def socket_for(sim: bool, explicit: str | None) -> Path:
    """--socket, else $KREX_SOCKET, else the configured socket, else the per-user default."""
    if explicit:
        return Path(explicit)
    if os.environ.get("KREX_SOCKET"):
        return Path(os.environ["KREX_SOCKET"])
    cfg = load()
    if cfg.socket is not None and cfg.sim == sim:
        return cfg.socket
    return default_socket(sim)


def connect(path: Path, *, sim: bool, start: bool) -> Connection:
    """Connect to the daemon, starting the per-user one (once, under a lock) when none answers."""
    try:
        return Connection(path)
    except (FileNotFoundError, ConnectionRefusedError) as e:
        if not start:
            raise ClientError(f"no krex daemon answers at {path}") from e
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = path.parent / (path.stem + ".log")
    try:
        # Beside a socket that may be in a shared directory: never through a planted link.
        lock = open_beside(str(path) + ".lock", os.O_RDWR | os.O_CREAT)
    except TrustError as e:
        raise ClientError(f"cannot start a daemon at {path}: {e}") from None
    try:
        # Two `krex run` started at once: one starts the daemon, the other waits here and
        # then finds it answering.
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
            return Connection(path)
        cmd = [sys.executable, "-m", "krex.cli", "daemon", "--socket", str(path.absolute())]
        if sim:
            cmd.append("--sim")
        try:
            log_fd = open_beside(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except TrustError as e:
            raise ClientError(f"cannot start a daemon at {path}: its log {e}") from None
        with os.fdopen(log_fd, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                close_fds=True,
                **_daemon_place(),
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
                return Connection(path)
            if proc.poll() is not None:
                tail = _read_beside(log_path).strip().splitlines()[-1:] or [""]
                why = tail[0].split(" ERROR ", 1)[-1]  # the daemon's message, not its log prefix
                raise ClientError(f"the krex daemon did not start: {why} (log: {log_path})")
            time.sleep(0.05)
        raise ClientError(f"the krex daemon did not answer at {path} within 20 s")
    finally:
        os.close(lock)


def _read_beside(path: Path) -> str:
    """A log krex wrote beside a socket or in a directory someone chose (open_beside: not
    through a link); empty when it cannot be read so."""
    try:
        with os.fdopen(open_beside(path, os.O_RDONLY), "rb") as f:
            return f.read().decode(errors="replace")
    except (OSError, TrustError):
        return ""


def _daemon_place() -> dict[str, Any]:
    """Where a daemon krex starts runs: in /, so that `python -m` puts no directory of the
    user's first on sys.path (a source checkout's krex/ would shadow the installed one), with
    $KREX_CONFIG made absolute to match."""
    env = dict(os.environ)
    if env.get("KREX_CONFIG"):
        env["KREX_CONFIG"] = os.path.abspath(env["KREX_CONFIG"])
    return {"cwd": "/", "env": env}


@dataclass
class RunOptions:
    argv: list[str]
    gpu: int | list[int] | None = None  # which GPU(s); None: the least loaded
    gpus: int | None = None  # how many (a command of several GPUs holds all in its regions)
    report: Path | None = None
    auto_regions: str | None = None
    region_timeout_s: float | None = None
    settle_s: float | None = None  # its regions' settle (None: the daemon's regions.settle_s)
    capped_settle_s: float | None = None  # once power-capped (None: regions.capped_settle_s)
    mem_bytes: int = 0  # declared device memory (krex run --mem), 0: none
    mem_alone: bool = False  # admitted only with the GPU's memory to itself (a memory retry)
    mem_rerun: int = 0  # a first memory rerun: its failed run's peak (bytes)
    no_memory_retry: bool = False
    mem_attempt: int = 0  # the attempts before this one (krex run's memory retries)
    sim: bool = False
    socket: str | None = None
    queue_timeout_s: float = 3600.0
    no_pool: bool = False


def _spawn_held(argv: list[str], env: dict[str, str], mask: set[int]) -> tuple[int, int, int]:
    """Fork argv held before exec. Returns (pid, go_fd, err_fd): a byte on go_fd lets it exec;
    err_fd yields the reason if exec fails, or EOF once it succeeded. The child execs with
    signal mask `mask` (krex run's own before it held signals): a signal forwarded to it
    before then waits, and acts (with its default action) just before the exec."""
    parent = os.getpid()
    go_r, go_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: nothing here may raise past os._exit
        try:
            os.close(go_w)
            os.close(err_r)
            # The command dies with `krex run`: a command whose client is gone has lost its
            # slot and must not run on unsupervised.
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent or not os.read(go_r, 1):
                os._exit(EXIT_KREX)  # krex run died before letting it start
            os.close(go_r)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, *FORWARDED):
                # What our caller ignored (nohup's SIGHUP) stays ignored, as natively.
                signal.signal(sig, signal.SIG_IGN if sig in CALLER_IGNORED else signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            os.write(err_w, f"{e.strerror or e}".encode())
        finally:
            os._exit(EXIT_NOT_STARTED)
    os.close(go_r)
    os.close(err_w)
    return pid, go_w, err_r


def _stdio_fds() -> list[int]:
    """Our stdin, stdout and stderr for the worker (/dev/null in place of a closed one)."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


_REAPED_S = 2.0  # a warm child that ended: its fork server reaps it and says how within this


class WarmRefused(KrexError):
    """The fork server did not start the command (it then runs cold, saying why)."""


@dataclass
class WarmEnd:
    """How a warm command ended: its status (None: unknown, the daemon knows), whether the
    command reported it itself (its own work done; else it died without a word: a signal,
    os._exit, a crash, and what it left is ended at once), and why it started a fresh
    interpreter after all ("": it ran warm)."""

    status: int | None
    reported: bool
    cold: str


def _run_warm(
    lease: dict[str, Any], inv: Invocation, argv: list[str], env: dict[str, str], conn: Connection
) -> WarmEnd:
    """Hand the command to its fork server, have the daemon place the child it forks, let it
    go and wait, forwarding each signal sent to us. WarmRefused when no child started it."""
    # What a cold command would inherit from us (docs/pool.md): the signal mask as it was before
    # we held the command's signals.
    state = dataclasses.replace(
        ProcState.capture(), sigmask=sorted(_mask or ()), sigign=sorted(CALLER_IGNORED)
    )
    with tempfile.TemporaryDirectory(prefix="krex-run-") as d:
        # Where the child reports (a connection of its own at that moment: while the command
        # runs it holds no descriptor of krex's, and a dead fork server loses nothing).
        reports = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with reports:
            reports.bind(os.path.join(d, "report"))
            reports.listen(4)
            sock, pid = _hand_over(lease, inv, argv, env, state, reports)
            try:
                conn.send(messages.Started(pid, warm=True).to_wire())
                conn.recv(conn.step_s)
            except (ClientError, OSError) as e:
                with contextlib.suppress(OSError):
                    wire.send_frame(sock, {"go": False})
                sock.close()
                raise WarmRefused(f"the daemon could not take the warm command in: {e}") from e
            return _let_go(sock, reports, pid)


def _hand_over(
    lease: dict[str, Any],
    inv: Invocation,
    argv: list[str],
    env: dict[str, str],
    state: ProcState,
    reports: socket.socket,
) -> tuple[socket.socket, int]:
    """The command to its fork server: the connection to it and the pid of the child it
    forked (held until its go). WarmRefused when it forked none."""
    try:
        sock = _connect(Path(lease["socket"]), 30)
    except OSError as e:
        raise WarmRefused(f"the warm worker could not take the command: {e}") from e
    try:
        check_daemon(sock, Path(lease["socket"]))  # the command's env and stdio go there
        job = {
            "token": lease["token"],
            "invocation": dataclasses.asdict(inv),
            "argv": argv,
            "cwd": os.getcwd(),
            "env": env,
            "state": dataclasses.asdict(state),
            "report": reports.getsockname(),
        }
        wire.send_frame(sock, job, [*_stdio_fds(), *state.fds])
        msg, _ = wire.recv_frame(sock)
    except (OSError, ProtocolError, TrustError) as e:
        sock.close()
        raise WarmRefused(f"the warm worker could not take the command: {e}") from e
    pid = msg.get("pid") if msg is not None else None
    if not wire.is_int(pid):
        sock.close()
        why = msg.get("refused") if msg is not None else None
        raise WarmRefused(
            f"a warm worker cannot run it: {why}" if why else "the warm worker refused it"
        )
    return sock, pid


def _let_go(sock: socket.socket, reports: socket.socket, pid: int) -> WarmEnd:
    """Let the warm child `pid` go and wait for its end, forwarding each signal sent to us."""
    try:
        child = os.pidfd_open(pid)  # its exit too, not only its reports
    except OSError:
        child = None
    cold, status, reported = "", None, False
    try:
        wire.send_frame(sock, {"go": True})
        sock.settimeout(None)
        # The child is in a session of its own: every signal meant for the command, Ctrl-C
        # too, reaches it through us (held since admission: none is lost).
        waited = [sock.fileno(), reports.fileno(), *([child] if child is not None else [])]
        until = None  # once it has ended: how long its reports may take to come
        while status is None:
            ready, _, _ = select.select(waited, [], [], 0.05)
            for n in _take_pending():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, n)
            for fd in ready:
                msg = _warm_message(fd, sock, reports, pid)
                if fd == sock.fileno() and msg is None:
                    waited.remove(fd)  # its fork server is done with it, or gone
                elif msg is not None and isinstance(msg.get("cold"), str):
                    cold = msg["cold"]  # a fresh interpreter in its place: it goes on
                elif msg is not None and wire.is_int(msg.get("status")):
                    status, reported = int(msg["status"]), fd == reports.fileno()
                elif child is not None and fd == child:
                    waited.remove(child)  # ended without a word (a signal, os._exit, a
                    until = time.monotonic() + _REAPED_S  # crash): its server says how
            if until is not None and time.monotonic() > until:
                break
    except (OSError, ProtocolError):
        pass
    finally:
        if reported:  # the command is over: its teardown is not ours to cut short
            with contextlib.suppress(OSError):
                wire.send_frame(sock, {"done": True})
        sock.close()
        if child is not None:
            os.close(child)
    return WarmEnd(status, reported, cold)


def _warm_message(
    fd: int, sock: socket.socket, reports: socket.socket, pid: int
) -> dict[str, Any] | None:
    """What a ready descriptor of a warm run says: its fork server's message (None at EOF),
    or the child's report (from the child alone: its pid is checked)."""
    if fd == sock.fileno():
        msg, _ = wire.recv_frame(sock)
        return msg
    if fd != reports.fileno():
        return None
    peer, _ = reports.accept()
    with peer:
        creds = peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[0] != pid:
            return None
        peer.settimeout(5)
        msg, _ = wire.recv_frame(peer)
        return msg


def _wait(pid: int, flags: int = 0) -> int | None:
    """pid's exit status (128+N: killed by signal N); None with os.WNOHANG while it runs."""
    while True:
        try:
            done, status = os.waitpid(pid, flags)
        except ChildProcessError:
            return EXIT_KREX
        if done == 0:
            return None
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)


_mask: set[int] | None = None  # krex run's signal mask before it held HELD (None: not held)


def _hold_signals() -> None:
    """From here on, signals sent to `krex run` are the command's: block them (and SIGCHLD,
    which _supervise waits for) until _release_signals."""
    global _mask
    if _mask is None:
        _mask = signal.pthread_sigmask(signal.SIG_BLOCK, {*HELD, signal.SIGCHLD})


def _take_pending() -> list[int]:
    """The held signals pending now, taken (each once)."""
    assert _mask is not None
    taken = []
    while (info := signal.sigtimedwait(HELD - _mask, 0)) is not None:
        taken.append(info.si_signo)
    return taken


def _release_signals(final: bool = False) -> None:
    """The command has ended: drop what was held for it, and unblock; `final`: krex run ends
    now, so they stay blocked (and are dropped) until it has: a signal meant for the command
    that comes after it was reaped (`timeout` sends SIGTERM to krex run, then to its whole
    group) would otherwise kill krex run before it reports (-15 instead of 143)."""
    global _mask
    if _mask is None:
        return
    _take_pending()
    if signal.SIGCHLD not in _mask:
        signal.sigtimedwait({signal.SIGCHLD}, 0)
    if final:
        return
    signal.pthread_sigmask(signal.SIG_SETMASK, _mask)
    _mask = None


def _supervise(pid: int) -> int:
    """Wait for the command, forwarding to it each signal sent to `krex run` (held since
    admission). Not the kernel's: a terminal sends Ctrl-C, Ctrl-\\ and hang-ups to its whole
    foreground process group, the command's too, which must not get them twice."""
    while True:
        code = _wait(pid, os.WNOHANG)
        if code is not None:
            return code
        info = signal.sigwaitinfo({*HELD, signal.SIGCHLD})
        if info.si_signo == signal.SIGCHLD or info.si_code == _SI_KERNEL:
            continue
        with contextlib.suppress(ProcessLookupError):  # it has just exited
            os.kill(pid, info.si_signo)


def _report_target(path: Path) -> tuple[Path, bool]:
    """Where the report goes, and whether whole or not at all (a temporary file beside it,
    renamed over it): so for a new or regular file in a directory krex run can write to.
    Otherwise in place: a device or pipe, a file krex run has open (`--report /dev/stdout`),
    or an existing file in a directory it cannot write to. ValueError: why it cannot be
    written at all."""
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ValueError(e.strerror or str(e)) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ValueError("is a directory")
    if st is not None and (stat.S_ISSOCK(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        kind = "a socket" if stat.S_ISSOCK(st.st_mode) else "a block device"
        raise ValueError(f"is {kind}: a report goes to a file, a pipe or a terminal")
    if st is not None and (not stat.S_ISREG(st.st_mode) or _open_here(st)):
        # Renaming over (or truncating) a file krex run has open, `--report /dev/stdout >
        # out.txt`, would lose what the command wrote to it: _write_report appends.
        if not os.access(path, os.W_OK):
            raise ValueError("cannot be written to")
        return path, False
    target = Path(os.path.realpath(path))  # a symlink's target is replaced, not the symlink
    if not target.parent.is_dir():
        raise ValueError(f"{target.parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        if st is not None and os.access(path, os.W_OK):
            return path, False
        raise ValueError(f"cannot create a file in {target.parent} ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    return target, True


# How long a report written in place (a FIFO, a terminal) waits for a reader to open it and
# take it; SIGTERM, SIGINT, SIGHUP or SIGQUIT end the wait at once.
REPORT_WAIT_S = 10.0
_ENDING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


class _ReportAbandoned(KrexError, OSError):
    """Nobody took the report in time, or a signal asked krex run to end while it waited."""


def _write_in_place(target: Path, data: bytes, *, append: bool) -> None:
    """Write the report into target as it is (a device, a pipe, a file krex run has open)
    without blocking: a FIFO nobody opens for reading, or a reader that stops reading, is given
    up after REPORT_WAIT_S, and at once when a signal that ends krex run comes (they are held
    at this point: the command's, sent after it ended)."""
    deadline = time.monotonic() + REPORT_WAIT_S
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    while True:
        try:
            fd = os.open(target, flags)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: a FIFO with no reader (yet)
                raise
        _pause(deadline, "nobody opened it for reading")
    try:
        while data:
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                _pause(deadline, "nobody read it", fd)
    finally:
        os.close(fd)


def _pause(deadline: float, why: str, fd: int | None = None) -> None:
    """Wait a little (for fd to take more, when given); _ReportAbandoned once the deadline has
    passed, or when a signal that ends krex run comes."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _ReportAbandoned(errno.ETIMEDOUT, f"{why} within {REPORT_WAIT_S:g} s")
    step = min(0.1, left)
    ending = _ENDING - (_mask or set()) if _mask is not None else set()
    if ending:
        info = signal.sigtimedwait(ending, 0)
        if info is not None:
            raise _ReportAbandoned(
                errno.EINTR, f"{why}, and {signal.Signals(info.si_signo).name} came"
            )
    if fd is not None:
        select.select([], [fd], [], step)
    elif ending:
        info = signal.sigtimedwait(ending, step)
        if info is not None:
            raise _ReportAbandoned(
                errno.EINTR, f"{why}, and {signal.Signals(info.si_signo).name} came"
            )
    else:
        time.sleep(step)


def _open_here(st: os.stat_result) -> bool:
    """Whether this process has the file open (its stdout, or a /dev/fd/N)."""
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                mine = os.fstat(int(fd))
                if (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino):
                    return True
    return False


def _write_report(path: Path, report: dict[str, Any]) -> None:
    """Write the report (see _report_target): a full disk leaves the previous file, or none,
    never a truncated one, wherever a temporary file can be renamed over it."""
    text = json.dumps(report, indent=2) + "\n"
    tmp: str | None = None
    try:
        target, whole = _report_target(path)
        if not whole:
            _write_in_place(target, text.encode(), append=_open_here(os.stat(target)))
            return
        try:
            mode = os.stat(target).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # as open() makes it, not mkstemp's 0600
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(f"krex run: cannot write the report to {path}: {why}", file=sys.stderr)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


MEMORY_RETRIES = 3  # reruns of a command that sharing the GPU's memory ended or may have bent
KEY_FILE_MAX = 16 << 20  # files named on the command line hashed into its key (bytes at most)


def command_key(argv: list[str], cwd: str) -> str:
    """What identifies a command for the peak the daemon learns (docs/memory.md): its argv
    and the contents of the files it names (a script's text is what it runs: an agent's
    `python bench.py` is another command each time bench.py changes)."""
    h = hashlib.sha256()
    for arg in argv:
        raw = arg.encode("utf-8", "surrogateescape")
        h.update(len(raw).to_bytes(8, "little") + raw)
        path = Path(cwd, arg)
        with contextlib.suppress(OSError, ValueError):
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size <= KEY_FILE_MAX:
                h.update(b"file" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:32]


def command_family(argv: list[str], cwd: str) -> str:
    """What a command is whatever its files hold (docs/memory.md): its argv and directory. An
    agent that rewrites bench.py and runs `python bench.py` again runs another command of the
    same family; the family's last peak is the daemon's guess for it."""
    h = hashlib.sha256(b"family")
    for part in (cwd, *argv):
        raw = part.encode("utf-8", "surrogateescape")
        h.update(len(raw).to_bytes(8, "little") + raw)
    return h.hexdigest()[:32]


def run(opts: RunOptions) -> int:
    """`krex run`: the command's exit status, or 125/127 (module docstring).

    A command that sharing the GPU's memory ended or may have bent runs again from the start
    (docs/memory.md), at most MEMORY_RETRIES times, each attempt's report kept under the last
    one's `attempts`: one the daemon preempted to break a memory deadlock, once its memory fits
    (a second preemption: with the GPU's memory to itself); one that an out-of-memory error
    only sharing caused reached (its report's `memory.oom_shared`: it may have gone down a
    slower path, whatever its exit status), with the GPU's memory to itself; one whose region
    the daemon revoked while its owner waited for memory its frozen siblings held (its report's
    `memory.revoked_regions`: what it timed there ran unprotected), as a preempted one."""
    if opts.report is not None:
        try:
            _report_target(opts.report)
        except ValueError as e:
            print(f"krex run: --report {opts.report}: {e}", file=sys.stderr)
            return EXIT_KREX
    try:
        return _run(opts)
    finally:
        _release_signals(final=True)


def _again(report: dict[str, Any], attempts: list[dict[str, Any]]) -> tuple[str, bool] | None:
    """Why this attempt runs again and whether alone, or None."""
    preempted = report.get("preempted")
    shared = (report.get("memory") or {}).get("oom_shared", 0)
    if isinstance(preempted, dict):
        twice = any(isinstance(a.get("preempted"), dict) for a in attempts)
        return f"was preempted to break a memory deadlock ({preempted.get('why', '')})", twice
    if shared:
        return f"got {shared} out-of-memory error(s) only sharing caused", True
    revoked = (report.get("memory") or {}).get("revoked_regions", 0)
    if wire.is_int(revoked) and revoked > 0:
        # What it timed there was not what it would time alone; a second time, alone.
        twice = any((a.get("memory") or {}).get("revoked_regions") for a in attempts)
        return (
            f"had {revoked} region(s) revoked while it waited for device memory its frozen "
            "siblings held",
            twice,
        )
    return None


def _retries(opts: RunOptions) -> bool:
    """Whether this attempt, preempted or revoked for memory, would be run again."""
    return not (opts.no_memory_retry or opts.mem_alone or opts.mem_attempt >= MEMORY_RETRIES)


def _run(opts: RunOptions) -> int:
    attempts: list[dict[str, Any]] = []
    cwd = os.getcwd()
    key = (command_key(opts.argv, cwd), command_family(opts.argv, cwd))
    while True:
        code, report = _run_once(opts, key)
        again = None if opts.no_memory_retry else _again(report, attempts)
        if again is None or not _retries(opts):
            break
        why, alone = again
        how = "with the GPU's memory to itself" if alone else "once its memory fits"
        print(
            f"krex run: the command {why} (exit {code}); running it again from the start {how}",
            file=sys.stderr,
        )
        attempts.append(report)
        preempted = report.get("preempted") or {}
        need = preempted.get("need_bytes", 0) if isinstance(preempted, dict) else 0
        peak = (report.get("memory") or {}).get("peak_bytes", 0)
        need = max(int(need or 0) if wire.is_int(need) else 0, int(peak or 0))
        opts = dataclasses.replace(
            opts,
            mem_alone=alone,
            mem_rerun=0 if alone else max(1, need),
            mem_attempt=len(attempts),
        )
    if attempts:
        report["attempts"] = attempts
    report = _complete(report, opts, code)
    _say_unclean(report)
    if opts.report is not None:
        _write_report(opts.report, report)
    return code


def _complete(report: dict[str, Any], opts: RunOptions, code: int) -> dict[str, Any]:
    """The report with every key a report has, whatever ended krex run (docs/user-guide.md): what is
    unknown is null (an empty list of regions), and `error` says what happened."""
    base: dict[str, Any] = {
        "exit_code": code,
        "gpu": None,
        "gpus": [],
        "tenant": None,
        "wall_s": None,
        "queue_s": None,
        "argv": opts.argv,
        "pool": None,
        "pool_reason": None,
        "intercepted": None,
        "blocked": None,
        "regions": [],
        "memory": None,
    }
    return base | report


def _say_unclean(report: dict[str, Any]) -> None:
    """One line on stderr when a region of the command was not clean: its timing is not one
    to trust, and the report says why."""
    regions = [r for r in report.get("regions") or [] if isinstance(r, dict)]
    unclean = [r for r in regions if not r.get("clean", True)]
    if unclean:
        why = "; ".join(str(p) for p in (unclean[0].get("problems") or [])[:2]) or "no reason"
        print(
            f"krex run: {len(unclean)} of {len(regions)} region(s) of the command were not "
            f"clean (what ran in them may have been disturbed: {why})",
            file=sys.stderr,
        )


def _run_once(opts: RunOptions, key: tuple[str, str] = ("", "")) -> tuple[int, dict[str, Any]]:
    """One attempt: the exit status and the report ({} when krex could not do its part)."""
    _release_signals()  # an earlier attempt's command is over: Ctrl-C while queued ends us
    t0 = time.monotonic()
    try:
        path = socket_for(opts.sim, opts.socket)
        conn, reply = _admitted(path, opts, key)
        _hold_signals()
    except (KrexError, OSError) as e:  # ConfigError too: one line, exit 125 (user guide)
        print(f"krex run: {e}", file=sys.stderr)
        return EXIT_KREX, {"error": str(e)}
    except KeyboardInterrupt:  # Ctrl-C before the command started: nothing of it to report
        print("krex run: interrupted before the command started", file=sys.stderr)
        return 128 + signal.SIGINT, {"error": "interrupted before the command started"}
    try:
        # Only what a krex daemon sets, and libraries only we or root can change.
        extra = check_env(reply.get("env") or {}, path)
    except TrustError as e:
        print(f"krex run: {e}", file=sys.stderr)
        conn.close()
        return EXIT_KREX, {"error": str(e)}
    env = _command_env(opts, conn, reply, path, extra)
    pool = reply.get("pool") or {}
    how = plan(
        opts.argv,
        os.environ,
        pool.get("python"),
        pool.get("env", {}),
        no_pool=opts.no_pool,
        worker_locale=pool.get("locale"),
    )
    attempt = _Attempt(opts, conn, reply, t0, time.monotonic() - t0)
    if how.warm and how.invocation is not None:
        done = _try_warm(attempt, how.invocation, env, how.reason)
        if isinstance(done, tuple):
            return done
        how.reason = done
    return _run_cold(attempt, env, how.reason)


def _admitted(
    path: Path, opts: RunOptions, key: tuple[str, str]
) -> tuple[Connection, dict[str, Any]]:
    """The command admitted by the daemon at path (after waiting in its queue, at most
    --queue-timeout): the connection and the admission's reply."""
    conn = connect(path, sim=opts.sim, start=True)
    admit = messages.Admit(
        build=identity(),  # the daemon refuses another build (krex/core/build.py)
        argv=opts.argv,
        gpu=opts.gpu,
        gpus=opts.gpus,
        sim=opts.sim,
        auto_regions=opts.auto_regions,
        region_timeout_s=opts.region_timeout_s,
        settle_s=opts.settle_s,
        capped_settle_s=opts.capped_settle_s,
        mem_bytes=opts.mem_bytes,
        mem_alone=opts.mem_alone,
        mem_rerun=opts.mem_rerun,
        mem_key=key[0] or None,  # the command's, and its family's (command_family)
        mem_family=key[1] or None,
        mem_retry=_retries(opts),
    )
    conn.send(admit.to_wire())
    deadline = time.monotonic() + opts.queue_timeout_s
    reply = conn.recv()
    notice = _queue_notice(reply, opts.queue_timeout_s)
    try:
        while "queued" in reply:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                reply = conn.recv(timeout_s=left)
            except (TimeoutError, ClientError) as e:
                if time.monotonic() < deadline:
                    raise  # the daemon went quiet before our time was up: its own error
                raise ClientError(
                    f"no slot became free within --queue-timeout {opts.queue_timeout_s:g} s"
                ) from e
    finally:
        if notice is not None:
            notice.cancel()
    theirs = reply.get("build")
    why = mismatch(identity(), theirs if isinstance(theirs, dict) else older(reply), path)
    if why:  # a daemon that did not check (older): it admitted us, we go
        conn.close()
        raise ClientError(why)
    step = reply.get("step_s")
    if wire.is_number(step) and 0 < step < 3600:
        conn.step_s = float(step)
    return conn, reply


QUEUE_NOTICE_S = 10.0  # a command queued this long gets one line on stderr saying why


def _queue_notice(reply: dict[str, Any], timeout_s: float) -> threading.Timer | None:
    """For a queued command: one line on stderr if it is still queued QUEUE_NOTICE_S later,
    with the daemon's reason (a queue that lasts, say a ninth command on a fresh node whose
    memory admission holds it, is not silent until --queue-timeout)."""
    if "queued" not in reply:
        return None
    why = str(reply["why"])[:300] if isinstance(reply.get("why"), str) else "no reason given"
    gpu = reply.get("gpu")

    def say() -> None:
        print(
            f"krex run: queued on GPU {gpu} for {QUEUE_NOTICE_S:g} s ({why}); it waits up to "
            f"--queue-timeout {timeout_s:g} s",
            file=sys.stderr,
            flush=True,
        )

    timer = threading.Timer(QUEUE_NOTICE_S, say)
    timer.daemon = True
    timer.start()
    return timer


def _command_env(
    opts: RunOptions, conn: Connection, reply: dict[str, Any], path: Path, extra: dict[str, str]
) -> dict[str, str]:
    """The command's environment: ours with the daemon's variables `extra` (checked)."""
    env = dict(os.environ)
    if extra.get("KREX_SHM"):
        # Should the daemon die while the command runs, what it froze is thawed.
        conn.watch = DaemonWatch(conn.sock, path, extra["KREX_SHM"].lstrip("/")).start()
    for key in ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "PYTHONPATH"):
        if key in extra and env.get(key):
            extra[key] = f"{extra[key]}:{env[key]}"
    env.update(extra)
    if opts.auto_regions:
        env[AUTO_LOG_VAR] = str(_auto_log(reply))
    return env


@dataclass
class _Attempt:
    """One attempt at the command, admitted: its options, its connection to the daemon, the
    admission's reply and when the attempt began."""

    opts: RunOptions
    conn: Connection
    reply: dict[str, Any]
    t0: float
    queue_s: float  # from t0 to the admission: the wait for a slot and for admission's memory


def _try_warm(
    attempt: _Attempt, inv: Invocation, env: dict[str, str], reason: str
) -> tuple[int, dict[str, Any]] | str:
    """The command run by a warm worker (the exit status and the report), or why it runs
    cold after all (`reason`: why the plan chose warm)."""
    opts, conn = attempt.opts, attempt.conn
    try:
        conn.send(messages.Lease().to_wire())
        lease = conn.recv()
    except (ClientError, OSError) as e:
        print(f"krex run: {e}", file=sys.stderr)
        return EXIT_KREX, {"error": str(e)}
    if "socket" not in lease:
        return str(lease.get("cold", "no warm worker"))
    try:
        end = _run_warm(lease, inv, opts.argv, env, conn)
        lost = not end.reported  # the daemon ends what it left at once
        return _finish(attempt, end.status, lost, end.cold or reason, warm=not end.cold)
    except WarmRefused as e:
        return str(e)


def _run_cold(attempt: _Attempt, env: dict[str, str], reason: str) -> tuple[int, dict[str, Any]]:
    """The command forked and exec'd by us (held until the daemon placed it): the exit
    status and the report."""
    opts, conn = attempt.opts, attempt.conn
    assert _mask is not None
    pid, go, err = _spawn_held(opts.argv, env, _mask)
    # Signals that came before the fork never reached the command: forward them. The child
    # holds them blocked until its exec, so one that reached it too counts once.
    for n in _take_pending():
        os.kill(pid, n)
    try:
        conn.send(messages.Started(pid).to_wire())
        conn.recv(conn.step_s)
    except (ClientError, OSError) as e:
        return _not_taken_in(pid, e), {"error": f"the daemon could not take the command in: {e}"}
    with contextlib.suppress(BrokenPipeError):  # it died before its exec: its status says how
        os.write(go, b"g")
    os.close(go)
    why = os.read(err, 4096).decode(errors="replace")
    os.close(err)
    if why:
        print(f"krex run: cannot start {opts.argv[0]}: {why}", file=sys.stderr)
    code = _supervise(pid)
    return _finish(attempt, code, False, reason, warm=False)


def _not_taken_in(pid: int, e: Exception) -> int:
    """krex run's status when the daemon did not take the held command `pid` in (`e`): the
    command's own where it is dead already (killed before the daemon could place it: a kill
    aimed at it, or a signal forwarded before `started`; the daemon then finds no such
    process), else the command is killed and it is krex's failure."""
    code = _wait(pid, os.WNOHANG)
    until = time.monotonic() + GONE_WAIT_S  # one that is exiting is not a zombie yet
    while code is None and time.monotonic() < until:
        time.sleep(0.01)
        code = _wait(pid, os.WNOHANG)
    if code is not None:
        print(f"krex run: the command ended before it started ({e})", file=sys.stderr)
        return code
    os.kill(pid, signal.SIGKILL)
    _wait(pid)
    print(f"krex run: the daemon could not take the command in: {e}", file=sys.stderr)
    return EXIT_KREX


def _finish(
    attempt: _Attempt, code: int | None, worker_lost: bool, reason: str, *, warm: bool
) -> tuple[int, dict[str, Any]]:
    """Tell the daemon the command is over; the exit status and the report."""
    opts, conn, reply = attempt.opts, attempt.conn, attempt.reply
    wall = time.monotonic() - attempt.t0
    report: dict[str, Any] = {
        "exit_code": code,
        "gpu": reply["gpu"],
        "gpus": reply.get("gpus", [reply["gpu"]]),
        "tenant": reply["tenant"],
        "wall_s": wall,
        "queue_s": attempt.queue_s,
        "argv": opts.argv,
        "pool": "warm" if warm else "cold",
        "pool_reason": reason,
    }
    if conn.watch is not None:
        conn.watch.stop()  # the daemon closes this connection after its reply
    try:
        conn.send(messages.Finished(code, worker_lost).to_wire())
        done = conn.recv(conn.step_s)
        report.update(done["report"])
        rc = done.get("worker_status")
        if worker_lost and wire.is_int(rc):
            # How the worker ended is how the command ended (os._exit, a signal, a crash).
            code = rc if rc >= 0 else 128 - rc
    except (ClientError, OSError) as e:
        report["error"] = f"no report from the daemon: {e}"
        # It went away while the command ran: the segments it had to leave for the command's
        # processes go once none is left (krex/client/leftovers.py).
        reclaim(reply.get("env") or {})
    finally:
        conn.close()
    if code is None:
        code = EXIT_KREX
        report.setdefault("error", "the warm worker vanished and the daemon did not say how")
    report["exit_code"] = code
    _check_auto_regions(opts, reply, report)
    report["wall_s"] = wall
    return code, report


def _auto_log(reply: dict[str, Any]) -> Path:
    """Where the command's processes note the auto-region names they resolved."""
    return Path(tempfile.gettempdir()) / f"krex-auto-{os.getpid()}-{reply['tenant']}.jsonl"


def _check_auto_regions(opts: RunOptions, reply: dict[str, Any], report: dict[str, Any]) -> None:
    """Names given to --auto-regions that no process of the command ever found: a warning and
    the report's `auto_regions_unresolved` (a typo would otherwise protect nothing, silently).
    The default names are not checked: a program need not use every harness."""
    if not opts.auto_regions:
        return
    log = _auto_log(reply)
    names = [n for n in opts.auto_regions.split(",") if n]
    missing = [] if names == list(DEFAULT_AUTO_REGIONS) else unresolved(log, names)
    with contextlib.suppress(OSError):
        log.unlink()
    if missing:
        report["auto_regions_unresolved"] = missing
        for name in missing:
            print(
                f"krex run: --auto-regions {name} was never found in the command's processes: "
                "nothing was protected by it (a typo, or a module never imported)",
                file=sys.stderr,
            )


def _await_pool(sock: Path, deadline: float) -> None:
    """Wait until the daemon's warm workers are ready (none starting), so that a benchmark
    measures a warm pool, not its start-up; give up quietly at the deadline."""
    while time.monotonic() < deadline:
        try:
            conn = Connection(sock)
            try:
                conn.send(messages.Status().to_wire())
                gpus = conn.recv()["gpus"]
            finally:
                conn.close()
        except (ClientError, OSError):
            return
        pools = [g.get("pool", {}) for g in gpus]
        if all(p.get("idle", 0) + p.get("busy", 0) >= p.get("target", 0) for p in pools):
            return
        time.sleep(0.2)


def daemon_identity(sock: Path) -> str:
    """Which daemon answers at sock, for `krex daemon stop` to name what it stops: its
    version, build and checkout (one older than build checks: its version)."""
    try:
        conn = Connection(sock, timeout_s=2.0)
        try:
            conn.send(messages.Hello().to_wire())
            reply = conn.recv(2.0)
        finally:
            conn.close()
    except (ClientError, OSError):
        return "the daemon"
    theirs = reply.get("build")
    return "the daemon " + describe(theirs if isinstance(theirs, dict) else older(reply))


def status(sim: bool, explicit_socket: str | None) -> dict[str, Any]:
    """The daemon's status (ClientError when none answers)."""
    conn = connect(socket_for(sim, explicit_socket), sim=sim, start=False)
    try:
        conn.send(messages.Status().to_wire())
        return conn.recv()
    finally:
        conn.close()


@contextlib.contextmanager
def private_daemon(
    directory: Path,
    *,
    sim: bool,
    slots: int,
    pool: int | None = None,
    gpus: int | None = None,
    mps: bool = False,
) -> Iterator[Path]:
    """A daemon of its own on a socket in `directory` (for the demo and the bench), stopped on
    exit; yields the socket once its warm workers, if any, are ready (at most 3 minutes).
    `pool`: warm workers per GPU (None: the daemon's default); `gpus`: how many (None: every
    GPU the driver shows, or 1 simulated); `mps`: `krex daemon --mps`. ClientError when the
    daemon does not come up within 30 s."""
    directory = directory.absolute()  # the daemon runs in / (_daemon_place)
    directory.mkdir(parents=True, exist_ok=True)
    sock = directory / "krex.sock"
    log_path = directory / "daemon.log"
    cmd = [
        sys.executable,
        "-m",
        "krex.cli",
        "daemon",
        "--socket",
        str(sock),
        "--slots",
        str(slots),
        *(["--sim"] if sim else []),
        *(["--pool", str(pool)] if pool is not None else []),
        *(["--gpus", str(gpus)] if gpus is not None else []),
        *(["--mps"] if mps else []),
    ]
    try:
        log_fd = open_beside(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    except TrustError as e:
        raise ClientError(f"a private krex daemon cannot log to {e}") from None
    with os.fdopen(log_fd, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, **_daemon_place())
    try:
        deadline = time.monotonic() + 30
        # Until it answers a hello: the socket's name exists from its bind, before the
        # daemon listens (a loaded machine showed that gap: "no krex daemon answers").
        while not answers(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClientError(
                    "a private krex daemon did not start: " + _read_beside(log_path)[-1500:]
                )
            time.sleep(0.05)
        _await_pool(sock, deadline=time.monotonic() + 180)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=60)
