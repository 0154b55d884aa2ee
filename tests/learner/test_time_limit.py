"""learner.time_limit_s: the first step to finish past the limit is the run's last (checkpointed, evaluated, exported)."""

import time
from types import SimpleNamespace

import pytest

from asyncrl.config.loader import from_dict
from asyncrl.config.run import RunConfig
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.service import LearnerService


def service(limit: float, elapsed: float, step: int = 5, steps: int = 100) -> LearnerService:
    svc = object.__new__(LearnerService)  # only the clock and the step counter matter here
    svc.cfg = LearnerConfig(time_limit_s=limit, steps=steps)
    svc.trainer = SimpleNamespace(step=step, dist=SimpleNamespace(world_size=1, rank=0))
    svc.t0, svc.timed_out = time.time() - elapsed, False
    return svc


def test_no_limit_runs_all_steps():
    svc = service(0.0, elapsed=1e6)
    assert not svc._out_of_time() and not svc.finished


def test_inside_the_limit_goes_on():
    svc = service(60.0, elapsed=10.0)
    assert not svc._out_of_time() and not svc.finished


def test_past_the_limit_this_step_is_the_last():
    svc = service(60.0, elapsed=61.0)
    assert svc._out_of_time() and svc.finished


def test_steps_still_bound_the_run():
    assert service(60.0, elapsed=1.0, step=100).finished


def test_negative_limit_names_the_field():
    with pytest.raises(ValueError, match="learner.time_limit_s"):
        from_dict(RunConfig, {"learner": {"time_limit_s": -1}})
