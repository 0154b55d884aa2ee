"""The SGLang test double itself honours the documented 0.5.23 HTTP contract (docs/sglang.md),
checked with raw HTTP calls, so the adapter tests rest on a faithful peer."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from asyncrl.engine.sglang.client import SGLangConnectionError, SGLangHTTP
from tests.doubles.sglang_double import SGLangDouble
from tests.doubles.sglang_testing import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def double():
    with SGLangDouble() as d:
        yield d


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as p:
        yield p


def post(double: SGLangDouble, path: str, body=None, method: str = "POST"):
    resp = SGLangHTTP(double.url).request(method, path, body, timeout_s=10)
    return resp.status, (resp.json() if "json" in resp.content_type else resp.text())


def long_generate(double, pool, rid="r", max_new_tokens=300):
    body = {"input_ids": [1, 2, 3], "rid": rid, "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}  # fmt: skip
    return pool.submit(post, double, "/generate", body)


def test_batch_with_n_is_prompt_major_with_fresh_rids(double):
    status, items = post(double, "/generate", {
        "input_ids": [[1, 2, 3], [4, 5, 6, 7, 8]], "rid": "mine", "return_logprob": True, "logprob_start_len": 1,
        "sampling_params": {"n": 2, "max_new_tokens": 6},
    })  # fmt: skip
    assert status == 200 and [it["meta_info"]["prompt_tokens"] for it in items] == [3, 3, 5, 5]
    assert len({it["meta_info"]["id"] for it in items}) == 4 and all(it["meta_info"]["id"] != "mine" for it in items)
    meta = items[0]["meta_info"]
    assert set(meta) == {"id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
                         "completion_tokens", "cached_tokens", "weight_versions", "e2e_latency", "input_token_logprobs",
                         "output_token_logprobs", "output_token_logprobs_length"}  # fmt: skip
    assert [x[1] for x in meta["output_token_logprobs"]] == items[0]["output_ids"]
    assert all(x[2] is None for x in meta["output_token_logprobs"])
    assert meta["input_token_logprobs"][0] == [None, 2, None] and len(meta["input_token_logprobs"]) == 2
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 6}]
    assert meta["finish_reason"] == {"type": "length", "length": 6}


def test_single_and_batch_rids(double):
    _, one = post(double, "/generate", {"input_ids": [1, 2], "rid": "x", "sampling_params": {"max_new_tokens": 1}})
    assert isinstance(one, dict) and one["meta_info"]["id"] == "x" and "output_token_logprobs" not in one["meta_info"]
    _, many = post(double, "/generate", {"input_ids": [[1], [2]], "rid": "x", "sampling_params": {"max_new_tokens": 1}})
    assert [m["meta_info"]["id"] for m in many] == ["x_0", "x_1"]


def test_input_validation_errors(double):
    both = {"text": "hi", "input_ids": [1], "sampling_params": {}}
    assert post(double, "/generate", both) == (
        400,
        {"error": {"message": "Either text or input_ids should be provided."}},
    )
    status, body = post(double, "/generate", {"input_ids": [1], "sampling_params": {"top_q": 0.5}})
    assert status == 400 and isinstance(body["error"], str) and "top_q" in body["error"]  # strict-contract shape
    status, body = post(double, "/generate", {"input_ids": [1] * 395, "sampling_params": {"max_new_tokens": 6}})
    assert status == 400 and "maximum context length of 400" in body["error"]["message"]
    assert post(double, "/generate", {"text": "hi"})[0] == 400  # skip_tokenizer_init: no text input


def test_text_input_with_a_tokenizer():
    with SGLangDouble(skip_tokenizer_init=False) as d:
        status, out = post(d, "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 3}})
        assert status == 200 and len(out["text"]) == 3 and out["meta_info"]["prompt_tokens"] == 5


def test_info_endpoints(double):
    assert post(double, "/model_info", method="GET")[1]["weight_version"] == "default"
    assert post(double, "/get_weight_version", method="GET") == (404, {"detail": "Not Found"})
    assert post(double, "/weight_version", method="GET")[0] == 404


def test_flush_cache_rules(double, pool):
    status, text = post(double, "/flush_cache")
    assert status == 200 and text.startswith("Cache flushed.")
    running = long_generate(double, pool)
    wait_until(lambda: double.tokens_generated > 2)
    assert post(double, "/flush_cache")[0] == 400
    assert post(double, "/flush_cache?timeout=0.05") == (400, "Timed out waiting for idle state.")
    post(double, "/pause_generation", {"mode": "in_place"})
    assert post(double, "/flush_cache")[0] == 400  # in_place keeps requests running
    post(double, "/continue_generation", {})
    post(double, "/pause_generation", {"mode": "retract"})
    assert post(double, "/flush_cache")[0] == 200  # retracted requests wait, ignored while paused
    assert post(double, "/health_generate", method="GET")[0] == 503
    post(double, "/continue_generation", {})
    status, out = running.result(timeout=10)
    assert out["meta_info"]["num_retractions"] == 1 and out["meta_info"]["finish_reason"]["type"] == "length"


def greedy(double, ids, extra_key=None, tokens=4):
    body = {"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0}}
    status, out = post(double, "/generate", body | ({"extra_key": extra_key} if extra_key else {}))
    assert status == 200
    return out


def test_radix_cache_serves_kv_by_extra_key_whatever_weights_computed_it(double):
    prompt = [1, 2, 3, 4, 5]
    first = greedy(double, prompt, "k")
    assert first["meta_info"]["cached_tokens"] == 0
    assert greedy(double, prompt, "k")["meta_info"]["cached_tokens"] == 4  # the last id is always recomputed
    turn2 = prompt + first["output_ids"] + [9]  # continues turn 1: its KV is cached too, but the last output id
    assert greedy(double, turn2, "k")["meta_info"]["cached_tokens"] == len(prompt) + 3
    assert greedy(double, prompt, "other")["meta_info"]["cached_tokens"] == 0  # another namespace
    assert post(double, "/generate", {"input_ids": prompt, "extra_key": 3})[0] == 400
    post(double, "/update_weight_version", {"new_version": "2", "abort_all_requests": False})  # no flush
    stale = greedy(double, prompt, "k")
    assert stale["meta_info"]["cached_tokens"] == 4 and double.stale_kv_served == 1  # served the old KV
    want = [double.model.logprobs("2", prompt, i, 0.0)[t] for i, t in enumerate(stale["output_ids"])]
    got = [lp for lp, _, _ in stale["meta_info"]["output_token_logprobs"]]
    assert got != pytest.approx(want, abs=1e-3)  # poisoned: no version's logprobs
    fresh = greedy(double, prompt, "k2")
    assert fresh["meta_info"]["cached_tokens"] == 0 and double.stale_kv_served == 1
    assert post(double, "/flush_cache")[0] == 200 and not double.prefix_cache
    assert greedy(double, prompt, "k")["meta_info"]["cached_tokens"] == 0


def test_a_retracted_request_resumes_from_the_radix_cache(double, pool):
    running = long_generate(double, pool, max_new_tokens=200)
    wait_until(lambda: double.tokens_generated > 3)
    post(double, "/pause_generation", {"mode": "retract"})
    post(double, "/update_weight_version", {"new_version": "1", "abort_all_requests": False})
    post(double, "/continue_generation", {})  # no flush: the resumed request finds its own old-weight KV
    running.result(timeout=10)
    assert double.stale_kv_served == 1


def test_pause_abort_returns_partial_and_blocks_new_requests(double, pool):
    running = long_generate(double, pool)
    wait_until(lambda: double.tokens_generated > 2)
    assert post(double, "/pause_generation", {"mode": "abort"})[1]["status"] == "ok"
    _, out = running.result(timeout=5)
    assert out["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert 0 < len(out["output_ids"]) < 300
    blocked = long_generate(double, pool, max_new_tokens=2)
    time.sleep(0.1)
    assert not blocked.done()
    post(double, "/continue_generation", {})
    assert blocked.result(timeout=5)[0] == 200


def test_update_weight_version_aborts_by_default(double, pool):
    kept = long_generate(double, pool, max_new_tokens=120)
    wait_until(lambda: double.tokens_generated > 2)
    assert post(double, "/update_weight_version", {"new_version": "7", "abort_all_requests": False})[1]["success"]
    _, out = kept.result(timeout=10)
    assert (
        out["meta_info"]["weight_versions"][-1]["version"] == "7"
        and out["meta_info"]["finish_reason"]["type"] == "length"
    )
    aborted = long_generate(double, pool)
    wait_until(lambda: double.in_flight)
    assert post(double, "/update_weight_version", {"new_version": "8"})[1]["new_version"] == "8"
    assert aborted.result(timeout=5)[1]["meta_info"]["finish_reason"]["type"] == "abort"


def test_abort_request_needs_an_exact_rid_then_matches_by_prefix(double, pool):
    a, b, c = (long_generate(double, pool, rid) for rid in ("job-1", "job-10", "other"))
    wait_until(lambda: len(double.in_flight) == 3)
    for dropped in ("job", "", "oth"):  # not a rid the server holds: the front door drops the abort
        assert post(double, "/abort_request", {"rid": dropped}) == (200, "")
    assert post(double, "/abort_request", {"rid": "job-1"}) == (200, "")  # held; then the prefix rule
    kinds = [f.result(timeout=10)[1]["meta_info"]["finish_reason"]["type"] for f in (a, b, c)]
    assert kinds == ["abort", "abort", "length"]


def test_control_endpoints_refuse_a_missing_body(double):
    for path in ("/continue_generation", "/pause_generation", "/abort_request", "/begin_weight_update"):
        status, body = post(double, path, None)
        assert status == 422 and body["detail"][0]["loc"] == ["body"], path
    assert post(double, "/flush_cache", None)[0] == 200  # takes no request object


@pytest.mark.parametrize(("key", "value"), [("top_k", 20.0), ("stop_token_ids", [5.0]), ("sampling_seed", 3.0),
                                            ("max_new_tokens", 4.0), ("n", True)])  # fmt: skip
def test_integer_sampling_fields_refuse_other_types(double, key, value):
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, key: value}}
    status, answer = post(double, "/generate", body)
    assert status == 400 and f"sampling_params.{key}: invalid type" in answer["error"] and "expected i64" in answer["error"]


def test_a_taken_group_name_is_refused_only_after_the_rendezvous():
    """With no learner to meet, the join of a taken name fails on the rendezvous, not on the name."""
    from tests.doubles.process_group import join_group, leave_group
    from tests.doubles.sglang_testing import free_port

    with SGLangDouble(group_timeout_s=2.0) as d, ThreadPoolExecutor(1) as pool:
        port = free_port()
        init = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
                "group_name": "taken", "backend": "gloo"}  # fmt: skip
        joined = pool.submit(post, d, "/init_weights_update_group", init)
        pg = join_group(master_address="127.0.0.1", master_port=port, world_size=2, rank=0, group_name="taken")
        assert joined.result(timeout=30)[0] == 200
        status, answer = post(d, "/init_weights_update_group", init | {"master_port": free_port()})
        assert status == 400 and "already been created" not in answer["message"]
        assert answer["message"].startswith("Failed to initialize custom process group")
        leave_group(pg)


def test_session_and_group_errors(double):
    assert post(double, "/end_weight_update", {})[1] == {
        "success": False, "message": "no weight-update session is open; call begin_weight_update() first"}  # fmt: skip
    msg = "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
    assert post(double, "/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": []}) == (
        400, {"success": False, "message": msg})  # fmt: skip
    assert post(double, "/destroy_weights_update_group", {"group_name": "x"}) == (
        400, {"success": False, "message": "The group to be destroyed does not exist."})  # fmt: skip


def test_legacy_mode_has_no_session_endpoints():
    with SGLangDouble(version_mode="legacy") as d:
        assert post(d, "/begin_weight_update", {})[0] == 404 and post(d, "/end_weight_update", {})[0] == 404
        status, body = post(
            d, "/update_weights_from_distributed", {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]]}
        )
        assert status == 400 and "does not exist" in body["message"]  # past the session check, no group yet


def test_unpaused_update_waits_for_in_flight_requests(double, pool):
    running = long_generate(double, pool, max_new_tokens=60)
    wait_until(lambda: double.tokens_generated > 2)
    assert post(double, "/begin_weight_update", {})[1]["success"]  # writer lock: after the request finished
    assert double.tokens_generated == 60  # the whole request ran before the session opened
    assert running.result(timeout=5)[1]["meta_info"]["finish_reason"]["type"] == "length"


def test_release_while_busy_crashes_the_server(double, pool):
    running = long_generate(double, pool)
    wait_until(lambda: double.tokens_generated > 2)
    with pytest.raises(SGLangConnectionError):
        post(double, "/release_memory_occupation", {})
    with pytest.raises(SGLangConnectionError):
        running.result(timeout=5)
    with pytest.raises(SGLangConnectionError):
        post(double, "/model_info", method="GET")


def test_resume_memory_makes_weights_garbage(double):
    _, before = post(
        double, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    post(double, "/release_memory_occupation", {})
    post(double, "/resume_memory_occupation", {"tags": ["weights"]})
    assert double.weights_garbage
    _, after = post(
        double, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    assert after["output_ids"] != before["output_ids"]
