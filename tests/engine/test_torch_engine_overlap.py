"""Overlapped decode (TorchEngine(overlap=True)): the same outputs as the synchronous loop, bit for bit, in the
same order, on every path that breaks the lookahead (stops, lengths, arrivals, preemption, abort, pause and
weight updates, top-k rows), with every KV block returned at the end. CPU runs the lookahead synchronously;
the GPU test runs it with CUDA graphs, pinned copies and events."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from engine_helpers import engine, request

from asyncrl.engine.protocol import GenerationOutput, GenerationRequest
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.records import FinishReason

STOPS = [7, 11, 13, 29, 41]  # each a few % likely per token on the tiny model: stops at random lengths
Action = Callable[[TorchEngine], list[GenerationOutput]]


def one_shape(eng: TorchEngine) -> TorchEngine:
    """Every decode step at one row count and the full block-table width. A row's logits round differently
    with the step's row count (its bucket: the GEMM shapes) and, on the CPU, with the widest block table
    (torch attention over padded tables); a discarded lookahead row can change both. That is batch
    composition, which no mode but deterministic keeps bit-stable, not what these tests check. CUDA graphs
    already run the full width."""
    runner = eng.runner
    runner.sizes = runner.sizes[-1:]
    if runner.graphs is None:
        step = runner.decode_step
        runner.decode_step = lambda size, width=None, single_pass=False: step(size, None, single_pass)
    return eng


def run(eng: TorchEngine, arrivals: dict[int, list[GenerationRequest]] | None = None,
        actions: dict[int, Action] | None = None, max_steps: int = 5000) -> list[GenerationOutput]:
    """Step until idle; before step k add arrivals[k], then call actions[k] (its outputs are kept). -> every
    output in the order the engine returned it."""
    arrivals, actions = dict(arrivals or {}), dict(actions or {})
    outs: list[GenerationOutput] = []
    for k in range(max_steps):
        for req in arrivals.pop(k, []):
            eng.add(req)
        if k in actions:
            outs += actions.pop(k)(eng)
        if not arrivals and not actions and not eng.has_work():
            return outs
        outs += eng.step()
    raise AssertionError("engine did not finish")


def record(out: GenerationOutput) -> tuple:
    return (out.request_id, out.sample_index, out.token_ids.tolist(), out.logprobs.tobytes(), out.versions.tolist(),
            out.finish_reason)


def assert_idle(eng: TorchEngine) -> None:
    assert not eng.has_work() and eng.loop.inflight is None and not eng._ready
    assert eng.blocks.num_free == eng.blocks.num_blocks and not any(eng.blocks.ref_counts)
    assert not eng.scheduler.running and not eng.scheduler.waiting


def compare(path, arrivals: Callable[[], dict], actions: Callable[[], dict] | None = None, ordered: bool = True,
            **kw) -> tuple[list[GenerationOutput], TorchEngine]:
    """The same run with overlap off and on: outputs equal (in order unless `ordered` is False: an abort of
    some requests returns its samples that finished in the step in flight with it, before the other
    requests' samples of that step). -> (the outputs, the overlapped engine)."""
    results = {}
    for overlap in (False, True):
        eng = one_shape(engine(path, overlap=overlap, **kw))
        outs = run(eng, arrivals(), actions() if actions else None)
        assert_idle(eng)
        results[overlap] = (outs, eng)
    (sync_outs, sync_eng), (ahead_outs, ahead_eng) = results[False], results[True]
    want, got = [record(o) for o in sync_outs], [record(o) for o in ahead_outs]
    if not ordered:
        want, got = sorted(want, key=repr), sorted(got, key=repr)
    assert got == want
    assert ahead_eng.counters["tokens_generated"] == sync_eng.counters["tokens_generated"]
    assert ahead_eng.scheduler.num_preemptions == sync_eng.scheduler.num_preemptions
    assert sync_eng.counters["decode_ahead"] == 0 and ahead_eng.counters["decode_ahead"] > 0
    return ahead_outs, ahead_eng


def stopping(rid: str, seed: int, n: int = 1, **sampling) -> GenerationRequest:
    sampling.setdefault("max_new_tokens", 40)
    return request(rid, [3 + seed % 50, 4, 5, 6, 7][: 1 + seed % 5], n=n, temperature=1.0, seed=seed,
                   stop_token_ids=STOPS, **sampling)


# ------------------------------------------------------------------ the flag


def test_overlap_is_off_on_cpu_by_default_and_not_with_deterministic(qwen2_path):
    assert not engine(qwen2_path).overlap and engine(qwen2_path, overlap=True).overlap
    with pytest.raises(ValueError, match="deterministic mode keeps the synchronous decode"):
        engine(qwen2_path, overlap=True, deterministic=True)


# ------------------------------------------------------------------ endings


def test_stop_and_eos_at_random_lengths(qwen2_path):
    def arrivals():
        return {0: [stopping(f"s{i}", i, n=1 + i % 3) for i in range(6)]
                + [request("eos", [9, 8, 7], n=2, temperature=1.2, seed=99, max_new_tokens=40),
                   request("short", [9, 8], n=2, temperature=1.0, seed=5, max_new_tokens=3, ignore_eos=True)]}

    def common_eos(eng):  # EOS proper: the tiny model's own EOS (1) is rare, so make common tokens EOS too
        eng.loop.eos_token_ids = frozenset({1, 17, 23})
        return []

    def actions():
        return {0: common_eos}

    outs, eng = compare(qwen2_path, arrivals, actions)
    reasons = [o.finish_reason for o in outs]
    assert reasons.count(FinishReason.STOP) >= 8 and FinishReason.LENGTH in reasons  # `short` ends by length
    eos_stops = {o.token_ids[-1] for o in outs if o.request_id == "eos" and o.finish_reason == FinishReason.STOP}
    assert eos_stops and eos_stops <= {1, 17, 23}
    assert eng.counters["discarded_rows"] > 0  # a stop is seen after the next step was launched
    assert len({len(o.token_ids) for o in outs}) > 5


def test_max_new_tokens_and_max_model_len_in_one_batch(qwen2_path):
    def arrivals():  # max_model_len 30: the long prompts end by it before their max_new_tokens
        lengths = [1, 2, 3, 5, 8, 13, 21, 25]
        return {0: [request(f"m{n}", [5, 6, 7][: 1 + n % 3], n=1 + n % 2, temperature=0.8, seed=n, max_new_tokens=n,
                            ignore_eos=True) for n in lengths]
                + [request(f"long{p}", list(range(2, 2 + p)), temperature=1.0, seed=p, max_new_tokens=25,
                           ignore_eos=True) for p in (10, 17, 28)]}

    outs, _ = compare(qwen2_path, arrivals, max_model_len=30)
    lengths = {(o.request_id, o.sample_index): len(o.token_ids) for o in outs}
    assert lengths[("m1", 0)] == 1 and lengths[("m21", 1)] == 21 and lengths[("m25", 0)] == 25
    assert lengths[("long10", 0)] == 20 and lengths[("long17", 0)] == 13 and lengths[("long28", 0)] == 2
    assert all(o.finish_reason == FinishReason.LENGTH for o in outs)


# ------------------------------------------------------------------ what breaks the lookahead


def test_arrivals_mid_decode(qwen2_path):
    def arrivals():
        return {0: [stopping("a", 1, n=2)], 3: [stopping("b", 2), stopping("c", 3, n=3)],
                4: [stopping("d", 4)], 11: [stopping("e", 5, n=2, max_new_tokens=12)], 30: [stopping("f", 6)]}

    _, eng = compare(qwen2_path, arrivals)
    assert eng.counters["prefills_overlapped"] >= 4  # every arrival after the first: prefill, then decode launched


def test_prefill_overlapped_with_first_token_endings(qwen2_path):
    """New rows whose first token ends them: by length (max_new_tokens = 1: no row in the next step) and by a stop
    token (a row computed and discarded), beside sequences already decoding and top-k-free arrivals."""
    def arrivals():
        first_stop = [request(f"stop{i}", [5, 6, 7][: 1 + i % 3], n=3, temperature=2.0, seed=40 + i,
                              max_new_tokens=20, stop_token_ids=list(range(0, 200, 2))) for i in range(3)]
        return {0: [stopping("a", 1, n=2, max_new_tokens=30)],
                2: [request("one", [9, 8], n=2, temperature=1.0, seed=3, max_new_tokens=1)] + first_stop,
                5: [stopping("b", 2, n=2), request("one2", [4], temperature=1.0, seed=4, max_new_tokens=1)]}

    outs, eng = compare(qwen2_path, arrivals)
    lengths = {(o.request_id, o.sample_index): len(o.token_ids) for o in outs}
    assert lengths[("one", 0)] == lengths[("one", 1)] == lengths[("one2", 0)] == 1
    assert sum(lengths[(f"stop{i}", j)] == 1 for i in range(3) for j in range(3)) >= 2  # stopped at token one
    assert eng.counters["prefills_overlapped"] >= 2 and eng.counters["discarded_rows"] > 0


def test_prefill_not_overlapped_beside_top_k_rows_or_without_overlap(qwen2_path):
    eng = one_shape(engine(qwen2_path, overlap=True))
    eng.add(request("k", [5, 6], temperature=1.0, top_k=10, seed=1, max_new_tokens=8))
    for _ in range(3):
        eng.step()
    eng.add(stopping("late", 2))  # a top-k row is running: the prefill's samples are read first
    while eng.has_work():
        eng.step()
    assert eng.counters["prefills_overlapped"] == 0
    sync = one_shape(engine(qwen2_path, overlap=False))
    run(sync, {0: [stopping("a", 1)], 3: [stopping("b", 2)]})
    assert sync.counters["prefills_overlapped"] == 0


def test_preemption_with_a_tiny_kv_cache(qwen2_path):
    def arrivals():
        return {0: [request(f"p{i}", [3 + i, 4, 5, 6, 7], n=2, temperature=1.0, seed=i, max_new_tokens=24,
                            stop_token_ids=[29, 41]) for i in range(4)],
                6: [request("late", [9, 9], n=2, temperature=1.0, seed=9, max_new_tokens=20, ignore_eos=True)]}

    _, eng = compare(qwen2_path, arrivals, num_kv_blocks=16)
    assert eng.scheduler.num_preemptions > 0


def test_top_k_rows_take_the_synchronous_step(qwen2_path):
    def arrivals():
        return {0: [stopping("a", 1, n=2), stopping("b", 2)],
                5: [request("topk", [5, 6], temperature=1.0, top_k=10, top_p=0.9, seed=3, max_new_tokens=6)],
                20: [stopping("c", 3, n=2)]}

    compare(qwen2_path, arrivals)


def test_abort_mid_flight(qwen2_path):
    def arrivals():
        return {0: [stopping("x", 1, n=3, max_new_tokens=60), stopping("y", 2, n=2), stopping("z", 3)]}

    def actions():
        return {4: lambda eng: eng.abort(["x"]), 5: lambda eng: eng.abort(["unknown"]),
                9: lambda eng: eng.abort(["z", "y"])}

    outs, _ = compare(qwen2_path, arrivals, actions, ordered=False)
    assert FinishReason.ABORT in {o.finish_reason for o in outs if o.request_id == "x"}
    assert sorted((o.request_id, o.sample_index) for o in outs) == sorted(
        [("x", i) for i in range(3)] + [("y", 0), ("y", 1), ("z", 0)])


def test_abort_returns_the_step_in_flight_of_its_requests_only(qwen2_path):
    eng = one_shape(engine(qwen2_path, overlap=True))
    eng.add(request("x", [5, 6, 7], n=2, temperature=1.0, seed=1, max_new_tokens=3, ignore_eos=True))
    eng.add(request("y", [5, 6, 7], temperature=1.0, seed=2, max_new_tokens=3, ignore_eos=True))
    assert eng.step() == [] and eng.step() == []  # prefill + decode 1, then decode 2 (the last) in flight
    assert eng.loop.inflight is not None
    aborted = eng.abort(["x"])  # x finished in the step in flight: returned here, complete, not aborted
    assert [(o.request_id, o.finish_reason, len(o.token_ids)) for o in aborted] == [("x", FinishReason.LENGTH, 3)] * 2
    assert eng.has_work() and eng.loop.inflight is None
    assert [(o.request_id, len(o.token_ids)) for o in eng.step()] == [("y", 3)]
    assert_idle(eng)
    eng.add(request("x", [5], max_new_tokens=2))  # its id is free again


def test_pause_weight_update_resume_stamps_versions(tiny_models):
    import transformers

    path = tiny_models["llama"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    new = {n: p.detach() for n, p in hf.named_parameters() if n.endswith("weight")}

    def update(version: int) -> Action:
        def act(eng):
            outs = eng.pause("continue")
            eng.begin_weight_update()
            eng.load_weights([(n, t * (1 + 0.01 * version)) for n, t in new.items()])
            eng.end_weight_update(version)
            eng.resume()
            return outs
        return act

    def arrivals():
        return {0: [stopping("u", 1, n=2, max_new_tokens=30), stopping("v", 2, max_new_tokens=30)],
                6: [stopping("w", 3, max_new_tokens=20)]}

    def actions():
        return {4: update(3), 9: update(4), 12: lambda eng: eng.pause("abort")}

    outs, _ = compare(path, arrivals, actions)
    versions = {v for o in outs for v in o.versions.tolist()}
    assert versions == {0, 3, 4}
    assert any(o.finish_reason == FinishReason.ABORT for o in outs)


def test_has_work_while_in_flight_and_score_after(qwen2_path):
    from asyncrl.engine.torch.forced_group import ForcedGroup

    eng = one_shape(engine(qwen2_path, overlap=True))
    eng.add(stopping("a", 1, n=2))
    eng.step()
    with pytest.raises(RuntimeError, match="idle engine"):
        eng.score([])
    outs = run(eng)
    assert_idle(eng)
    assert eng.step() == []
    sampling = stopping("a", 1).sampling
    groups = [ForcedGroup(prompt_token_ids=np.asarray([4]), response_token_ids=[o.token_ids for o in outs],
                          sampling=sampling)]
    scored = eng.score(groups)[0]
    assert [len(s) for s in scored] == [len(o.token_ids) for o in outs]
    assert_idle(eng)


def mixed_arrivals() -> dict[int, list[GenerationRequest]]:
    """Every path at once: stops, a top-k row, arrivals, long samples that cannot all fit the small cache
    (3 × 16 blocks of 40: preemption whatever the stops do)."""
    return {0: [stopping(f"s{i}", i, n=1 + i % 3) for i in range(5)],
            3: [request("topk", [5, 6], temperature=1.0, top_k=10, seed=3, max_new_tokens=6)],
            6: [request("long", [9, 9, 9], n=3, temperature=0.9, seed=4, max_new_tokens=60, ignore_eos=True)],
            14: [stopping("late", 11, n=2)]}


def mixed_actions() -> dict[int, Action]:
    def pause_resume(eng):
        outs = eng.pause("continue")
        eng.resume()
        return outs

    return {9: lambda eng: eng.abort(["s1"]), 20: pause_resume}


def test_everything_at_once(qwen2_path):
    outs, eng = compare(qwen2_path, mixed_arrivals, mixed_actions, ordered=False, num_kv_blocks=40)
    assert eng.scheduler.num_preemptions > 0 and eng.counters["discarded_rows"] > 0
    assert {o.finish_reason for o in outs} == {FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT}


def test_natural_shapes_agree_to_rounding(qwen2_path):
    """Without `one_shape` the discarded rows change some steps' bucket and table width: the same tokens,
    logprobs equal up to fp32 rounding."""
    def outputs(overlap):
        eng = engine(qwen2_path, overlap=overlap)
        outs = run(eng, {0: [stopping(f"s{i}", i, n=2) for i in range(5)], 7: [stopping("t", 7, n=3)]})
        assert_idle(eng)
        return {(o.request_id, o.sample_index): o for o in outs}

    sync, ahead = outputs(False), outputs(True)
    assert sync.keys() == ahead.keys()
    for key, out in sync.items():
        assert ahead[key].token_ids.tolist() == out.token_ids.tolist(), key
        np.testing.assert_allclose(ahead[key].logprobs, out.logprobs, atol=1e-5)


# ------------------------------------------------------------------ GPU: graphs, pinned copies, events


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_overlap_matches_synchronous(tiny_models, dtype):
    """The CPU test's run on the GPU: bitwise equal there too (both loops replay the same graph; the step in
    flight's tokens reach the next step by the device gather)."""
    path = tiny_models["qwen2"]
    assert engine(path, device="cuda").overlap  # the default with CUDA graphs
    outs, eng = compare(path, mixed_arrivals, mixed_actions, ordered=False, device="cuda", dtype=dtype,
                        num_kv_blocks=40)
    assert eng.runner.graphs is not None and eng.runner.fused_sampling
    assert eng.counters["prefills_overlapped"] > 0  # the fused sampler's prefill samples read by a graph's unpack
    assert all(np.isfinite(o.logprobs).all() for o in outs)
