"""Launcher policies with an injected clock: restart budgets per time window, the progress watchdog."""

from __future__ import annotations

from launch.restarts import RestartBudget
from launch.watchdog import ProgressWatchdog


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_restart_budget_counts_per_window_not_per_run():
    clock = Clock()
    budget = RestartBudget(3, window_s=60, clock=clock)
    assert all(budget.take() for _ in range(3))
    assert not budget.take()  # a 4th crash within the window ends the run
    assert "crashed 4 times within 60 s" in budget.spent_message("generator-0")
    clock.t += 61  # the old crashes are forgiven
    assert budget.take() and budget.take() and budget.total == 5


def test_zero_budget_allows_no_restart():
    assert not RestartBudget(0, window_s=60, clock=Clock()).take()


def test_watchdog_ends_a_run_without_steps_and_names_the_failure():
    clock = Clock()
    dog = ProgressWatchdog(30, clock=clock)
    failing = {"accounting": {"failed": 640, "trained": 0}, "last_failure": "reward: RuntimeError: broken"}
    assert dog.check(0, failing) == ""
    clock.t += 29
    assert dog.check(0, failing) == ""
    clock.t += 2
    reason = dog.check(0, failing)
    assert reason.startswith("no learner step for 31 s") and "every sample failed (640 so far): reward: RuntimeError: broken" in reason


def test_watchdog_resets_on_each_step_and_is_off_at_zero():
    clock = Clock()
    dog = ProgressWatchdog(30, clock=clock)
    for step in range(5):
        clock.t += 25
        assert dog.check(step, {}) == ""
    clock.t += 31
    assert "the hub does not answer" in dog.check(4, {})
    off = ProgressWatchdog(0, clock=clock)
    clock.t += 10_000
    assert off.check(0, {}) == ""


def test_watchdog_says_what_the_hub_holds_when_nothing_failed():
    clock = Clock()
    dog = ProgressWatchdog(1, clock=clock)
    dog.check(3, {})
    clock.t += 2
    reason = dog.check(3, {"accounting": {"failed": 0, "trained": 10}, "states": {"queued": 4, "leased": 0},
                          "queued_prompts": 1})
    assert "nothing reaches the learner" in reason and "'queued': 4" in reason
