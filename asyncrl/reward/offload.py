"""Runs blocking reward functions off the event loop: CPU-heavy ones in a spawn process pool, the rest
in threads, so a slow function never stalls the worker's loop.

    event loop ── run(fn, args, heavy) ──► ProcessPoolExecutor (spawn, `processes` workers)
                                      └──► a daemon thread per call (heavy with processes = 0, or light)

The caller bounds each call with its own timeout (asyncio.wait_for). When a call is cancelled while its
process task still runs, that process is hung: the pool is killed and recreated (a hung task would
otherwise hold a pool slot forever). Calls that were running in the killed pool are retried once on the
new one. A hung *thread* cannot be killed; it is abandoned (a daemon, so it does not hold up process exit the
way a ThreadPoolExecutor worker would), so functions that may hang belong in the process pool.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

log = logging.getLogger(__name__)


class Offload:
    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.pool_restarts = 0
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, fn: Callable[..., Any], *args: Any, heavy: bool) -> Any:
        """fn(*args) in the process pool (heavy, pool enabled) or a thread; fn must be picklable for the pool."""
        if not heavy or self.processes == 0:
            return await _in_thread(fn, args)
        for attempt in range(2):
            pool = self._get_pool()
            try:
                return await self._run_in(pool, fn, args)
            except BrokenProcessPool:
                if pool is self._pool:  # the pool broke under this call: a worker process died
                    self._restart(pool, "a reward process died")
                    raise RuntimeError("reward process died (crash or os._exit) while scoring") from None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    async def _run_in(self, pool: ProcessPoolExecutor, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        cfut: Future = pool.submit(fn, *args)
        try:
            return await asyncio.wrap_future(cfut)
        except asyncio.CancelledError:  # timed out (or shut down) while the process may still run it
            if not cfut.cancel() and not cfut.done():
                self._restart(pool, "a reward function hung past its timeout")
            raise

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.processes, mp_context=ctx)
        return self._pool

    def _restart(self, pool: ProcessPoolExecutor, why: str) -> None:
        if pool is not self._pool:
            return  # already replaced
        log.warning("%s: killing and recreating the reward process pool", why)
        self.pool_restarts += 1
        self._pool = None
        _kill(pool)

    def close(self) -> None:
        if self._pool is not None:
            _kill(self._pool)
            self._pool = None


async def _in_thread(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not fut.done():  # the caller may have timed out already
            fut.set_exception(error) if error is not None else fut.set_result(result)

    def target() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting caller
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    threading.Thread(target=target, name="reward-fn", daemon=True).start()
    return await fut


def _kill(pool: Executor) -> None:
    kill = getattr(pool, "kill_workers", None)  # Python >= 3.14
    if kill is not None:
        kill()
    else:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
