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
    assert all(budget.take() is not None for _ in range(3))
    assert budget.take() is None  # a 4th crash in a row within the window: a crash loop
    assert "crashed 4 times in a row within 60 s" in budget.spent_message("generator-0")
    clock.t += 61  # the old crashes are forgiven
    assert budget.take() is not None and budget.take() is not None and budget.total == 5


def test_zero_budget_allows_no_restart():
    assert RestartBudget(0, window_s=60, clock=Clock()).take() is None


def test_backoff_doubles_per_crash_in_a_row_up_to_its_cap():
    budget = RestartBudget(10, window_s=600, clock=Clock(), backoff_s=1.0, backoff_max_s=5.0)
    assert [budget.take() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_service_that_made_progress_starts_afresh():
    """The drill of a flaky host: killed every few seconds, but the run trains between kills: never a loop."""
    clock = Clock()
    budget = RestartBudget(3, window_s=600, clock=clock, backoff_s=1.0, healthy_after_s=60)
    for _ in range(10):
        budget.started()
        clock.t += 4
        budget.progress()  # a learner step while it was up
        assert budget.take() == 1.0  # healthy before it died: count and backoff start afresh
    assert budget.total == 10


def test_a_service_that_stays_up_long_enough_is_healthy_without_steps():
    clock = Clock()
    budget = RestartBudget(1, window_s=600, clock=clock, healthy_after_s=60)
    budget.started()
    assert budget.take() is not None
    budget.started()
    clock.t += 61
    assert budget.take() is not None  # up 61 s: healthy, so this crash is the first of a new run of crashes
    budget.started()
    assert budget.take() is None  # died at once, twice in a row: a crash loop


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


def test_watchdog_ends_at_once_a_run_whose_every_sample_failed():
    clock = Clock()
    dog = ProgressWatchdog(900, clock=clock, fail_fast_samples=128)
    early = {"accounting": {"failed": 127, "trained": 0}, "states": {"scored": 0}, "last_failure": "env: boom"}
    assert dog.check(0, early) == ""  # fewer than two batches' worth: maybe bad luck
    failing = {"accounting": {"failed": 128, "trained": 0}, "states": {"scored": 0}, "last_failure": "env: boom"}
    reason = dog.check(0, failing)
    assert reason.startswith("128 samples or more failed and none was scored") and "every sample failed" in reason
    one_scored = {"accounting": {"failed": 500, "trained": 0}, "states": {"scored": 1}}
    one_trained = {"accounting": {"failed": 500, "trained": 1}, "states": {"scored": 0}}
    assert dog.check(0, one_scored) == "" and dog.check(0, one_trained) == ""  # left to the stall timeout


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
