"""bench.shared_base's parts: the PSS of a live process, the pids it watches, and the figures it reports (a whole
run of the bench launches two runs: docs/lora.md has its figures)."""

import json
import os

import pytest

from bench import shared_base


def test_pss_of_a_live_process_and_none_for_a_gone_one():
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        pytest.skip("no /proc/PID/smaps_rollup here")
    assert shared_base._pss_mb(os.getpid()) > 1.0
    assert shared_base._pss_mb(2**22 + 12345) is None


def test_it_watches_the_processes_that_hold_a_base(tmp_path):
    assert shared_base._pids(tmp_path) == {}  # no run.json yet
    (tmp_path / "run.json").write_text(json.dumps({"pids": {"replay": 1, "reward-0": 2, "learner-0": 3,
                                                            "generator-0": 4, "generator-1": 5, "base-holder": 6}}))
    assert shared_base._pids(tmp_path) == {"learner-0": 3, "generator-0": 4, "generator-1": 5, "base-holder": 6}


def test_figures_are_the_training_median_and_the_peak_of_the_sum():  # and each process's median where read
    samples = [(False, {"learner-0": 900.0}),  # start-up: in the peak only
               (True, {"learner-0": 500.0, "generator-0": 300.0}),
               (True, {"learner-0": 520.0, "generator-0": 310.0}),
               (True, {"learner-0": 510.0, "generator-0": 290.0, "base-holder": 100.0})]
    got = shared_base.summarize(samples)
    assert got == {"training_mb": 830.0, "peak_mb": 900.0, "samples": 3,
                   "per_process_mb": {"base-holder": 100.0, "generator-0": 300.0, "learner-0": 510.0}}
    with pytest.raises(RuntimeError, match="no memory sample"):
        shared_base.summarize([])
