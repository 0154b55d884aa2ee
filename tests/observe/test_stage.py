import torch

from asyncrl.observe.stage import stage


def test_stage_is_a_profiler_range_while_profiling():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with stage("asyncrl.test_range"):
            torch.ones(4).sum()
    assert [e.name for e in prof.events()].count("asyncrl.test_range") == 1


def test_stage_is_a_shared_no_op_without_a_profiler():
    assert stage("a") is stage("b")
    with stage("a"):
        pass
