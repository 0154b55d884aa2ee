"""The learner refuses to train on a non-finite reward or behaviour logprob (the hub fails those first)."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.learner.batch_tensors import SeqRecord
from asyncrl.learner.prepare import check_finite


def seq(reward: float = 1.0, logp: float = -0.5) -> SeqRecord:
    return SeqRecord(index=0, group=0, prompt=np.arange(3), response=np.arange(2), behav_logp=np.full(2, logp, np.float32),
                     versions=np.zeros(2, np.int64), temperature=1.0, max_new_tokens=4, reward=reward)


def test_finite_samples_pass_and_non_finite_ones_are_refused():
    check_finite([seq(), seq(reward=-3.0)])
    for bad in (seq(reward=float("nan")), seq(logp=float("-inf"))):
        with pytest.raises(AssertionError, match="non-finite"):
            check_finite([seq(), bad])
