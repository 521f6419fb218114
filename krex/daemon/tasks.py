"""The daemon's background tasks, supervised: none dies silently (docs/security.md).

A long-lived task (`Supervisor.keep`: the reaper, the memory arbiter) that raises is logged
with its traceback and started again; one that keeps dying (RESTARTS times within
RESTART_WINDOW_S), or returns although it should not, ends the daemon (`fatal`), loudly. A
short task (`spawn`: a region being set up, a pool worker's life) is held until it ends, and
whatever it raises is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("krex.daemon")

RESTARTS = 5  # deaths of a long-lived task within RESTART_WINDOW_S that end the daemon
RESTART_WINDOW_S = 60.0
RESTART_DELAY_S = 0.5  # before a task that died starts again

_held: set[asyncio.Task[Any]] = set()  # short tasks, referenced until they end


def spawn(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    """Run coro as a task of its own; what it raises (not a cancellation) is logged."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _held.add(task)
    task.add_done_callback(_ended)
    return task


def _ended(task: asyncio.Task[Any]) -> None:
    _held.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("background task %r failed", task.get_name(), exc_info=exc)


class Supervisor:
    """The daemon's long-lived tasks; `fatal(why)` ends the daemon."""

    def __init__(self, fatal: Callable[[str], None]) -> None:
        self.fatal = fatal
        self.tasks: list[asyncio.Task[None]] = []

    def keep(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """run() as a task for the daemon's life: started again when it raises."""
        self.tasks.append(spawn(self._supervise(name, run), name))

    async def _supervise(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        deaths: list[float] = []
        while True:
            try:
                await run()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                now = time.monotonic()
                deaths = [d for d in deaths if now - d < RESTART_WINDOW_S] + [now]
                if len(deaths) >= RESTARTS:
                    log.critical(
                        "the daemon's %s died %d times within %g s; the daemon stops",
                        name,
                        len(deaths),
                        RESTART_WINDOW_S,
                        exc_info=True,
                    )
                    self.fatal(f"its {name} kept dying: {type(e).__name__}: {e}")
                    return
                log.error("the daemon's %s died; starting it again", name, exc_info=True)
                await asyncio.sleep(RESTART_DELAY_S)
            else:
                log.critical("the daemon's %s ended; the daemon stops", name)
                self.fatal(f"its {name} ended")
                return

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
