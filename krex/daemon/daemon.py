"""`krex daemon`: the per-node controller, as wiring: connections, admission, tenants, status.

One asyncio loop owns all state. The region protocol is krex/daemon/regions.py (the only writer
of region state, over krex/daemon/machinery.py), the warm pool krex/daemon/workers.py, the
shared segments krex/daemon/segments.py; the wire protocol is docs/protocol.md
(krex/core/wire.py), the architecture docs/architecture.md. Per GPU there is a FIFO admission
queue for slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from krex.core import liveness, messages, wire
from krex.core.build import mismatch
from krex.core.config import Config, ConfigError
from krex.core.errors import ProtocolError
from krex.core.procs import parent
from krex.core.shm import SegmentError
from krex.core.tenants import TenantsError
from krex.core.trust import TrustError, bind_private, open_beside
from krex.core.version import __version__
from krex.daemon.admission import admit_request
from krex.daemon.conn import Conn, peer_of
from krex.daemon.memory import GIB
from krex.daemon.metrics import MetricsError
from krex.daemon.model import AdmitRequest, Gpu, Region, Tenant
from krex.daemon.mps import Mps
from krex.daemon.node import Node
from krex.daemon.status import status
from krex.daemon.tasks import Supervisor, spawn
from krex.daemon.workers import EXIT_WAIT_S
from krex.pool.plan import preinit, startup_locale
from krex.sim.simnode import remove as remove_sim_segment
from krex.sim.simnode import segment_name as sim_segment

log = logging.getLogger("krex.daemon")
refuse = logging.getLogger("krex.daemon.connections")  # refusals: rate-limited (LogLimit)

_MEMORY_TICK_S = (0.02, 0.2)  # how often the memory arbiter looks: someone waits, nobody does
STEP_MARGIN_S = 20.0  # step_s(): beyond the daemon's own bounds, for a loaded machine
_PRUNE_EVERY = 10  # reaper passes (seconds) between prunes of groups left by a predecessor
# Connections (docs/security.md, "Who may talk to the daemon"): at most MAX_CONNECTIONS open
# (fewer where the descriptor limit, raised to its hard limit, leaves less than FD_RESERVE for
# the daemon's own files), a further one refused with one error line; of them at most
# MAX_WAITING that have not sent their first request, the one waiting longest closed (with a
# line saying why) to make room; a first request within FIRST_REQUEST_S; at most BIG_REQUESTS
# first requests longer than a line (an admit's long argv) read at once; a reply written
# within SEND_S.
MAX_CONNECTIONS = 4096
FD_RESERVE = 256
MAX_WAITING = 64
FIRST_REQUEST_S = 10.0
# How long a refused connection's unread request is still taken in (see _linger).
LINGER_S = 1.0
BIG_REQUESTS = 4
BACKLOG = 1024  # connections the kernel holds for accept (a client tries again while full)


Handler = Callable[[dict[str, Any], Conn], Awaitable[None]]


class Daemon:
    """The controller of one node (or of one simulated node): its Node, served over the
    socket."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.socket = cfg.socket_path()
        # First of all: a second daemon on this socket must not touch the segment or the
        # cgroups of the running one (recovery reopens gates and thaws groups).
        self._lock_fd: int | None = _take_lock(self.socket)
        self._alive_fd: int | None = None
        try:
            _reclaim_files(self.socket)
            self.node = Node(cfg, self.socket, cfg.segment_name().lstrip("/"))
            try:
                # Held until we end (or die): blocked tenants and watching clients tell a
                # dead daemon by it (krex/core/liveness.py). Before any gate of ours closes.
                self._alive_fd = liveness.hold(self.node.segments.gates)
                if cfg.metrics_port:
                    self._serve_metrics(cfg)
            except BaseException:
                self.node.segments.abandon()
                raise
        except BaseException:
            # A start refused (a metrics port in use, a segment another daemon holds, a bad
            # setting): nothing of ours stays; what a dead predecessor left stays for the next.
            self._drop_alive()
            self.release_lock()
            raise
        self._server: asyncio.AbstractServer | None = None
        self.failed: str | None = None  # why a background task ended the daemon
        self.supervisor = Supervisor(self._fail)
        self._conns: dict[asyncio.Task[Any], Conn] = {}  # open connections and their handlers
        self._waiting: dict[asyncio.Task[Any], Conn] = {}  # of those, yet to send a request
        self._max_conns = _connection_cap()
        self._big: asyncio.Semaphore | None = None  # made in the loop (serve)
        self._ops: dict[str, Handler] = {
            "admit": self._op_admit,
            "region_begin": self._op_region_begin,
            "worker_ready": self.node.pool.serve_worker,
            "hello": self._op_hello,
            "status": self._op_status,
        }

    def _serve_metrics(self, cfg: Config) -> None:
        try:
            self.node.metrics.serve(cfg.metrics_port, cfg.metrics_address)
        except MetricsError as e:
            raise ConfigError(f"{cfg.source}: metrics: {e}") from e

    def _fail(self, why: str) -> None:
        """A background task the daemon cannot do without keeps dying: it stops (exit 1)."""
        self.failed = self.failed or why
        self.node.stop.set()

    # Start-up and shutdown.
    async def serve(self) -> None:
        """Serve until SIGTERM or SIGINT; then thaw everything, open every gate, and exit
        (also when it cannot start serving: nothing it made stays)."""
        self._big = asyncio.Semaphore(BIG_REQUESTS)
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_loop_exception)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.node.stop.set)
        try:
            await self._listen()
            self.supervisor.keep("reaper", self._reap_loop)
            self.supervisor.keep("memory arbiter", self._memory_loop)
            self.node.pool.start()
            await self.node.stop.wait()
        finally:
            self.supervisor.cancel()
            await self._shutdown()

    async def _listen(self) -> None:
        node = self.node
        if self.cfg.mps and not self.cfg.sim:
            node.mps = Mps.start(self.socket.parent / f"mps-{node.root}")
            node.machinery.helper = node.mps.owns
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self._server = await asyncio.start_unix_server(
            self._client, sock=bind_private(self.socket), limit=wire.MAX_LINE, backlog=BACKLOG
        )
        log.info(
            "krex daemon %s on %s: %d %s%s GPU(s), %d slots each, freezer %s, segment %s",
            __version__,
            self.socket,
            len(node.gpus),
            "simulated " if self.cfg.sim else "",
            "AMD" if node.vendor == "amd" else "NVIDIA",
            self.cfg.slots,
            node.freezer.value,
            node.segments.gates.name,
        )

    async def _shutdown(self) -> None:
        log.info("stopping: ending regions, thawing tenants, opening gates")
        if self._server is not None:
            self._server.close()
        await self.node.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        await self._close_connections()
        kept = self.node.segments.close()
        gates = self.node.segments.gates.name
        if self.cfg.sim and not remove_sim_segment(sim_segment(gates)):
            kept.append(sim_segment(gates))
        if kept:
            # Their names stay while processes use them (new processes of a command find its
            # segments by name): the last `krex run` to end removes them (krex/client/leftovers.py),
            # or the next daemon takes them over.
            log.info("segment(s) %s stay while processes use them", ", ".join(kept))
        self._drop_alive()
        self.release_lock()

    def _drop_alive(self) -> None:
        """Release the liveness lock (every gate of ours is open, or none ever closed)."""
        if self._alive_fd is not None:
            os.close(self._alive_fd)
            self._alive_fd = None

    def release_lock(self) -> None:
        """Remove the pid file and release the lock (the daemon is ending)."""
        if self._lock_fd is not None:
            _drop_lock(self.socket, self._lock_fd)
            self._lock_fd = None

    # Connections.
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer, peer_of(writer), wire.Lines(reader, self._big))
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = conn
        try:
            if len(self._conns) > self._max_conns:
                refuse.warning(
                    "refused a connection: %d are open (at most %d)",
                    len(self._conns) - 1,
                    self._max_conns,
                )
                raise ProtocolError(
                    f"the daemon has {len(self._conns) - 1} connections open, its most: "
                    "try again once some end"
                )
            if conn.peer.uid not in (os.getuid(), 0):
                # The socket is 0600 already; this also holds if its mode is ever loosened.
                raise ProtocolError(f"user {conn.peer.uid} may not use this daemon")
            self._waiting[task] = conn
            if len(self._waiting) > MAX_WAITING:
                self._drop_oldest_waiting()
            try:
                first = await asyncio.wait_for(conn.read(wire.MAX_REQUEST), FIRST_REQUEST_S)
            except TimeoutError:
                raise ProtocolError(f"no request within {FIRST_REQUEST_S:g} s") from None
            finally:
                self._waiting.pop(task, None)
            if first is None:
                return
            op = messages.op_of(first)
            if op != messages.Admit.OP and conn.lines.last > wire.MAX_LINE:
                raise ProtocolError(f"request longer than {wire.MAX_LINE} bytes")
            handler = self._ops.get(op) if isinstance(op, str) else None
            if handler is None:
                raise ProtocolError(f"unknown op {op!r}")
            await handler(first, conn)
        except ProtocolError as e:
            with contextlib.suppress(ConnectionError):
                await conn.send({"ok": False, "error": str(e)})
                if conn.lines.last == 0:  # refused before its request was read
                    await _linger(writer, reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug, not the client's fault: log it, answer, keep serving
            log.exception("request failed")
            with contextlib.suppress(ConnectionError, OSError):
                await conn.send({"ok": False, "error": "internal error (see the log)"})
        finally:
            self._conns.pop(task, None)
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()

    def _drop_oldest_waiting(self) -> None:
        """More connections than MAX_WAITING have sent no request yet: the one that waited
        longest is told why and closed (a client sends its request as it connects)."""
        task, conn = next(iter(self._waiting.items()))
        del self._waiting[task]
        refuse.warning(
            "closed a connection (pid %d) that sent no request: %d others wait for theirs",
            conn.peer.pid,
            MAX_WAITING,
        )
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            conn.writer.write(
                wire.encode_reply(
                    {
                        "ok": False,
                        "error": f"closed: no request yet and {MAX_WAITING} newer connections "
                        "wait for theirs",
                    }
                )
            )
            conn.writer.close()

    async def _close_connections(self) -> None:
        """At shutdown: every client sees EOF and every handler ends on its own (a handler
        cancelled by asyncio.run instead is logged as an error by asyncio's streams)."""
        for conn in list(self._conns.values()):
            with contextlib.suppress(ConnectionError, OSError):
                conn.writer.close()
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=5.0)

    async def _op_hello(self, msg: dict[str, Any], conn: Conn) -> None:
        await conn.send(
            {"ok": True, "version": __version__, "pid": os.getpid(), "build": self.node.build}
        )

    async def _op_status(self, msg: dict[str, Any], conn: Conn) -> None:
        await conn.send({"ok": True, **status(self.node)})

    # Admission.
    async def _op_admit(self, msg: dict[str, Any], conn: Conn) -> None:
        theirs = messages.Admit.build_of(msg)
        if theirs is not None and (why := mismatch(theirs, self.node.build, self.socket)):
            raise ProtocolError(why)  # never a silent join of another build (docs/security.md)
        admit = messages.parse(msg, messages.Admit)
        req = admit_request(admit, self.cfg, self.node.admission.rerun_need)
        if not self.node.segments.linked():
            # Running tenants keep their mapping and carry on; a new one would find no segment
            # and run ungated, so none is let in.
            raise ProtocolError(
                f"the shared segment {self.node.segments.gates.name} was removed under the daemon: "
                "running commands finish, new ones cannot be gated; restart the daemon"
            )
        gpus = self.node.admission.pick(admit.gpu, admit.gpus)
        for g in gpus:
            if self.node.memory.too_large(req.mem, g.index):
                have = self.node.memory.state[g.index].capacity / GIB
                raise ProtocolError(
                    f"--mem {req.mem / GIB:.1f} GiB is more than GPU {g.index} has ({have:.1f} GiB)"
                )
        t = await self._admit(gpus, req, conn)
        try:
            reply: dict[str, Any] = {"ok": True, "tenant": t.id, "gpu": t.gpu, "gpus": t.gpus}
            reply["build"] = self.node.build
            reply["step_s"] = self.step_s()
            reply["env"] = self.node.tenant_env(t, req.auto)
            if len(gpus) == 1 and (gpus[0].pool or self.node.pool.size()):
                # What a client needs to decide whether its command can run warm (pool.py).
                reply["pool"] = {
                    "python": sys.executable,
                    "env": {k: v for k, v in os.environ.items() if preinit(k)},
                    "locale": startup_locale(),  # the workers start as we did
                }
            await conn.send(reply)
            await self._tenant_conn(t, conn)
        finally:
            self.node.release(t)

    def step_s(self) -> float:
        """The longest this daemon takes to answer `started` (placing the process, and
        freezing it into a live region: timeouts.freeze_s) or `finished` (a lost warm child's
        status: workers.EXIT_WAIT_S), with a margin for a loaded machine: what the client waits."""
        return max(self.cfg.freeze_timeout_s, EXIT_WAIT_S) + STEP_MARGIN_S

    async def _admit(self, gpus: list[Gpu], req: AdmitRequest, conn: Conn) -> Tenant:
        """A slot on each of gpus (taken in index order: a command of several GPUs never holds
        a slot while it waits for one that the holder of another slot waits for), then a
        tenant with its group and slot segment."""
        held: list[Gpu] = []
        admission = self.node.admission
        try:
            for g in gpus:
                await admission.take(g, req, conn)
                held.append(g)
            return self.node.add_tenant(gpus, req)
        except BaseException:
            for g in held:
                admission.reserve(g, req, -1)
                admission.admit_next(g)
            raise

    # A tenant's conversation (started or lease, then finished).
    async def _tenant_conn(self, t: Tenant, conn: Conn) -> None:
        while (raw := await conn.read()) is not None:
            try:
                msg = messages.parse(raw, messages.Started, messages.Lease, messages.Finished)
            except messages.UnknownOp as e:
                raise ProtocolError(f"unknown op {e.op!r} for a tenant") from None
            if isinstance(msg, messages.Started):
                await self._tenant_started(t, msg, conn)
            elif isinstance(msg, messages.Lease):
                await conn.send({"ok": True, **await self.node.pool.lease(t, conn.peer.pid)})
            elif isinstance(msg, messages.Finished):
                await self._tenant_finished(t, msg, conn)
                return

    async def _tenant_started(self, t: Tenant, msg: messages.Started, conn: Conn) -> None:
        pid, warm = msg.pid, msg.warm
        if t.pids or not (
            self.node.pool.is_child(t, pid) if warm else parent(pid) == conn.peer.pid
        ):
            # Only the command `krex run` itself forked (or its fork server did), once: never
            # someone else's process into a group that will be frozen.
            raise ProtocolError(f"process {pid} is not this client's command")
        await self.node.started(t, pid)
        if not warm:
            self.node.metrics.started(t.gpu, warm=False)
        await conn.send({"ok": True, "freezer": self.node.freezer.value})

    async def _tenant_finished(self, t: Tenant, msg: messages.Finished, conn: Conn) -> None:
        status = None
        if msg.worker_lost and t.worker is not None:
            status = await self.node.pool.exit_status(t.pids[0] if t.pids else None)
            t.child_lost = True
        if t.worker is None:
            self.node.gpus[t.gpu].cold_runs += 1
        report = self.node.report(t)
        await conn.send({"ok": True, "report": report, "worker_status": status})

    # Regions.
    async def _op_region_begin(self, msg: dict[str, Any], conn: Conn) -> None:
        begin = messages.parse(msg, messages.RegionBegin)
        t = self.node.tenants.get(begin.tenant)
        if t is None:
            raise ProtocolError(
                f"tenant {begin.tenant!r} is not admitted here: no command of that number runs "
                "under this daemon (a command admitted by a daemon that has since stopped gets "
                "no region from the next one: run it again)"
            )
        candidate = begin.candidate
        loop = asyncio.get_running_loop()
        if conn.peer.pid not in await loop.run_in_executor(None, t.group.pids):
            # A region freezes the tenant's siblings: only the tenant's own processes ask.
            raise ProtocolError(
                f"process {conn.peer.pid} is not one of tenant {t.id}'s: only a command's own "
                "processes ask for its regions (one admitted by a daemon that has since stopped "
                "gets none from the next: run it again)"
            )
        if begin.retaken:
            self.node.retaken(t)
        t_request = time.monotonic()
        region: Region = await self.node.regions.acquire(
            t, conn.until, pid=conn.peer.pid, candidate=candidate
        )
        if begin.retake:
            region.notify.append(functools.partial(_tell_revoked, conn))
        try:
            await conn.send({"ok": True, **_grant_reply(region, t_request)})
            end = await conn.read()
        except BaseException:
            self.node.regions.release(region, why="owner gone")
            raise
        if end is None or messages.op_of(end) != messages.RegionEnd.OP:
            # EOF (the owner died, or closed without region_end): the region ends at once.
            self.node.regions.release(region, why="owner gone")
            if end is not None:
                raise ProtocolError("expected region_end")
            return
        try:
            done = messages.parse(end, messages.RegionEnd)
        except ProtocolError:
            self.node.regions.release(region, why="region_end")  # ended all the same: nothing held
            raise
        record = self.node.regions.release(region, why="region_end", calls=done.calls)
        await conn.send({"ok": True, "region": record})

    async def _reap_loop(self) -> None:
        node, n = self.node, 0
        while True:
            await asyncio.sleep(1.0)
            LOG_LIMIT.flush()
            node.account()
            node.sample_device()
            node.machinery.tick()
            node.pool.end_leftovers()
            for g in node.gpus:
                node.metrics.levels(
                    g.index,
                    queue=len(g.admission),
                    region_queue=node.regions.queued(g.index),
                    slots=len(g.tenants),
                    idle=sum(w.state == "idle" for w in g.pool),
                )
            n += 1
            if n % _PRUNE_EVERY == 0:
                node.prune()

    async def _memory_loop(self) -> None:
        """The memory arbiter (krex/daemon/memory.py): fast while anyone waits; when a GPU's waiters
        are gone, or memory came back, its queued commands are looked at again."""
        while True:
            try:
                anyone = self.node.memory.tick(time.monotonic_ns())
            except Exception:  # never let the arbiter die: log it, try again next tick
                log.exception("memory arbiter")
                anyone = False
            for g in self.node.gpus:
                if g.admission:
                    self.node.admission.admit_next(g)
            await asyncio.sleep(_MEMORY_TICK_S[0] if anyone else _MEMORY_TICK_S[1])


def _tell_revoked(conn: Conn, why: str) -> None:
    """The region this connection holds was revoked for memory: tell its holder, who times
    its call again (a retake), at once; a holder already gone needs nothing."""

    async def send() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await conn.send({"event": messages.REVOKED_EVENT, "why": why})

    spawn(send(), "revoked event")


def _connection_cap() -> int:
    """MAX_CONNECTIONS, or fewer where the descriptor limit (raised to the hard limit) does
    not leave FD_RESERVE descriptors for the daemon's own files beside them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    cap = min(MAX_CONNECTIONS, soft - FD_RESERVE)
    if cap < MAX_CONNECTIONS:
        log.info("at most %d connections (descriptor limit %d)", max(cap, 16), soft)
    return max(cap, 16)


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's own errors: out of descriptors at accept is one line (rate-limited), not a
    traceback a second; anything else as asyncio says it."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and "accept" in str(context.get("message", "")):
        refuse.error("cannot accept connections: %s (the limit is the daemon's descriptors)", exc)
        return
    loop.default_exception_handler(context)


def _take_lock(sock: Path) -> int:
    """Hold the daemon's lock beside its socket (its pid in it), or ConfigError. A daemon
    removes the file as it ends (_drop_lock), so the lock is taken on the file that is under
    the name once held: one locked after its name went is no lock."""
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = str(sock) + ".pid"
    while True:
        try:
            fd = open_beside(path, os.O_RDWR | os.O_CREAT)
        except TrustError as e:  # planted: a symlink into someone's files, or not ours
            raise ConfigError(f"the daemon's pid file {e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"another krex daemon is running on {sock}") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its daemon removed it as we opened it: take the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _drop_lock(sock: Path, fd: int) -> None:
    """Remove the pid file (still holding its lock, so no other daemon has it), then release."""
    path = str(sock) + ".pid"
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    os.close(fd)


def _reclaim_files(sock: Path) -> None:
    """What a daemon that died on this socket left beside it (we hold its lock: it is dead):
    its warm workers' sockets that nobody listens on, a half-written peaks file."""
    for path in sock.parent.glob(f"{sock.name}.w*"):
        if not path.name[len(sock.name) + 2 :].isdigit() or not path.is_socket():
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        except OSError:
            pass
        finally:
            probe.close()
    with contextlib.suppress(FileNotFoundError):
        (sock.parent / f"{sock.name}.peaks.tmp").unlink()


async def _linger(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
    """After refusing a connection whose request is unread: end our side and take what the
    client still sends, for at most LINGER_S, so that its send does not fail (a closed peer
    is EPIPE) before it reads the one error line."""
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
    deadline = time.monotonic() + LINGER_S
    with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
        while (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(reader.read(65536), left):
                return


def _grant_reply(r: Region, t_request: float) -> dict[str, Any]:
    """What a granted `region_begin` is answered with (docs/protocol.md)."""
    return {
        "epoch": r.epochs.get(r.tenant.gpus[0], 0),
        "wait_s": time.monotonic() - t_request,
        "drain_s": r.drain_s,
        "freeze_s": r.freeze_s,
        "clean": r.clean,
        **({"gpus": list(r.gpus)} if len(r.tenant.gpus) > 1 else {}),
    }


class LogLimit(logging.Filter):
    """At most BURST records of one kind (logger, level and message before its arguments) of
    WARNING or above in WINDOW_S seconds; the rest are counted and said in one line once the
    window is over (at the next of its kind, or the reaper's flush)."""

    BURST = 10
    WINDOW_S = 60.0

    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[tuple[str, int, str], list[float]] = {}  # start, count, not logged

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "krex_summary", False):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        kind = self.kinds.get(key)
        if kind is None or now - kind[0] >= self.WINDOW_S:
            if kind is not None and kind[2]:
                self._say(key, kind)
            self.kinds[key] = [now, 1, 0]
            return True
        kind[1] += 1
        if kind[1] <= self.BURST:
            return True
        kind[2] += 1
        return False

    def flush(self) -> None:
        """Say what windows that are over left unsaid; forget them."""
        now = time.monotonic()
        for key, kind in list(self.kinds.items()):
            if now - kind[0] >= self.WINDOW_S:
                del self.kinds[key]
                if kind[2]:
                    self._say(key, kind)

    def _say(self, key: tuple[str, int, str], kind: list[float]) -> None:
        logging.getLogger(key[0]).log(
            key[1],
            "%d more message(s) like %r in %g s, not logged",
            int(kind[2]),
            key[2][:200],
            self.WINDOW_S,
            extra={"krex_summary": True},
        )


LOG_LIMIT = LogLimit()


class _JsonLines(logging.Formatter):
    """One JSON object per log record (`daemon.log_format = "json"`)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def run(cfg: Config) -> int:
    """Run the daemon in the foreground; returns the exit status."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonLines()
        if cfg.log_format == "json"
        else logging.Formatter("%(asctime)s krex-daemon %(levelname)s %(message)s")
    )
    handler.addFilter(LOG_LIMIT)
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        daemon = Daemon(cfg)
        asyncio.run(daemon.serve())
    except (ConfigError, SegmentError, TenantsError) as e:
        # What it cannot start with (a foreign or locked segment, an unsafe directory): one line.
        log.error("%s", e)
        return 2
    if daemon.failed:
        log.error("krex daemon stopped: %s", daemon.failed)
        return 1
    return 0
