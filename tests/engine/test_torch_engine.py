"""TorchEngine on tiny random models (CPU, fp32): parity with Hugging Face, batching invariance,
sampling controls, n samples sharing one prefill, abort / pause, weight updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from engine_helpers import drain, engine, hf_logprobs, request

from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.engine.torch.model.config import ArchConfig
from asyncrl.records import FinishReason

PROMPT = [5, 6, 7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def hf_models(tiny_models):
    load = transformers.AutoModelForCausalLM.from_pretrained
    return {k: load(p, dtype=torch.float32) for k, p in tiny_models.items()}


# ------------------------------------------------------------------ parity with Hugging Face


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_logprobs_match_hf_forward(tiny_models, hf_models, arch):
    eng = engine(tiny_models[arch])
    temps = {"t07": 0.7, "t10": 1.0, "greedy": 0.0, "topp": 0.9}
    reqs = [
        request(rid, PROMPT[: 3 + i], n=2, temperature=t, seed=i, max_new_tokens=24, ignore_eos=True,
                top_p=0.8 if rid == "topp" else 1.0, top_k=20 if rid == "topp" else -1)
        for i, (rid, t) in enumerate(temps.items())
    ]
    outs = drain(eng, {0: reqs[:2], 3: reqs[2:]})
    assert len(outs) == 8
    worst = 0.0
    for (rid, _), out in outs.items():
        prompt = PROMPT[: 3 + list(temps).index(rid)]
        ref = hf_logprobs(hf_models[arch], prompt, out.token_ids, temps[rid])
        worst = max(worst, (ref - torch.from_numpy(out.logprobs)).abs().max().item())
        assert out.logprobs.dtype == np.float32 and len(out.token_ids) == 24
    assert worst <= 1e-5


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_matches_hf_generate(tiny_models, hf_models, arch):
    outs = drain(engine(tiny_models[arch]), {0: [request("g", PROMPT, temperature=0.0, max_new_tokens=20)]})
    ref = hf_models[arch].generate(torch.tensor([PROMPT]), max_new_tokens=20, do_sample=False)
    assert outs[("g", 0)].token_ids.tolist() == ref[0, len(PROMPT):].tolist()


# ------------------------------------------------------------------ batching and seeds


def _mixed_requests():
    return [
        request("a", [3, 4, 5], n=2, temperature=1.0, seed=11),
        request("b", [20, 21, 22, 23, 24, 25, 26, 27, 28], temperature=0.7, seed=12, top_k=10),
        request("c", [40], n=3, temperature=1.2, seed=13, top_p=0.9, max_new_tokens=9),
        request("d", [50, 51, 52, 53, 54], temperature=0.0, max_new_tokens=7),
    ]


def test_continuous_batching_matches_one_at_a_time(qwen2_path):
    reqs = _mixed_requests()
    batched = drain(engine(qwen2_path), {0: reqs[:1], 2: reqs[1:3], 5: reqs[3:]})
    for req in reqs:
        alone = drain(engine(qwen2_path), {0: [req]})
        for key, out in alone.items():
            assert batched[key].token_ids.tolist() == out.token_ids.tolist(), key
            np.testing.assert_allclose(batched[key].logprobs, out.logprobs, atol=1e-5)


def test_preemption_keeps_tokens(qwen2_path):
    reqs = [request(f"r{i}", [3 + i, 4, 5, 6, 7], n=2, temperature=1.0, seed=i, max_new_tokens=20, ignore_eos=True)
            for i in range(4)]
    roomy = drain(engine(qwen2_path), {0: reqs})
    tight = engine(qwen2_path, num_kv_blocks=14)
    squeezed = drain(tight, {0: reqs})
    assert tight.scheduler.num_preemptions > 0
    for key, out in roomy.items():
        assert squeezed[key].token_ids.tolist() == out.token_ids.tolist()
    assert tight.blocks.num_free == 14


def test_seeded_sampling_is_reproducible(qwen2_path):
    def req(seed):
        return request("s", PROMPT, n=2, temperature=1.0, seed=seed, max_new_tokens=16)

    first = drain(engine(qwen2_path), {0: [req(7)]})
    again = drain(engine(qwen2_path), {0: [req(7)]})
    other = drain(engine(qwen2_path), {0: [req(8)]})
    assert first[("s", 0)].token_ids.tolist() == again[("s", 0)].token_ids.tolist()
    assert first[("s", 1)].token_ids.tolist() == other[("s", 0)].token_ids.tolist()  # sample i uses seed + i
    assert first[("s", 0)].token_ids.tolist() != other[("s", 0)].token_ids.tolist()
    unseeded = [drain(engine(qwen2_path, seed=1), {0: [request("u", PROMPT, max_new_tokens=16)]}) for _ in range(2)]
    assert unseeded[0][("u", 0)].token_ids.tolist() == unseeded[1][("u", 0)].token_ids.tolist()


# ------------------------------------------------------------------ n samples, stop, length


def test_n_samples_share_one_prefill(qwen2_path):
    eng = engine(qwen2_path)
    outs = drain(eng, {0: [request("n", PROMPT + [12, 13], n=4, temperature=1.0, seed=3)]})
    assert eng.counters["prefills"] == 1 and eng.counters["prefill_tokens"] == len(PROMPT) + 2
    seqs = {tuple(out.token_ids.tolist()) for out in outs.values()}
    assert len(seqs) == 4  # the samples differ
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_max_new_tokens_and_stop_tokens(qwen2_path):
    base = drain(engine(qwen2_path), {0: [request("m", PROMPT, temperature=1.0, seed=5, max_new_tokens=15,
                                                  ignore_eos=True)]})
    tokens = base[("m", 0)].token_ids.tolist()
    assert len(tokens) == 15 and base[("m", 0)].finish_reason == FinishReason.LENGTH
    stop = tokens[6]
    outs = drain(engine(qwen2_path), {0: [request("m", PROMPT, temperature=1.0, seed=5, max_new_tokens=15,
                                                  ignore_eos=True, stop_token_ids=[stop])]})
    out = outs[("m", 0)]
    assert out.finish_reason == FinishReason.STOP
    assert out.token_ids.tolist() == tokens[: tokens.index(stop) + 1]


def test_eos_from_config_and_ignore_eos(qwen2_path):
    eng = engine(qwen2_path)
    assert eng.loop.eos_token_ids == frozenset({1})  # from config.json / generation_config.json
    base = drain(eng, {0: [request("e", PROMPT, temperature=1.0, seed=5, max_new_tokens=15, ignore_eos=True)]})
    tokens = base[("e", 0)].token_ids.tolist()
    eng.loop.eos_token_ids = frozenset({tokens[4]})
    stopped = drain(eng, {0: [request("e", PROMPT, temperature=1.0, seed=5, max_new_tokens=15)]})
    assert stopped[("e", 0)].token_ids.tolist() == tokens[: tokens.index(tokens[4]) + 1]
    assert stopped[("e", 0)].finish_reason == FinishReason.STOP
    ignored = drain(eng, {0: [request("e", PROMPT, temperature=1.0, seed=5, max_new_tokens=15, ignore_eos=True)]})
    assert ignored[("e", 0)].token_ids.tolist() == tokens


# ------------------------------------------------------------------ abort and pause


def _step_n(eng, n):
    outs = []
    for _ in range(n):
        outs += eng.step()
    return outs


def test_abort_returns_partial_outputs(qwen2_path):
    eng = engine(qwen2_path)
    eng.add(request("x", PROMPT, n=2, temperature=1.0, seed=1, max_new_tokens=30, ignore_eos=True))
    eng.add(request("y", PROMPT, temperature=1.0, seed=2, max_new_tokens=30, ignore_eos=True))
    assert _step_n(eng, 4) == []
    aborted = eng.abort(["x"])
    assert sorted(o.sample_index for o in aborted) == [0, 1]
    assert all(o.finish_reason == FinishReason.ABORT and 0 < len(o.token_ids) < 30 for o in aborted)
    assert all(len(o.versions) == len(o.logprobs) == len(o.token_ids) for o in aborted)
    rest = drain(eng)
    assert list(rest) == [("y", 0)] and len(rest[("y", 0)].token_ids) == 30
    assert eng.abort(["x", "unknown"]) == []
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_pause_abort_returns_everything(qwen2_path):
    eng = engine(qwen2_path, max_running=2)
    eng.add(request("x", PROMPT, n=2, temperature=1.0, seed=1, max_new_tokens=30))
    eng.add(request("w", PROMPT, temperature=1.0, seed=1, max_new_tokens=30))  # waits: max_running=2
    _step_n(eng, 2)
    outs = eng.pause("abort")
    assert {(o.request_id, o.sample_index) for o in outs} == {("x", 0), ("x", 1), ("w", 0)}
    assert all(o.finish_reason == FinishReason.ABORT for o in outs)
    assert len(next(o for o in outs if o.request_id == "w").token_ids) == 0
    assert not eng.has_work() and eng.step() == []
    eng.resume()
    assert len(drain(eng, {0: [request("x", PROMPT, max_new_tokens=3)]})) == 1  # the id is free again


def test_pause_continue_keeps_state(qwen2_path):
    def req():
        return request("p", PROMPT, n=2, temperature=1.0, seed=4, max_new_tokens=20, ignore_eos=True)

    ref = drain(engine(qwen2_path), {0: [req()]})
    eng = engine(qwen2_path)
    eng.add(req())
    _step_n(eng, 5)
    assert eng.pause("continue") == []
    before = dict(eng.counters)
    assert _step_n(eng, 3) == [] and eng.counters == before and eng.stats().running == 2
    eng.resume()
    outs = drain(eng)
    for key, out in ref.items():
        assert outs[key].token_ids.tolist() == out.token_ids.tolist()


# ------------------------------------------------------------------ weight updates


def _perturbed(hf_model, scale=0.05):
    torch.manual_seed(123)
    return {n: p.detach() + scale * torch.randn_like(p) for n, p in hf_model.named_parameters()}


def test_weight_update_changes_outputs_and_stamps_versions(tiny_models, hf_models):
    path, hf = tiny_models["llama"], hf_models["llama"]
    def req(rid):
        return request(rid, PROMPT, temperature=0.7, seed=9, max_new_tokens=20, ignore_eos=True)

    ref = drain(engine(path), {0: [req("u")]})[("u", 0)]
    eng = engine(path)
    eng.add(req("u"))
    _step_n(eng, 5)  # step 1: prefill + first decode, then one token per step
    eng.pause("continue")
    done = eng.scheduler.running[0].num_outputs
    assert done == 6
    new = _perturbed(hf)
    eng.begin_weight_update()
    eng.load_weights(list(new.items())[:5])
    eng.load_weights(list(new.items())[5:])
    eng.end_weight_update(3)
    eng.resume()
    out = drain(eng)[("u", 0)]
    assert eng.weight_version == 3 and eng.stats().weight_version == 3
    assert out.versions.tolist() == [0] * done + [3] * (20 - done)
    assert out.token_ids[:done].tolist() == ref.token_ids[:done].tolist()
    assert out.token_ids.tolist() != ref.token_ids.tolist()
    # a fresh request runs entirely under the new weights: parity with HF carrying them
    fresh = drain(eng, {0: [req("v")]})[("v", 0)]
    assert set(fresh.versions.tolist()) == {3}
    updated = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    updated.load_state_dict(new, strict=False)
    ref_lp = hf_logprobs(updated, PROMPT, fresh.token_ids, 0.7)
    assert (ref_lp - torch.from_numpy(fresh.logprobs)).abs().max().item() <= 1e-5


def test_tied_embedding_update_reaches_lm_head(qwen2_path, hf_models):
    eng = engine(qwen2_path)
    weight = hf_models["qwen2"].model.embed_tokens.weight.detach() * 2.0
    eng.begin_weight_update()
    eng.load_weights([("model.embed_tokens.weight", weight)])
    eng.end_weight_update(1)
    assert torch.equal(eng.model.lm_head.weight, weight)


def test_load_weights_rejects_bad_input(qwen2_path):
    eng = engine(qwen2_path)
    good = eng.model.model.norm.weight.detach().clone()
    with pytest.raises(RuntimeError, match="begin_weight_update"):
        eng.load_weights([("model.norm.weight", good)])
    eng.begin_weight_update()
    with pytest.raises(ValueError, match="model.nonsense.weight"):
        eng.load_weights([("model.norm.weight", good * 0), ("model.nonsense.weight", good)])
    assert torch.equal(eng.model.model.norm.weight, good)  # nothing applied from a bad batch
    with pytest.raises(ValueError, match="shape"):
        eng.load_weights([("model.norm.weight", torch.zeros(3))])
    with pytest.raises(RuntimeError, match="weight update"):
        eng.step()
    eng.load_weights([("model.rotary_emb.inv_freq", torch.zeros(8))])  # derived buffers are ignored
    eng.end_weight_update(1)


# ------------------------------------------------------------------ validation, stats, timings


def test_add_validates_requests(qwen2_path):
    eng = engine(qwen2_path, max_running=4, num_kv_blocks=8)
    eng.add(request("dup", PROMPT))
    with pytest.raises(ValueError, match="already in flight"):
        eng.add(request("dup", PROMPT))
    with pytest.raises(ValueError, match="max_running"):
        eng.add(request("big", PROMPT, n=5))
    with pytest.raises(ValueError, match="token ids"):
        eng.add(request("oov", [1, 97]))
    with pytest.raises(ValueError, match="empty prompt"):
        eng.add(request("empty", []))
    with pytest.raises(ValueError, match="KV blocks"):
        eng.add(request("long", PROMPT, max_new_tokens=40))
    with pytest.raises(ValueError, match="pause mode"):
        eng.pause("later")  # type: ignore[arg-type]


def test_stats_and_timings(qwen2_path):
    eng = engine(qwen2_path, max_running=2)
    eng.add(request("a", PROMPT, n=2, max_new_tokens=4))
    eng.add(request("b", PROMPT, max_new_tokens=4))
    stats = eng.stats()
    assert (stats.running, stats.waiting, stats.tokens_generated, stats.weight_version) == (0, 3, 0, 0)
    eng.step()
    assert (eng.stats().running, eng.stats().waiting) == (2, 1)
    outs = drain(eng)
    assert eng.stats().tokens_generated == 12
    timings = outs[("b", 0)].timings
    assert set(timings) >= {"queue", "prefill", "decode"} and all(v >= 0 for v in timings.values())
    assert timings["queue"] > 0  # b waited for a's samples


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"'GPT2LMHeadModel'.*LlamaForCausalLM.*Qwen2ForCausalLM"):
        ArchConfig.from_hf("GPT2LMHeadModel", object())


def test_unsupported_architecture_folder_is_rejected(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        TorchEngine(tmp_path)
