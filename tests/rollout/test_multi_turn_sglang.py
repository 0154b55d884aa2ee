"""Multi-turn episodes on the SGLang adapter (against the double): each turn continues by input ids, the
server sees exactly the episode's ids so far, and every model token's logprob is the server's for it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.generator.worker import GeneratorWorker
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.multi_turn import MultiTurn
from tests.doubles.sglang_double import SGLangDouble
from tests.doubles.worker_fakes import FakeHub

from rollout_fakes import ENV_IDS, TURNS, Again, IdTokenizer

pytestmark = pytest.mark.timeout(60)


def test_episodes_continue_by_input_ids_on_sglang():
    with SGLangDouble() as double, SGLangEngine(SGLangConfig(base_url=double.url, request_timeout_s=10.0,
                                                            generate_timeout_s=20.0)) as engine:
        prompt = np.asarray([7, 8, 9], np.int32)
        hub = FakeHub([R.Prompt(prompt_id="p", n=2, token_ids=prompt,
                                sampling=R.SamplingParams(max_new_tokens=6, temperature=1.0))])
        rollout = MultiTurn(RolloutConfig(environment="x:y", max_turns=TURNS, max_total_tokens=40), Again, IdTokenizer(),
                            engine.limits().vocab_size)
        worker = GeneratorWorker(name="g", engine=engine, hub=hub, tokenizer=IdTokenizer(), max_running=8,
                                 rollout=rollout)
        deadline = time.monotonic() + 30
        while sum(len(b.samples) for b in hub.sent) < 2 and time.monotonic() < deadline:
            worker.run_once()
        rollout.close()
        samples = [s for b in hub.sent for s in b.samples]
        sent = [body["input_ids"] for path, body in double.calls if path == "/generate"]
    assert len(samples) == 2
    for s in samples:
        assert s.rollout["turns"] == 3 and s.env_reward == 1.0
        mask = s.loss_mask.astype(bool)
        resp = s.response_token_ids
        assert list(resp[~mask]) == ENV_IDS * 2  # the environment's ids, exactly, between the turns
        for cut in np.flatnonzero(np.diff(mask.astype(int)) == 1) + 1:  # where the next model turn starts
            assert list(prompt) + list(resp[:cut]) in sent  # the server continued from exactly these ids
        # each model token's logprob is the double's for that token after exactly the episode's ids so far
        starts = [0, *(np.flatnonzero(np.diff(mask.astype(int)) == 1) + 1)]
        for start in starts:
            end = start + int(np.argmin(mask[start:])) if not mask[start:].all() else len(resp)
            ctx = list(prompt) + list(resp[:start])
            for i in range(start, end):
                lp = double.model.logprobs("default", ctx, i - start, 1.0)[resp[i]]
                assert s.logprobs[i] == pytest.approx(lp, abs=1e-5)
