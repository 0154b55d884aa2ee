"""TorchEngine.score: forced-token logprobs through the generation path. In deterministic mode they are
bitwise the logprobs recorded at generation, whatever is scored with them; the checks can fail (a
different temperature or a changed token scores differently)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from engine_helpers import drain, engine, request

from asyncrl.engine.torch.forced_group import ForcedGroup
from asyncrl.records import FinishReason, SamplingParams

EOS, STOP = 1, 22


def _requests():
    """A crowded batch: arrivals over several steps, T=1 / 0.7 / top-k / greedy, stop and EOS endings."""
    return {0: [request("hot", [5, 6, 7, 8, 9, 10, 11], n=3, temperature=1.0, seed=0, max_new_tokens=40)],
            1: [request("cool", [3, 4, 5], n=2, temperature=0.7, seed=10, max_new_tokens=16,
                        stop_token_ids=[20, 21, STOP])],
            2: [request("topk", [9, 9, 9, 2], n=2, temperature=1.0, top_k=8, seed=20, max_new_tokens=12)],
            4: [request("greedy", [7, 1, 5], temperature=0.0, max_new_tokens=10)]}


def _generate(device: str, **kw):
    """-> (engine, {rid: request}, {(rid, i): output}) of the crowded batch, generated deterministically."""
    eng = engine(kw.pop("path"), device=device, deterministic=True, max_running=8, **kw)
    arrivals = _requests()
    outs = drain(eng, arrivals)
    return eng, {r.request_id: r for rs in arrivals.values() for r in rs}, outs


def _group(req, outs, samples=None, **sampling) -> ForcedGroup:
    samples = range(req.n) if samples is None else samples
    return ForcedGroup(prompt_token_ids=req.prompt_token_ids, sampling=dataclasses.replace(req.sampling, **sampling),
                       response_token_ids=[outs[(req.request_id, i)].token_ids for i in samples])


def _assert_bitwise(scored, req, outs, samples=None):
    samples = range(req.n) if samples is None else samples
    assert len(scored) == len(samples)
    for logprobs, i in zip(scored, samples, strict=True):
        want = outs[(req.request_id, i)].logprobs
        assert logprobs.dtype == np.float32 and logprobs.shape == want.shape
        assert np.array_equal(logprobs, want), f"{req.request_id}[{i}]: max diff {np.abs(logprobs - want).max()}"


def _check_every_way(eng, reqs, outs) -> None:
    """All groups together (in another order than generated), each alone, subsets of samples."""
    order = ["greedy", "topk", "hot", "cool"]
    for rid, scored in zip(order, eng.score([_group(reqs[r], outs) for r in order]), strict=True):
        _assert_bitwise(scored, reqs[rid], outs)
    for rid, req in reqs.items():
        _assert_bitwise(eng.score([_group(req, outs)])[0], req, outs)
    hot, cool = reqs["hot"], reqs["cool"]
    _assert_bitwise(eng.score([_group(hot, outs, [2])])[0], hot, outs, [2])
    mixed = eng.score([_group(cool, outs, [1]), _group(hot, outs, [2, 0]), _group(reqs["topk"], outs, [1])])
    _assert_bitwise(mixed[0], cool, outs, [1])
    _assert_bitwise(mixed[1], hot, outs, [2, 0])
    _assert_bitwise(mixed[2], reqs["topk"], outs, [1])
    assert eng.blocks.num_free == eng.blocks.num_blocks and not eng.has_work()


@pytest.fixture(scope="module")
def generated(qwen2_path):
    """Generated on one thread like every test here: the autouse one-thread fixture is set up after
    module fixtures, and CPU matmuls round differently with the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _generate("cpu", path=qwen2_path)
    finally:
        torch.set_num_threads(before)


def test_generated_batch_has_every_ending(generated):
    _, _, outs = generated
    endings = {(o.finish_reason, int(o.token_ids[-1]) if o.finish_reason == FinishReason.STOP else None)
               for o in outs.values()}
    assert {(FinishReason.STOP, EOS), (FinishReason.STOP, STOP), (FinishReason.LENGTH, None)} <= endings
    assert len({len(o.token_ids) for o in outs.values()}) >= 4  # responses of different lengths


def test_score_is_bitwise_generation_logprobs_cpu(generated):
    _check_every_way(*generated)


def test_score_detects_other_params_and_tokens(generated):
    eng, reqs, outs = generated
    hot = reqs["hot"]
    colder = eng.score([_group(hot, outs, temperature=0.7)])[0]
    for i, logprobs in enumerate(colder):
        assert not np.array_equal(logprobs, outs[("hot", i)].logprobs)
    changed = outs[("hot", 0)].token_ids.copy()
    changed[3] = (changed[3] + 1) % 97
    group = ForcedGroup(prompt_token_ids=hot.prompt_token_ids, response_token_ids=[changed], sampling=hot.sampling)
    scored, want = eng.score([group])[0][0], outs[("hot", 0)].logprobs
    assert np.array_equal(scored[:3], want[:3]) and scored[3] != want[3]  # the prefix still scores the same


def test_engine_generates_the_same_after_scoring(generated):
    eng, reqs, outs = generated
    eng.score([_group(reqs["hot"], outs)])
    again = drain(eng, _requests())
    assert again.keys() == outs.keys()
    for key, out in outs.items():
        assert np.array_equal(again[key].token_ids, out.token_ids) and np.array_equal(again[key].logprobs, out.logprobs)


def test_score_without_deterministic_mode_is_close(qwen2_path):
    eng = engine(qwen2_path, max_running=8)
    arrivals = _requests()
    outs = drain(eng, arrivals)
    reqs = {r.request_id: r for rs in arrivals.values() for r in rs}
    scored = eng.score([_group(req, outs) for req in reqs.values()])
    for req, group in zip(reqs.values(), scored, strict=True):
        for i, logprobs in enumerate(group):
            np.testing.assert_allclose(logprobs, outs[(req.request_id, i)].logprobs, rtol=0, atol=1e-5)
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_score_of_nothing_and_of_one_token(generated):
    eng, reqs, outs = generated
    assert eng.score([]) == []
    hot = reqs["hot"]
    first = ForcedGroup(prompt_token_ids=hot.prompt_token_ids, sampling=hot.sampling,
                        response_token_ids=[outs[("hot", 1)].token_ids[:1]])
    assert np.array_equal(eng.score([first])[0][0], outs[("hot", 1)].logprobs[:1])


# ---------------------------------------------------------------- input checks


def _forced(prompt=(5, 6, 7), responses=((8, 9),), **sampling) -> ForcedGroup:
    return ForcedGroup(prompt_token_ids=np.asarray(prompt), response_token_ids=[np.asarray(r) for r in responses],
                       sampling=SamplingParams(**sampling))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"prompt": ()}, ValueError, "prompt_token_ids.*non-empty"),
    ({"responses": ()}, ValueError, "at least one response"),
    ({"responses": ((8, 9), ())}, ValueError, r"response_token_ids\[1\].*non-empty"),
    ({"prompt": ((5, 6), (7, 8))}, ValueError, "1-D"),
    ({"responses": ((8.0, 9.0),)}, TypeError, "integers"),
])
def test_forced_group_rejects_malformed_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        _forced(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"prompt": (5, 97)}, r"prompt has token ids outside \[0, 97\)"),
    ({"prompt": (-1, 5)}, "prompt has token ids outside"),
    ({"responses": ((8, 9), (8, 100))}, "response 1 has token ids outside"),
    ({"responses": ((8,),) * 9}, "more than max_running=8"),
    ({"responses": ((8,) * 254,)}, "257 tokens, more than max_model_len=256"),
])
def test_score_rejects_what_the_engine_cannot_take(generated, kwargs, match):
    eng = generated[0]
    with pytest.raises(ValueError, match=match):
        eng.score([_forced(**kwargs)])
    assert eng.blocks.num_free == eng.blocks.num_blocks and not eng.has_work()


def test_score_rejects_too_small_a_cache_and_wrong_types(qwen2_path):
    eng = engine(qwen2_path, num_kv_blocks=4, max_running=4)
    with pytest.raises(ValueError, match="more KV blocks"):
        eng.score([_forced(responses=((8,) * 20,))])
    with pytest.raises(TypeError, match="ForcedGroup"):
        eng.score([((5, 6), [(7,)], SamplingParams())])
    assert eng.score([_forced(responses=((8,) * 10,))])[0][0].shape == (10,)


def test_score_needs_an_idle_open_engine(qwen2_path):
    eng = engine(qwen2_path, max_running=4)
    eng.add(request("busy", [5, 6, 7], max_new_tokens=3))
    with pytest.raises(RuntimeError, match="idle engine"):
        eng.score([_forced()])
    drain(eng)
    eng.pause("continue")
    with pytest.raises(RuntimeError, match="paused"):
        eng.score([_forced()])
    eng.resume()
    assert len(eng.score([_forced()])[0]) == 1
    eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        eng.score([_forced()])


# ---------------------------------------------------------------- GPU: bf16, fused sampler, CUDA graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_score_is_bitwise_generation_logprobs_cuda_bf16_graphs(qwen2_path):
    eng, reqs, outs = _generate("cuda", path=qwen2_path)
    assert eng.dtype == torch.bfloat16 and eng.runner.graphs is not None and eng.runner.fused_sampling
    _check_every_way(eng, reqs, outs)
    colder = eng.score([_group(reqs["hot"], outs, temperature=0.7)])[0]
    assert not any(np.array_equal(lp, outs[("hot", i)].logprobs) for i, lp in enumerate(colder))
