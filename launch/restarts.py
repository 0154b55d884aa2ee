"""`RestartBudget`: how many restarts one service may use per time window.

A service that crashes more than `max_restarts` times within `window_s` seconds stops the run; crashes
older than the window are forgiven, so a long run survives occasional crashes. The clock is injected
(time.monotonic by default) so tests need not sleep.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RestartBudget:
    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self.times: deque[float] = deque()
        self.total = 0

    def take(self) -> bool:
        """Record a restart if the budget allows one now; False when it is spent."""
        now = self.clock()
        while self.times and self.times[0] <= now - self.window_s:
            self.times.popleft()
        if len(self.times) >= self.max_restarts:
            return False
        self.times.append(now)
        self.total += 1
        return True

    def spent_message(self, name: str) -> str:
        return (f"{name} crashed {len(self.times) + 1} times within {self.window_s:.0f} s (launch.max_restarts="
                f"{self.max_restarts} per launch.restart_window_s={self.window_s:.0f}); fix the cause in its log, "
                "or raise the budget")
