"""TorchEngine with its prefix cache (CPU, tiny fp32 models): a resubmitted prompt hits and reproduces the
uncached outputs, a weight update keys out every page, an episode's next turn prefills only its new tokens,
and eviction under a small KV budget never corrupts a running sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import drain, engine, request

PAGE = 8
# CPU sgemm gives each row of a product with 6 or more rows the same bits whatever the row count (fewer rows take
# another kernel; measured on the tiny shapes, torch 2.13, one thread). A hit recomputes the prompt's last page:
# with a prompt of whole 8-token pages that is 8 rows, so a hit must give the uncached run's bits exactly, and any
# difference would be wrong KV, not rounding. Other prompt lengths agree to rounding (~5e-7).
PROMPT = [int(t) for t in np.random.default_rng(0).integers(2, 97, 3 * PAGE)]


def cached_engine(path, **kw):
    return engine(path, kv_block_size=PAGE, prefix_cache=True, **kw)


def greedy(rid, prompt, **kw):
    kw.setdefault("max_new_tokens", 10)
    return request(rid, prompt, temperature=0.0, ignore_eos=True, **kw)


def only(outs):
    (out,) = outs.values()
    return out


def delta(eng, run):
    """Run `run()` -> (its outputs, prefill tokens computed, tokens served by the prefix cache)."""
    before = eng.stats()
    outs = run()
    after = eng.stats()
    hits = after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens
    return outs, after.prefill_tokens - before.prefill_tokens, hits


def perturbed(eng, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(name, p + 0.05 * torch.randn(p.shape, generator=g)) for name, p in eng.model.named_parameters()
            if name.endswith(("q_proj.weight", "down_proj.weight", "norm.weight"))]


def update(eng, weights, version):
    eng.begin_weight_update()
    eng.load_weights(weights)
    eng.end_weight_update(version)


# ------------------------------------------------------------------ hits


def test_identical_request_hits_and_gives_the_uncached_bits(qwen2_path):
    plain = only(drain(engine(qwen2_path, kv_block_size=PAGE), {0: [greedy("r", PROMPT)]}))
    eng = cached_engine(qwen2_path)
    first, computed, hit = delta(eng, lambda: only(drain(eng, {0: [greedy("a", PROMPT)]})))
    assert (computed, hit) == (len(PROMPT), 0)
    second, computed, hit = delta(eng, lambda: only(drain(eng, {0: [greedy("b", PROMPT)]})))
    assert (computed, hit) == (PAGE, len(PROMPT) - PAGE)  # the last page is recomputed: its logits are needed
    for out in (first, second):
        assert out.token_ids.tolist() == plain.token_ids.tolist()
        assert np.array_equal(out.logprobs, plain.logprobs)  # bitwise


@pytest.mark.parametrize("extra", [1, 3, 5])
def test_ragged_prompts_hit_and_agree_to_rounding(qwen2_path, extra):
    prompt = PROMPT + PROMPT[:extra]
    plain = only(drain(engine(qwen2_path, kv_block_size=PAGE), {0: [greedy("r", prompt)]}))
    eng = cached_engine(qwen2_path)
    drain(eng, {0: [greedy("a", prompt)]})
    out, computed, hit = delta(eng, lambda: only(drain(eng, {0: [greedy("b", prompt)]})))
    assert (computed, hit) == (extra, len(PROMPT))
    assert out.token_ids.tolist() == plain.token_ids.tolist()
    np.testing.assert_allclose(out.logprobs, plain.logprobs, atol=2e-6, rtol=0)


def test_groups_and_a_running_request_share_cached_pages(qwen2_path):
    eng = cached_engine(qwen2_path)
    eng.add(request("a", PROMPT, n=2, temperature=1.0, seed=5, max_new_tokens=30, ignore_eos=True))
    eng.step()  # a prefilled: its pages are registered while it still runs
    outs, computed, hit = delta(eng, lambda: drain(eng, {0: [request("b", PROMPT, n=3, temperature=1.0, seed=5,
                                                                     max_new_tokens=30, ignore_eos=True)]}))
    assert (computed, hit) == (PAGE, 2 * PAGE)  # one prefill for the three samples
    alone = drain(engine(qwen2_path, kv_block_size=PAGE), {0: [request("b", PROMPT, n=3, temperature=1.0, seed=5,
                                                                      max_new_tokens=30, ignore_eos=True)]})
    for key, out in alone.items():  # decoded beside "a" here: rows of other batch sizes, equal up to rounding
        assert outs[key].token_ids.tolist() == out.token_ids.tolist()
        np.testing.assert_allclose(outs[key].logprobs, out.logprobs, atol=2e-6, rtol=0)


# ------------------------------------------------------------------ weights


def test_after_a_weight_update_no_new_request_reads_old_kv(qwen2_path):
    eng = cached_engine(qwen2_path)
    drain(eng, {0: [greedy("a", PROMPT)]})
    old_keys = eng.blocks.cache.keys(PROMPT, 3, [])
    assert len(eng.blocks.cache.match(old_keys)) == 3
    weights = perturbed(eng)
    update(eng, weights, 1)
    assert eng.blocks.cache.match(old_keys) == [] and not eng.blocks.cache.block_of  # keyed out and forgotten
    out, computed, hit = delta(eng, lambda: only(drain(eng, {0: [greedy("b", PROMPT)]})))
    assert (computed, hit) == (len(PROMPT), 0)
    fresh = engine(qwen2_path, kv_block_size=PAGE)
    update(fresh, weights, 1)
    ref = only(drain(fresh, {0: [greedy("r", PROMPT)]}))
    assert out.token_ids.tolist() == ref.token_ids.tolist() and np.array_equal(out.logprobs, ref.logprobs)
    assert set(out.versions.tolist()) == {1}
    _, computed, hit = delta(eng, lambda: drain(eng, {0: [greedy("c", PROMPT)]}))
    assert (computed, hit) == (PAGE, 2 * PAGE)  # the new weights' pages are cached in turn


def test_an_update_that_repeats_the_version_number_still_keys_out_the_pages(qwen2_path):
    eng = cached_engine(qwen2_path)
    drain(eng, {0: [greedy("a", PROMPT)]})
    update(eng, perturbed(eng), 0)
    _, computed, hit = delta(eng, lambda: drain(eng, {0: [greedy("b", PROMPT)]}))
    assert (computed, hit) == (len(PROMPT), 0)


def test_a_sequence_continuing_across_an_update_keeps_its_kv_and_caches_none_of_it(qwen2_path):
    def run(eng):
        eng.add(greedy("a", PROMPT, max_new_tokens=20))
        for _ in range(6):
            eng.step()
        eng.pause("continue")
        update(eng, perturbed(eng), 1)
        eng.resume()
        return only(drain(eng))

    plain, eng = run(engine(qwen2_path, kv_block_size=PAGE)), cached_engine(qwen2_path)
    out = run(eng)
    assert out.token_ids.tolist() == plain.token_ids.tolist() and np.array_equal(out.logprobs, plain.logprobs)
    assert 0 in out.versions and 1 in out.versions  # it continued on the old KV: pause("continue")
    assert not eng.blocks.cache.block_of  # its pages mix two weights: none registered
    history = PROMPT + out.token_ids.tolist()
    _, computed, hit = delta(eng, lambda: drain(eng, {0: [greedy("b", history, max_new_tokens=2)]}))
    assert (computed, hit) == (len(history), 0)


# ------------------------------------------------------------------ turns, eviction, modes


def test_a_next_turn_prefills_only_its_new_tokens(qwen2_path):
    eng = cached_engine(qwen2_path)
    turn1 = only(drain(eng, {0: [greedy("t1", PROMPT, max_new_tokens=13)]}))
    history = PROMPT + turn1.token_ids.tolist() + [40, 41, 42]  # the model's turn, then the environment's tokens
    _, computed, hit = delta(eng, lambda: drain(eng, {0: [greedy("t2", history, max_new_tokens=5)]}))
    kv_after_turn1 = len(PROMPT) + 13 - 1  # every token of turn 1 but its last had its KV computed
    assert hit == kv_after_turn1 // PAGE * PAGE and computed == len(history) - hit
    assert computed - (len(history) - kv_after_turn1) < PAGE  # besides the new tokens, at most a partial page


@pytest.mark.parametrize("overlap", [False, True])
def test_eviction_under_a_small_budget_never_corrupts_a_running_sequence(qwen2_path, overlap):
    stems = [PROMPT[:16], PROMPT[8:24]]
    reqs = [greedy(f"r{i}", stems[i % 2] + [3 + i, 4 + i], max_new_tokens=14 + i % 5) for i in range(12)]
    arrivals = {0: reqs[:4], 3: reqs[4:8], 9: reqs[8:]}
    roomy = drain(engine(qwen2_path, kv_block_size=PAGE), dict(arrivals))
    eng = cached_engine(qwen2_path, num_kv_blocks=12, max_running=4, overlap=overlap)
    squeezed = drain(eng, dict(arrivals))
    assert eng.blocks.cache.evictions > 0 and eng.stats().prefix_cache_hit_tokens > 0
    for key, out in roomy.items():
        assert squeezed[key].token_ids.tolist() == out.token_ids.tolist(), key
        np.testing.assert_allclose(squeezed[key].logprobs, out.logprobs, atol=2e-6, rtol=0)
    assert eng.blocks.num_free == 12 and not any(eng.blocks.ref_counts)


def test_a_preempted_sequence_resumes_from_its_own_cached_pages(qwen2_path):
    reqs = [greedy(f"r{i}", [3 + i] + PROMPT[:12], n=2, max_new_tokens=20) for i in range(4)]
    roomy = drain(engine(qwen2_path, kv_block_size=PAGE), {0: reqs})
    eng = cached_engine(qwen2_path, num_kv_blocks=12)
    squeezed = drain(eng, {0: reqs})
    assert eng.scheduler.num_preemptions > 0 and eng.stats().prefix_cache_hit_tokens > 0
    for key, out in roomy.items():
        assert squeezed[key].token_ids.tolist() == out.token_ids.tolist()


def test_deterministic_mode_refuses_the_prefix_cache(qwen2_path):
    with pytest.raises(ValueError, match="prefix_cache=True with deterministic=True"):
        engine(qwen2_path, deterministic=True, prefix_cache=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_hits_agree_with_the_uncached_run(qwen2_path, dtype):
    """On CUDA (Triton rotary + KV store, CUDA graphs, overlapped decode) a hit's new tokens attend to the cached
    pages through `attention_after_prefix`: the tokens of an uncached run, logprobs within the dtype's rounding."""
    def reqs(tag):
        return [greedy(f"{tag}{i}", PROMPT[: 8 + 3 * i] + [50 + i], max_new_tokens=16) for i in range(6)]

    plain = drain(engine(qwen2_path, device="cuda", dtype=dtype, kv_block_size=PAGE), {0: reqs("r")})
    eng = cached_engine(qwen2_path, device="cuda", dtype=dtype)
    drain(eng, {0: reqs("a")})
    before = eng.stats().prefix_cache_hit_tokens
    again = drain(eng, {0: reqs("r")})
    assert eng.overlap and eng.stats().prefix_cache_hit_tokens - before == sum(8 * ((8 + 3 * i) // 8) for i in range(6))
    same = [k for k, out in plain.items() if again[k].token_ids.tolist() == out.token_ids.tolist()]
    assert len(same) >= len(plain) - (2 if dtype == "bfloat16" else 0)
    for k in same:
        np.testing.assert_allclose(again[k].logprobs, plain[k].logprobs, rtol=0,
                                   atol=1e-4 if dtype == "float32" else 5e-2)
