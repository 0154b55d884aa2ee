"""SGLangEngine (the HTTP adapter) against the protocol-faithful test double: generation, pause/resume,
exact aborts, integer types, versions without a weight push, recovery after a client died mid-update,
legacy servers, and error paths."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.engine.protocol import Engine, GenerationRequest
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.engine.sglang.client import SGLangConnectionError, SGLangError, SGLangHTTP, SGLangHTTPError
from asyncrl.engine.sglang.weights import INCOMPLETE
from asyncrl.records import FinishReason, SamplingParams, WeightGroupInit
from tests.doubles.sglang_double import SGLangDouble
from tests.doubles.sglang_testing import collect, free_port, wait_until

pytestmark = pytest.mark.timeout(60)

PROMPT = [5, 6, 7, 8]


@pytest.fixture
def double():
    with SGLangDouble() as d:
        yield d


def make_engine(double: SGLangDouble, **kw) -> SGLangEngine:
    return SGLangEngine(SGLangConfig(**{"base_url": double.url, "request_timeout_s": 10.0, "generate_timeout_s": 20.0} | kw))


@pytest.fixture
def engine(double):
    with make_engine(double) as e:
        yield e


def request(rid: str, n: int = 1, prompt: list[int] = PROMPT, **sampling) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=np.asarray(prompt, np.int32),
                             sampling=SamplingParams(**sampling), n=n)


def expected_logprobs(double: SGLangDouble, prompt, out, temperature: float, version: str) -> np.ndarray:
    return np.array([
        double.model.logprobs(version, prompt, i, temperature)[t] for i, t in enumerate(out.token_ids.tolist())
    ])  # fmt: skip


def all_have_tokens(double: SGLangDouble, count: int, at_least: int) -> bool:
    with double.cond:
        return sum(len(r.output) >= at_least for r in double.in_flight.values()) >= count


def test_is_an_engine(engine):
    assert isinstance(engine, Engine)
    assert engine.weight_version == 0  # SGLang's "default" label
    assert engine.stats().running == 0


def test_n_samples_come_back_in_order_with_sampling_params(engine, double):
    engine.add(request("a", n=3, temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=40))
    engine.add(request("b", n=1, prompt=[9, 9], max_new_tokens=5))
    outs = collect(engine)
    assert [(o.request_id, o.sample_index) for o in outs] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert len({tuple(o.token_ids) for o in outs[:3]}) > 1  # samples differ
    sent = [body for path, body in double.calls if path == "/generate"]
    params = next(b["sampling_params"] for b in sent if b["input_ids"] == PROMPT)
    assert params == {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "max_new_tokens": 40,
                      "stop_token_ids": [], "ignore_eos": False, "n": 3}  # fmt: skip
    assert all(b["return_logprob"] is True and "sampling_seed" not in str(b) for b in sent)


def test_deterministic_mode_seeds_each_sample():
    with SGLangDouble(deterministic=True) as d, make_engine(d, deterministic=True) as e:
        for rid in ("x", "y"):
            e.add(request(rid, n=3, max_new_tokens=30, seed=11))
        outs = collect(e)
        x, y = outs[:3], outs[3:]
        assert len({tuple(o.token_ids) for o in x}) == 3  # one seed per sample, not 42 for all
        assert [o.token_ids.tolist() for o in x] == [o.token_ids.tolist() for o in y]  # same seeds, same samples
        seeds = [p["sampling_seed"] for path, b in d.calls if path == "/generate" for p in b["sampling_params"]]
        assert seeds == [11, 12, 13, 11, 12, 13]


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 1.7])
def test_logprobs_are_temperature_scaled_under_the_server_version(engine, double, temperature):
    engine.add(request("a", n=2, temperature=temperature, max_new_tokens=12))
    for out in collect(engine):
        assert out.logprobs.dtype == np.float32 and out.token_ids.dtype == np.int32
        np.testing.assert_allclose(
            out.logprobs, expected_logprobs(double, PROMPT, out, temperature, "default"), rtol=1e-5
        )
        assert (out.versions == 0).all()


def test_version_set_by_end_weight_update_stamps_later_tokens(engine, double):
    assert engine.pause("abort") == []
    engine.begin_weight_update()
    engine.end_weight_update(5)
    engine.resume()
    assert engine.weight_version == 5 and double.version == "5"
    assert ("/update_weight_version", {"new_version": "5", "abort_all_requests": False}) in double.calls
    engine.add(request("a", temperature=0.9, max_new_tokens=10))
    (out,) = collect(engine)
    assert (out.versions == 5).all()
    np.testing.assert_allclose(out.logprobs, expected_logprobs(double, PROMPT, out, 0.9, "5"), rtol=1e-5)


def test_finish_reasons(engine, double):
    greedy_first = int(np.argmax(double.model.logits("default", PROMPT, 0)))
    engine.add(request("eos", max_new_tokens=100))  # the double's EOS dominates from position 24
    engine.add(request("len", max_new_tokens=10))
    engine.add(request("stop_id", temperature=0.0, stop_token_ids=[greedy_first], max_new_tokens=10))
    engine.add(request("ignore", ignore_eos=True, max_new_tokens=30))
    outs = {o.request_id: o for o in collect(engine)}
    assert outs["eos"].finish_reason == FinishReason.STOP and outs["eos"].token_ids[-1] == 2
    assert len(outs["eos"].token_ids) == 25
    assert outs["len"].finish_reason == FinishReason.LENGTH and len(outs["len"].token_ids) == 10
    assert outs["stop_id"].finish_reason == FinishReason.STOP and outs["stop_id"].token_ids.tolist() == [greedy_first]
    assert outs["ignore"].finish_reason == FinishReason.LENGTH and len(outs["ignore"].token_ids) == 30
    assert 2 in outs["ignore"].token_ids[24:]  # EOS was sampled and ignored


def test_pause_abort_returns_partial_and_unsent_outputs(double):
    with make_engine(double, max_in_flight=1) as engine:
        engine.add(request("long", ignore_eos=True, max_new_tokens=300))
        engine.add(request("queued", n=2, max_new_tokens=5))
        wait_until(lambda: double.tokens_generated >= 10, what="tokens")
        aborted = sorted(engine.pause("abort"), key=lambda o: (o.request_id, o.sample_index))
        assert [(o.request_id, o.sample_index) for o in aborted] == [("long", 0), ("queued", 0), ("queued", 1)]
        assert all(o.finish_reason == FinishReason.ABORT for o in aborted)
        long = aborted[0]
        assert 10 <= len(long.token_ids) < 300 and len(long.logprobs) == len(long.versions) == len(long.token_ids)
        np.testing.assert_allclose(long.logprobs, expected_logprobs(double, PROMPT, long, 1.0, "default"), rtol=1e-5)
        assert len(aborted[1].token_ids) == 0
        assert not engine.has_work() and double.paused == "abort"
        assert not double.prefix_cache  # flushed while idle
        engine.resume()
        engine.add(request("after", max_new_tokens=3))
        assert [o.finish_reason for o in collect(engine)] == [FinishReason.LENGTH]


def test_pause_continue_retracts_and_requests_finish_after_resume(engine, double):
    engine.add(request("a", ignore_eos=True, max_new_tokens=200))
    wait_until(lambda: double.tokens_generated >= 5, what="tokens")
    assert engine.pause("continue") == []
    assert double.paused == "retract" and ("/flush_cache", {}) in double.calls
    assert engine.step() == []  # nothing finishes while paused
    engine.resume()
    (out,) = collect(engine)
    assert out.finish_reason == FinishReason.LENGTH and len(out.token_ids) == 200


def test_abort_while_retracted_reads_the_reduced_meta_info(engine, double):
    engine.add(request("a", ignore_eos=True, max_new_tokens=200))
    engine.add(request("b", ignore_eos=True, max_new_tokens=200))
    wait_until(lambda: all_have_tokens(double, 2, 2), what="tokens of both requests")
    engine.pause("continue")
    outs = sorted(engine.abort(["a"]), key=lambda o: o.request_id)
    assert [o.request_id for o in outs] == ["a"] and outs[0].finish_reason == FinishReason.ABORT
    assert len(outs[0].token_ids) >= 1  # partial output of an "Abort in waiting queue"
    rest = engine.abort()
    assert [o.request_id for o in rest] == ["b"] and not engine.has_work()
    engine.resume()


def test_in_place_mode_skips_the_flush(double):
    with make_engine(double, continue_mode="in_place") as engine:
        engine.add(request("a", ignore_eos=True, max_new_tokens=100))
        wait_until(lambda: double.tokens_generated >= 3, what="tokens")
        engine.pause("continue")
        assert double.paused == "in_place" and all(path != "/flush_cache" for path, _ in double.calls)
        engine.resume()
        assert len(collect(engine)[0].token_ids) == 100


def update_while_running(engine, double, mode: str) -> None:
    """A request "warm" of PROMPT finished (its KV in the server's radix cache), one long request running, then
    a weight update to version 5 under pause(mode)."""
    engine.add(request("warm", max_new_tokens=4))
    collect(engine)
    engine.add(request("long", prompt=[9, 9, 9], ignore_eos=True, max_new_tokens=150))
    wait_until(lambda: double.tokens_generated >= 8, what="tokens")
    engine.pause(mode)
    engine.begin_weight_update()
    engine.end_weight_update(5)
    engine.resume()


@pytest.mark.parametrize("continue_mode", ["in_place", "retract"])
def test_after_an_update_no_request_is_served_old_weights_kv(double, continue_mode):
    with make_engine(double, continue_mode=continue_mode) as engine:
        update_while_running(engine, double, "continue")
        engine.add(request("after", temperature=0.7, max_new_tokens=6))
        outs = {o.request_id: o for o in collect(engine)}
        assert double.stale_kv_served == 0
        np.testing.assert_allclose(outs["after"].logprobs, expected_logprobs(double, PROMPT, outs["after"], 0.7, "5"),
                                   rtol=1e-5)
        assert outs["long"].versions[0] == 0 and outs["long"].versions[-1] == 5  # continued across the update
        hits = engine.stats().prefix_cache_hit_tokens
        engine.add(request("again", max_new_tokens=2))
        collect(engine)
        assert engine.stats().prefix_cache_hit_tokens == hits + len(PROMPT) - 1  # the new weights' KV is reused
    keys = [body["extra_key"] for path, body in double.calls if path == "/generate"]
    assert keys[0] == keys[1] != keys[2] == keys[3] and keys[2].startswith("asyncrl-v5-")


@pytest.mark.parametrize(("mode", "continue_mode", "caught"), [
    ("continue", "in_place", True),  # in_place cannot flush: only the namespace keeps old KV away
    ("continue", "retract", False),  # retract flushes while paused
    ("abort", "retract", False),  # abort flushes once idle
])
def test_the_double_serves_stale_kv_to_an_adapter_that_keeps_one_namespace(double, monkeypatch, mode, continue_mode,
                                                                          caught):
    monkeypatch.setattr("asyncrl.engine.sglang.engine._cache_key", lambda version: "one-namespace")
    with make_engine(double, continue_mode=continue_mode) as engine:
        update_while_running(engine, double, mode)
        engine.add(request("after", max_new_tokens=6))
        collect(engine)
    assert (double.stale_kv_served > 0) == caught
    assert (("/flush_cache", None) in double.calls or ("/flush_cache", {}) in double.calls) == (not caught)


def test_legacy_server_skips_begin_and_end_and_keeps_requests_running():
    with SGLangDouble(version_mode="legacy") as d, make_engine(d) as engine:
        engine.add(request("a", ignore_eos=True, max_new_tokens=150))
        wait_until(lambda: d.tokens_generated >= 5, what="tokens")
        engine.begin_weight_update()
        assert engine.legacy is True
        engine.begin_weight_update()
        engine.end_weight_update(3)
        (out,) = collect(engine)
        assert out.finish_reason == FinishReason.LENGTH  # abort_all_requests=false kept it running
        assert out.versions[0] == 0 and out.versions[-1] == 3 and engine.weight_version == 3
        paths = [p for p, _ in d.calls]
        assert "/begin_weight_update" not in paths  # the start-up recovery's 404 already told
        assert paths.count("/end_weight_update") == 1


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(SGLangConnectionError, match="Is the server running"):
        SGLangEngine(SGLangConfig(base_url=f"http://127.0.0.1:{free_port()}", request_timeout_s=2.0))


def test_server_errors_surface_from_step(double):
    with make_engine(double, extra_sampling_params={"bogus_key": 1}) as engine:
        engine.add(request("a", max_new_tokens=4))
        with pytest.raises(SGLangHTTPError, match="bogus_key") as err:
            collect(engine)
        assert err.value.status == 400 and "request 'a'" in str(err.value.__notes__)
    with make_engine(double) as engine:
        engine.add(request("long", prompt=[1] * 390, max_new_tokens=20))  # context_len is 400
        with pytest.raises(SGLangHTTPError, match="maximum context length of 400"):
            collect(engine)


def test_generate_timeout_is_enforced(double):
    with SGLangEngine(SGLangConfig(base_url=double.url, generate_timeout_s=0.3)) as engine:
        SGLangHTTP(double.url).call("/pause_generation", {"mode": "abort"}, timeout_s=5)  # after start-up's resume
        engine.add(request("a", max_new_tokens=4))
        with pytest.raises(SGLangConnectionError, match="no answer within 0.3 s"):
            collect(engine)
    SGLangHTTP(double.url).call("/continue_generation", {}, timeout_s=5)


def test_begin_ends_a_session_left_open_and_end_without_begin_is_an_error(engine, double):
    engine.begin_weight_update()
    engine.begin_weight_update()  # "already open" (e.g. an earlier update died): ended, then begun again
    paths = [p for p, _ in double.calls]
    assert paths[-3:] == ["/begin_weight_update", "/end_weight_update", "/begin_weight_update"]
    engine.end_weight_update(1)
    with pytest.raises(SGLangHTTPError, match="no weight-update session is open"):
        engine.end_weight_update(2)


def test_load_weights_is_refused_with_the_broadcast_path(engine):
    with pytest.raises(SGLangError, match="by broadcast.*not supported"):
        engine.load_weights([])


def test_a_learner_on_the_same_gpu_is_refused_with_the_reason(engine):
    """The colocated CUDA-IPC path was unreachable (issue 10, item 5) and is gone: say so at the join."""
    init = WeightGroupInit(master_address="", master_port=0, rank_offset=1, world_size=2, group_name="g", backend="ipc")
    with pytest.raises(SGLangError, match="same GPU as the SGLang server is not supported"):
        engine.init_weights_group(init)
    with pytest.raises(TypeError, match="colocated"):
        SGLangConfig(colocated=True)


def test_abort_by_id_stops_every_sample_in_deterministic_mode():
    """The samples' rids are <rid>-0..n-1; SGLang drops an abort for a rid it does not hold exactly."""
    with SGLangDouble(deterministic=True) as d, make_engine(d, deterministic=True) as e:
        e.add(request("long", n=2, ignore_eos=True, max_new_tokens=350, seed=1))
        e.add(request("other", n=1, max_new_tokens=5))
        wait_until(lambda: all_have_tokens(d, 2, 8), what="tokens of both samples")  # "other" stops at 5
        outs = sorted(e.abort(["long"]), key=lambda o: o.sample_index)
        assert [(o.request_id, o.sample_index) for o in outs] == [("long", 0), ("long", 1)]
        assert all(o.finish_reason == FinishReason.ABORT and len(o.token_ids) < 350 for o in outs)
        aborts = [b["rid"] for p, b in d.calls if p == "/abort_request"]
        assert len(aborts) == 2 and all(r.endswith(("-0", "-1")) for r in aborts)
        assert [o.request_id for o in collect(e)] == ["other"]


def test_integer_fields_go_out_as_integers():
    """SGLang >= 0.5.22 answers 400 "expected i64" to top_k=20.0; integral floats are converted."""
    with SGLangDouble(deterministic=True) as d, make_engine(d, deterministic=True) as e:
        sampling = SamplingParams(top_k=20.0, stop_token_ids=[5.0], seed=3.0, max_new_tokens=np.int64(6))
        e.add(GenerationRequest(request_id="f", prompt_token_ids=np.array([5, 6], np.int32), sampling=sampling, n=2))
        assert len(collect(e)) == 2
        body = next(b for p, b in d.calls if p == "/generate")
        p0 = body["sampling_params"][0]
        assert [type(p0[k]) for k in ("top_k", "max_new_tokens", "sampling_seed")] == [int] * 3
        assert type(p0["stop_token_ids"][0]) is int and type(body["input_ids"][0][0]) is int
        with pytest.raises(ValueError, match=r"sampling.top_k=20.5: SGLang expects an integer"):
            e.add(request("g", top_k=20.5))


def test_a_restarted_client_recovers_a_server_left_mid_update(double):
    """A generator died between begin and end: session open, server paused, weights half loaded."""
    dead = make_engine(double)
    dead.pause("abort")
    dead.begin_weight_update()
    dead.close()  # no end, no resume: what a crash leaves behind
    assert double.session_open and double.paused == "abort"
    with make_engine(double, generate_timeout_s=5.0) as engine:
        assert not double.session_open and double.paused is None
        assert double.version == INCOMPLETE and engine.weight_version == 0  # the learner pushes in full
        engine.add(request("a", max_new_tokens=4))
        assert [len(o.token_ids) for o in collect(engine)] == [4]
        engine.pause("abort")
        engine.begin_weight_update()
        engine.end_weight_update(7)
        engine.resume()
        assert engine.weight_version == 7 and double.version == "7"


def test_a_restarted_client_resumes_a_server_left_paused_after_end(double):
    dead = make_engine(double)
    dead.pause("continue")
    dead.begin_weight_update()
    dead.end_weight_update(3)
    dead.close()  # died before resume
    with make_engine(double, generate_timeout_s=5.0) as engine:
        assert double.paused is None and engine.weight_version == 3  # the update completed: label kept
        engine.add(request("a", max_new_tokens=4))
        assert [o.versions.tolist() for o in collect(engine)] == [[3] * 4]


def test_api_key_is_sent():
    with SGLangDouble(api_key="secret") as d:
        with pytest.raises(SGLangHTTPError, match="401"):
            SGLangEngine(SGLangConfig(base_url=d.url))
        with make_engine(d, api_key="secret") as engine:
            engine.add(request("a", max_new_tokens=2))
            assert len(collect(engine)) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_in_flight", 0), ("base_url", "localhost:30000"), ("continue_mode", "abort"),
     ("extra_sampling_params", {"temperature": 0.5}), ("request_timeout_s", 0.0)],
)  # fmt: skip
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field if field != "base_url" else "base_url"):
        SGLangConfig(**{field: value})
