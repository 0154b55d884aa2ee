"""The step's one columnar table, its column -> column phases, the packed token-level estimators and the old
pass's returned results."""

import numpy as np
import pytest
import torch
from learner_helpers import make_batch

from asyncrl.learner import advantages as adv
from asyncrl.learner.batch_tensors import flatten_batch
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.prepare import prepare_batch
from asyncrl.learner.sample_table import SampleTable
from asyncrl.learner.trainer import Trainer


def test_table_columns_match_the_records_and_take_keeps_tokens_with_rows():
    seqs, _ = flatten_batch(make_batch(seed=1, groups=3, n=4))
    table = SampleTable.from_records(seqs)
    assert table.response_len.tolist() == [len(s.response) for s in seqs]
    assert np.array_equal(table.behav_logp, np.concatenate([s.behav_logp for s in seqs]))
    keep = np.arange(len(seqs)) % 3 != 0
    kept = table.take(keep)
    rows = np.flatnonzero(keep)
    assert kept.group.tolist() == [seqs[i].group for i in rows]
    assert np.array_equal(kept.versions, np.concatenate([seqs[i].versions for i in rows]))


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "dr_grpo", "rloo"])
def test_prepared_records_carry_the_tables_final_columns(algorithm):
    prep = prepare_batch(make_batch(seed=0, groups=4, n=4), LearnerConfig(algorithm=algorithm, mini_batches=2), 0, 2, 0)
    t = prep.table
    assert len(t) == len(prep.seqs) and [s.index for s in prep.seqs] == list(range(len(t)))
    assert [s.advantage for s in prep.seqs] == t.advantage.tolist()
    assert [s.loss_weight for s in prep.seqs] == t.loss_weight.tolist()
    mine = sorted(i for mb in prep.micro_batches() for i in mb.seq_index if i >= 0)
    assert mine == np.flatnonzero(t.rank == 0).tolist()  # this rank trains exactly its rows


def test_packed_estimators_equal_row_by_row():
    """One packed call over sequences of different lengths equals each sequence alone (whitening aside)."""
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([3, 1, 5, 2])
    r, v = torch.randn(int(lens.sum()), generator=g), torch.randn(int(lens.sum()), generator=g)
    rets = adv.packed_returns(r, lens, 0.9)
    _, gae_ret = adv.gae.packed(r, lens, v, 0.9, 0.8)
    start = 0
    for n in lens.tolist():
        s = slice(start, start + n)
        torch.testing.assert_close(rets[s], adv.packed_returns(r[s], torch.tensor([n]), 0.9))
        torch.testing.assert_close(gae_ret[s], adv.gae.packed(r[s], torch.tensor([n]), v[s], 0.9, 0.8)[1])
        start += n
    tr = adv.packed_token_rewards(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2, 0, 1]))
    assert tr.tolist() == [0.0, 1.0, 3.0]


@pytest.mark.parametrize(("kw", "source"), [({"off_policy": "none"}, "behaviour"), ({}, "update"),
                                            ({"mini_batches": 2}, "pass"), ({"algorithm": "ppo"}, "pass")])
def test_old_pass_returns_its_results_and_leaves_the_micro_batches_alone(tiny_model, kw, source):
    trainer = Trainer(LearnerConfig(micro_batch_tokens=32, **kw), str(tiny_model), device="cpu")
    prep = prepare_batch(make_batch(seed=3), trainer.cfg, 0, 1, 0)
    before = {id(mb): dict((k, getattr(mb, k)) for k in type(mb).__slots__) for mb in prep.micro_batches()}
    assert trainer._prox_source(prep) == source
    olds = trainer._old_pass(prep, make_batch(seed=3), source)
    assert len(olds) == len(prep.micro_batches())
    assert all((o.prox_logp is None) == (source == "update") for o in olds)
    assert all((o.values is not None) == trainer.cfg.recipe.value_head for o in olds)
    for mb in prep.micro_batches():
        assert all(getattr(mb, k) is v for k, v in before[id(mb)].items())
