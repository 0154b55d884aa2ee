"""Multi-turn episodes on the torch engine with its prefix cache (tiny random Qwen2, CPU): every turn after the
first prefills only what the KV of the turns before lacks (the last model token, the environment's tokens, and
at most a partly filled page), and the episodes are token for token those of an engine without the cache."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import transformers

from asyncrl import records as R
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.engine.torch.model import build_from_hf
from asyncrl.generator.worker import GeneratorWorker
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.multi_turn import MultiTurn
from tests.doubles.worker_fakes import FakeHub

from rollout_fakes import ENV_IDS, TURNS, Again, IdTokenizer

pytestmark = pytest.mark.timeout(120)
PAGE, TURN_TOKENS = 4, 6


class Metered:
    """The engine, with each request's context length and each step's prefill and cache counters kept."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine, self.turns = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def add(self, request):
        self.turns.append([request.request_id, len(request.prompt_token_ids), None, None])
        self.engine.add(request)

    def step(self):
        before = self.engine.stats()
        out = self.engine.step()
        after = self.engine.stats()
        if after.prefill_tokens != before.prefill_tokens:  # one episode: one prefill per step at most
            self.turns[-1][2:] = [after.prefill_tokens - before.prefill_tokens,
                                  after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens]
        return out


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=97, max_position_embeddings=256,
                                      tie_word_embeddings=True)
    return transformers.Qwen2ForCausalLM(config).eval()


def episode(hf, prefix_cache: bool) -> tuple[R.Sample, Metered]:
    engine = Metered(TorchEngine.from_model(build_from_hf(hf), max_running=4, num_kv_blocks=64, kv_block_size=PAGE,
                                            prefix_cache=prefix_cache))
    sampling = R.SamplingParams(max_new_tokens=TURN_TOKENS, temperature=0.0, ignore_eos=True)
    hub = FakeHub([R.Prompt(prompt_id="p", n=1, token_ids=np.arange(10, 19, dtype=np.int32), sampling=sampling)])
    cfg = RolloutConfig(environment="x:y", max_turns=TURNS, max_total_tokens=40)
    rollout = MultiTurn(cfg, Again, IdTokenizer(), 97)
    worker = GeneratorWorker(name="g", engine=engine, hub=hub, tokenizer=IdTokenizer(), max_running=4, rollout=rollout)
    deadline = time.monotonic() + 60
    while not hub.sent and time.monotonic() < deadline:
        worker.run_once()
    rollout.close()
    (sample,) = hub.sent[0].samples
    return sample, engine


def test_each_next_turn_prefills_only_what_the_earlier_turns_kv_lacks(hf):
    sample, engine = episode(hf, prefix_cache=True)
    plain, _ = episode(hf, prefix_cache=False)
    assert sample.rollout["turns"] == TURNS
    assert sample.response_token_ids.tolist() == plain.response_token_ids.tolist()
    np.testing.assert_allclose(sample.logprobs, plain.logprobs, atol=2e-6, rtol=0)
    (_, first, computed, hit), *later = engine.turns
    assert (computed, hit) == (first, 0)
    kv = first + TURN_TOKENS - 1  # every token of turn 1 but its last has its KV
    for _, context, computed, hit in later:
        assert hit == kv // PAGE * PAGE and computed == context - hit
        new = context - kv  # the last model token and the environment's tokens
        assert new == 1 + len(ENV_IDS) and computed - new < PAGE
        kv = context + TURN_TOKENS - 1


def episodes(hf, overlap: bool) -> tuple[list[R.Sample], TorchEngine]:
    """Groups of sampled multi-turn episodes arriving over time (the worker leases as slots free), so turns after
    the first are prefilled while other episodes decode: the overlapped prefill's case."""
    engine = TorchEngine.from_model(build_from_hf(hf), max_running=4, num_kv_blocks=128, kv_block_size=PAGE,
                                    prefix_cache=True, overlap=overlap)
    sampling = R.SamplingParams(max_new_tokens=TURN_TOKENS, temperature=1.0, seed=7, ignore_eos=True)
    prompts = [R.Prompt(prompt_id=f"p{i}", n=2, token_ids=np.arange(10 + i, 19 + 2 * i, dtype=np.int32),
                        sampling=sampling) for i in range(4)]
    hub = FakeHub(prompts)
    cfg = RolloutConfig(environment="x:y", max_turns=TURNS, max_total_tokens=40, max_episodes=8)
    rollout = MultiTurn(cfg, Again, IdTokenizer(), 97)
    worker = GeneratorWorker(name="g", engine=engine, hub=hub, tokenizer=IdTokenizer(), max_running=8,
                             group_size=2, rollout=rollout)
    deadline = time.monotonic() + 60
    while sum(len(b.samples) for b in hub.sent) < 8 and time.monotonic() < deadline:
        worker.run_once()
    rollout.close()
    return sorted((s for b in hub.sent for s in b.samples), key=lambda s: (s.prompt_id, s.sample_index)), engine


def test_overlapped_prefill_gives_the_same_episodes(hf):
    """Each turn's prefill overlapped with the decode of others (TorchEngine overlap on the CPU, where it runs
    synchronously through the same code): the episodes are token for token those of the synchronous loop."""
    ahead, eng = episodes(hf, overlap=True)
    sync, _ = episodes(hf, overlap=False)
    assert eng.counters["prefills_overlapped"] > 0 and len(ahead) == len(sync) == 8
    for a, s in zip(ahead, sync):
        assert (a.prompt_id, a.sample_index, a.rollout["turns"]) == (s.prompt_id, s.sample_index, TURNS)
        assert a.response_token_ids.tolist() == s.response_token_ids.tolist()
        assert a.loss_mask.tolist() == s.loss_mask.tolist()
        np.testing.assert_allclose(a.logprobs, s.logprobs, atol=2e-6, rtol=0)
