"""The fused sampler (kernels.sampler.sample_fused) against the torch sampler it stands in for.

"cpu" runs the kernel in the Triton interpreter (TRITON_INTERPRET=1 for the whole run, as in
tests/engine/test_decode_attention_split.py); "cuda" the compiled kernel. Without Triton both skip.
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.engine.torch.sampler import SamplingBatch, sample

pytestmark = pytest.mark.filterwarnings(  # Triton < 3.7's interpreter under numpy 2.3
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")



@pytest.fixture
def device(triton_device):
    return triton_device


def _case(device: str, rows: int = 6, vocab: int = 5003):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, vocab, generator=g) * 3
    # a greedy row with a four-way tie, within one 2048-wide block (11, 1500), across blocks (4000) and splits
    # (the last entry):
    # the first index wins, like argmax
    logits[0, 11] = logits[0, 1500] = logits[0, 4000] = logits[0, vocab - 1] = logits[0].max() + 40
    temps = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.9, 1.0])[:rows]
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    steps = torch.randint(0, 10_000, (rows,), generator=g)
    forced = torch.full((rows,), -1, dtype=torch.int64)
    forced[4], forced[5] = vocab - 1, 11
    return [t.to(device) for t in (logits, temps, seeds, steps, forced)]


def _reference(logits, temps, seeds, steps, forced) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = logits.shape
    batch = SamplingBatch(temperatures=temps.cpu(), top_ps=torch.ones(rows), top_ks=torch.full((rows,), vocab),
                          seeds=seeds.cpu(), steps=steps.cpu(), needs_truncation=False, forced=forced.cpu())
    return sample(logits.cpu().float(), batch)


@pytest.mark.parametrize("vocab", [5003, 40961])  # splits of one block (3 of them); of two blocks (11, the last partial)
def test_fused_sampler_matches_the_torch_sampler(device, vocab):
    from asyncrl.engine.torch.kernels.sampler import sample_fused, vocab_splits

    assert vocab_splits(vocab) == {5003: (3, 1), 40961: (11, 2)}[vocab]
    case = _case(device, vocab=vocab)
    out = sample_fused(*case).cpu()  # [2, rows] float64
    tokens, logprobs = _reference(*case)
    assert out[0].long().tolist() == tokens.tolist()
    assert int(out[0, 0]) == 11  # greedy tie within a block, across blocks and splits: the earlier index, like argmax
    assert out[0, 4] == vocab - 1 and out[0, 5] == 11  # forced rows take their tokens
    torch.testing.assert_close(out[1].float(), logprobs, rtol=0, atol=2e-5)


def test_fused_sampler_draws_from_the_softmax(device):
    from asyncrl.engine.torch.kernels.sampler import sample_fused

    rows, vocab = 1200, 2100  # two blocks of 2048, so the rescan crosses a block border
    logits = torch.full((vocab,), -30.0)
    logits[[0, 1, 2, 2047, 2048, 2099]] = torch.tensor([2.0, 1.0, 0.0, 0.5, 1.5, -1.0])
    want = torch.softmax(logits / 0.8, -1)
    out = sample_fused(logits.repeat(rows, 1).to(device), torch.full((rows,), 0.8, device=device),
                       torch.arange(rows, device=device) * 7919, torch.zeros(rows, dtype=torch.int64, device=device))
    freq = torch.bincount(out[0].cpu().long(), minlength=vocab).float() / rows
    assert (freq - want).abs().max() < 0.05  # ~3.5 standard errors at 1,200 draws


def test_forcing_the_sampled_token_scores_it_bitwise(device):
    from asyncrl.engine.torch.kernels.sampler import sample_fused

    logits, temps, seeds, steps, _ = _case(device)
    sampled = sample_fused(logits, temps, seeds, steps)
    forced = sample_fused(logits, temps, seeds, steps, sampled[0].long())
    assert torch.equal(forced, sampled)


def test_out_buffer_gets_the_same_samples(device):
    """`out=`: a wider [2, max_batch] buffer (the decode steps' `sampled`) receives rows [:batch] bitwise as a new
    tensor would, and its other columns are left alone."""
    from asyncrl.engine.torch.kernels.sampler import sample_fused

    logits, temps, seeds, steps, _ = _case(device)
    batch = logits.shape[0]
    out = torch.full((2, batch + 3), -9.0, dtype=torch.float64, device=logits.device)
    got = sample_fused(logits, temps, seeds, steps, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (2, batch)
    assert torch.equal(got, sample_fused(logits, temps, seeds, steps))
    assert (out[:, batch:] == -9.0).all()
