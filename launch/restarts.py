"""`RestartBudget`: when a crashed service is restarted, and when its crashes end the run.

    crash ─► healthy since its last start? ─yes─► budget and backoff start afresh
                         └─no─► one more crash in a row ─► > max_restarts within window_s: a crash loop, the run ends
    restart after a backoff: restart_backoff_s, doubling per crash in a row, at most restart_backoff_max_s

A service is *healthy* once the run made a learner step while it was up (`progress()`), or once it stayed
up for `healthy_after_s`: a generator killed every few seconds on a flaky host keeps the run going as long as
the run keeps training, while one that dies before it ever does anything (a crash loop) ends it after
max_restarts tries. Crashes older than window_s are forgiven as well. The clock is injected (time.monotonic by
default) so tests need not sleep.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RestartBudget:
    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic,
                 backoff_s: float = 0.0, backoff_max_s: float = 60.0, healthy_after_s: float = float("inf")) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self.backoff_s, self.backoff_max_s, self.healthy_after_s = backoff_s, backoff_max_s, healthy_after_s
        self.times: deque[float] = deque()  # crashes in a row (unhealthy), within the window
        self.total = 0
        self.started_at = clock()
        self.progressed = False

    def started(self) -> None:
        """The service (re)started now."""
        self.started_at, self.progressed = self.clock(), False

    def progress(self) -> None:
        """The run made a learner step while the service was up."""
        self.progressed = True

    def healthy(self) -> bool:
        return self.progressed or self.clock() - self.started_at >= self.healthy_after_s

    def take(self) -> float | None:
        """A crash now: the seconds to wait before restarting, or None when the budget is spent."""
        now = self.clock()
        if self.healthy():
            self.times.clear()
        while self.times and self.times[0] <= now - self.window_s:
            self.times.popleft()
        if len(self.times) >= self.max_restarts:
            return None
        self.times.append(now)
        self.total += 1
        return min(self.backoff_s * 2 ** (len(self.times) - 1), self.backoff_max_s)

    def spent_message(self, name: str) -> str:
        return (f"{name} crashed {len(self.times) + 1} times in a row within {self.window_s:.0f} s without becoming "
                f"healthy (no learner step while it ran, up less than launch.healthy_after_s="
                f"{self.healthy_after_s:g} s): a crash loop (launch.max_restarts={self.max_restarts}); fix the "
                "cause in its log, or raise the budget")
