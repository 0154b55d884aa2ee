"""`EnvLoop`: environment calls run here, off the generator's engine loop, each bounded by a timeout.

    generator thread ──call(fn, arg)──► asyncio loop (daemon thread) ──async fn──► awaited with wait_for
          ▲                                   │           └──plain fn──► thread pool (env_threads)
          └──── future.done() polled ◄────────┘

The generator thread never waits on an environment: it submits a call, keeps decoding other episodes and
polls the returned future between engine steps. A call that raises, or does not answer within the timeout,
resolves to a `Failure` with the reason; it never raises into the generator. A plain function that hangs
cannot be killed from Python: its thread is abandoned (the episode fails at the timeout) and the pool
keeps serving others with the threads it has left; environments that can hang should be async or run
their work in a subprocess with its own limits.

The loop is uvloop's where it is installed (the project's event loop: many episodes awaiting tools at once),
else asyncio's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str  # "raised", "timeout" or "invalid": the stats key
    detail: str  # one line for the episode's env_error


@dataclass(frozen=True, slots=True)
class Outcome:
    value: Any  # what the call returned, or a Failure
    seconds: float


class EnvLoop:
    def __init__(self, threads: int = 16) -> None:
        self.loop = new_event_loop()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="env")
        self.loop.set_default_executor(self.pool)
        self.thread = threading.Thread(target=self.loop.run_forever, name="env-loop", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> concurrent.futures.Future:
        """Run fn(arg) off this thread; the future resolves to an Outcome (never raises)."""
        return asyncio.run_coroutine_threadsafe(self._run(fn, arg, timeout_s), self.loop)

    async def _run(self, fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> Outcome:
        start = time.monotonic()
        try:
            if inspect.iscoroutinefunction(fn):
                value = await asyncio.wait_for(fn(arg), timeout_s)
            else:
                value = await asyncio.wait_for(self.loop.run_in_executor(None, fn, arg), timeout_s)
                if inspect.isawaitable(value):  # a plain function that returned a coroutine
                    value = await asyncio.wait_for(value, max(timeout_s - (time.monotonic() - start), 1e-3))
        except (TimeoutError, asyncio.TimeoutError):
            value = Failure("timeout", f"{_name(fn)} did not answer within {timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - an environment's error fails its episode, never the generator
            value = Failure("raised", f"{_name(fn)} raised {type(e).__name__}: {str(e)[:300]}")
        return Outcome(value, time.monotonic() - start)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop where uvloop is installed (it is optional on some platforms), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
