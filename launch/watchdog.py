"""`ProgressWatchdog`: ends a run whose learner makes no step for `stall_timeout_s`, saying why.

It also ends at once a run in which every sample failed so far, once `fail_fast_samples` have (the
supervisor passes two batches' worth): a reward function that raises on every sample, or an environment that
errors on every episode, is reported within seconds of the first failures instead of after the stall
timeout (15 min by default). One sample trained or scored, and this rule no longer applies.

The supervisor feeds it the newest learner step (metrics.jsonl) and the hub's counters every watch turn;
`check` returns the reason to stop or "". The reason names what the hub sees: samples failing (with the
last failure reason the reward workers gave), nothing generated, or no hub at all. Clock injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class ProgressWatchdog:
    def __init__(self, stall_timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 fail_fast_samples: int = 0) -> None:
        self.timeout_s, self.clock, self.fail_fast_samples = stall_timeout_s, clock, fail_fast_samples
        self.step = -1
        self.since = clock()

    def check(self, step: int, hub: dict[str, Any]) -> str:
        now = self.clock()
        if self._all_failed(hub):
            return f"{self.fail_fast_samples} samples or more failed and none was scored: " + diagnose(hub)
        if step != self.step:
            self.step, self.since = step, now
            return ""
        if self.timeout_s <= 0 or now - self.since < self.timeout_s:
            return ""
        return f"no learner step for {now - self.since:.0f} s (launch.stall_timeout_s={self.timeout_s:g}): " + diagnose(hub)


    def _all_failed(self, hub: dict[str, Any]) -> bool:
        acc, states = hub.get("accounting") or {}, hub.get("states") or {}
        return (self.fail_fast_samples > 0 and int(acc.get("failed", 0)) >= self.fail_fast_samples
                and int(acc.get("trained", 0)) == 0 and int(states.get("scored", 0)) == 0)


def diagnose(hub: dict[str, Any]) -> str:
    if not hub:
        return "the hub does not answer"
    acc = hub.get("accounting") or {}
    failed, trained = int(acc.get("failed", 0)), int(acc.get("trained", 0))
    last = hub.get("last_failure") or "no reason given"
    if failed and not trained:
        return f"every sample failed ({failed} so far): {last}"
    if failed:
        return f"samples are failing ({failed} failed, {trained} trained); last reason: {last}"
    states = {k: v for k, v in (hub.get("states") or {}).items() if v}
    return f"nothing reaches the learner; hub sample states {states}, queued prompts {hub.get('queued_prompts')}"
