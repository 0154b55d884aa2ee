"""Hub + generator + reward worker as real processes on CPU: the demo model's completions come back
scored to a client, and every sample is accounted for."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl import Client
from asyncrl import records as R
from e2e_helpers import make_run, shutdown, start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
N = 8  # samples per prompt


def test_client_prompts_come_back_generated_and_scored(tmp_path):
    cfg, run_dir, endpoints = make_run(tmp_path, ["task.max_new_tokens=6"])
    children = start(run_dir, endpoints, ["replay", "generator-0", "reward-0"])
    logs = ""
    try:
        with Client(run_dir=run_dir, timeout_s=60) as client:
            problems = {"12+34=": "46", "7-9=": "-2", "50+5=": "55"}
            # each answer is right ~40 % of the time at temperature 1 (measured): 24 samples all wrong is ~5e-6
            handles = client.submit([{"text": q, "target": a} for q, a in problems.items()], n=N,
                                    sampling={"temperature": 1.0, "max_new_tokens": 6})
            results = [h.result(timeout_s=120) for h in handles]
            stats = client.stats()
    finally:
        logs = shutdown(children)
    for scored in results:
        assert len(scored) == N, logs
        assert sorted(s.sample.sample_index for s in scored) == list(range(N))
        for s in scored:
            assert s.status == R.ScoreStatus.OK, s.reason
            assert set(s.components) == {"task"} and s.reward in (0.0, 1.0)
            n = len(s.sample.response_token_ids)
            assert 1 <= n <= 6 and len(s.sample.logprobs) == n == len(s.sample.versions)
            assert np.all(np.isfinite(s.sample.logprobs)) and np.all(s.sample.logprobs <= 0)
            assert np.all(s.sample.versions == 0) and s.sample.generator == "generator-0"
            assert s.sample.prompt_token_ids[0] == 1  # BOS from the model's tokenizer
    assert sum(s.reward for scored in results for s in scored) > 0, "the warm-started model should solve some"
    acc = stats["accounting"]
    assert acc["submitted"] == 3 * N and acc["lost"] == 0 and acc["failed"] == 0
