"""Contract of the Engine Protocol, run against every engine: TorchEngine on a tiny Qwen2, and SGLangEngine
over the SGLang test double (tests/doubles/sglang_double.py).

Each test drives the engine through the Protocol only; a `Backend` adds what a test needs to know about the
engine without reaching into it (how its weights load, how to wait until requests are decoding). Where
the SGLang adapter legitimately differs, the test says so:
* weights: SGLang's own scheduler ranks receive and load them (test_sglang_weights.py), so its
  `load_weights` refuses; the torch engine loads in this process.
* abort by id: SGLang gives the n > 1 samples of a request fresh ids (unless deterministic), so such a
  request can only be aborted with everything; the contract aborts n = 1 requests by id.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from engine_helpers import drain, engine, request

from asyncrl.engine.protocol import Engine, EngineLimits, EngineStats, GenerationOutput
from asyncrl.engine.sglang.client import SGLangError
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.records import FinishReason
from tests.doubles.sglang_double import SGLangDouble
from tests.doubles.sglang_testing import wait_until

pytestmark = pytest.mark.timeout(120)

LONG = 200  # max_new_tokens of a request that must still be decoding when the test pauses or aborts it


@dataclass
class Backend:
    engine: Engine
    loads_in_process: bool  # load_weights() copies tensors here (torch); SGLang's ranks receive instead
    decoding: Callable[[int], None]  # returns once the engine has generated at least this many tokens


def _protocol_methods() -> list[str]:
    return [n for n, v in vars(Engine).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]


def _torch_decoding(eng: TorchEngine) -> Callable[[int], None]:
    def decoding(tokens: int) -> None:
        while eng.stats().tokens_generated < tokens:
            eng.step()
    return decoding


@pytest.fixture(params=["torch", "sglang"])
def backend(request, qwen2_path) -> Iterator[Backend]:
    if request.param == "torch":
        eng = engine(qwen2_path)
        yield Backend(eng, True, _torch_decoding(eng))
        eng.close()
        return
    # token_delay_s: a LONG request decodes for ~2 s, time enough to pause or abort it mid-way
    with SGLangDouble(vocab_size=97, token_delay_s=0.01) as double:
        eng = SGLangEngine(SGLangConfig(base_url=double.url, request_timeout_s=10.0, generate_timeout_s=20.0))
        yield Backend(eng, False, lambda tokens: wait_until(lambda: double.tokens_generated >= tokens, what="tokens"))
        eng.close()


def long_request(rid: str, n: int = 1):
    return request(rid, [4, 5, 6], n=n, max_new_tokens=LONG, ignore_eos=True)


def assert_aligned(out: GenerationOutput) -> None:
    assert out.token_ids.dtype == np.int32 and out.logprobs.dtype == np.float32 and out.versions.dtype == np.int32
    assert len(out.token_ids) == len(out.logprobs) == len(out.versions)
    assert np.isfinite(out.logprobs).all() and (out.logprobs <= 0).all()


@pytest.mark.parametrize("cls", [TorchEngine, SGLangEngine], ids=["torch", "sglang"])
def test_signatures_match_the_protocol(cls):
    for name in _protocol_methods():
        ours, theirs = getattr(cls, name), getattr(Engine, name)
        if isinstance(theirs, property):
            assert isinstance(ours, property), name
            continue
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name


def test_instance_is_an_engine_and_runs_the_cycle(backend):
    eng = backend.engine
    assert isinstance(eng, Engine)
    assert isinstance(eng.stats(), EngineStats) and isinstance(eng.weight_version, int)
    assert eng.receiving_ranks() == 1  # torch: this process; SGLang: the double's TP size (1)
    limits = eng.limits()  # SGLang: the context from /server_info; it does not report its vocabulary
    assert isinstance(limits, EngineLimits) and limits.max_model_len and limits.max_model_len > 0
    assert limits.vocab_size is None if not backend.loads_in_process else limits.vocab_size > 0
    outs = drain(eng, {0: [request("c", [4, 5, 6], n=2, max_new_tokens=3)]})
    assert all(isinstance(o, GenerationOutput) for o in outs.values()) and len(outs) == 2
    assert eng.pause("continue") == [] and eng.pause("abort") == []
    eng.resume()
    eng.begin_weight_update()
    if backend.loads_in_process:
        eng.load_weights([])
    eng.end_weight_update(1)
    assert eng.weight_version == 1
    eng.close()
    eng.close()  # idempotent
    assert not eng.has_work()
    with pytest.raises(RuntimeError, match="closed"):
        eng.add(request("late", [1, 2]))


def test_outputs_one_per_sample_with_aligned_arrays_and_counted_tokens(backend):
    eng = backend.engine
    outs = drain(eng, {0: [request("a", [4, 5, 6], n=3, max_new_tokens=5), request("b", [7, 8], max_new_tokens=4)]})
    assert sorted(outs) == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    for (rid, _), out in outs.items():
        assert_aligned(out)
        limit = 5 if rid == "a" else 4
        assert 1 <= len(out.token_ids) <= limit and (out.versions == eng.weight_version).all()
        assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert out.finish_reason != FinishReason.LENGTH or len(out.token_ids) == limit
    stats = eng.stats()
    assert (stats.running, stats.waiting, eng.has_work()) == (0, 0, False)
    assert stats.tokens_generated == sum(len(o.token_ids) for o in outs.values())


def test_abort_by_id_returns_that_request_and_the_others_finish(backend):
    eng = backend.engine
    eng.add(long_request("a"))  # n = 1: SGLang aborts n > 1 by id only in deterministic mode
    eng.add(request("b", [7, 8], max_new_tokens=4))
    backend.decoding(1)
    [aborted] = eng.abort(["a"])
    assert (aborted.request_id, aborted.sample_index, aborted.finish_reason) == ("a", 0, FinishReason.ABORT)
    assert_aligned(aborted)
    assert len(aborted.token_ids) < LONG
    rest = drain(eng)
    assert set(rest) <= {("b", 0)} and all(o.finish_reason != FinishReason.ABORT for o in rest.values())
    assert eng.abort(None) == [] and not eng.has_work()


def test_pause_abort_returns_running_and_queued_work_then_resume_serves_new_requests(backend):
    eng = backend.engine
    eng.add(long_request("a", n=2))
    backend.decoding(1)
    eng.add(long_request("queued"))
    stats = eng.stats()
    assert stats.running + stats.waiting == 3  # samples, not requests
    aborted = sorted(eng.pause("abort"), key=lambda o: (o.request_id, o.sample_index))
    assert [(o.request_id, o.sample_index) for o in aborted] == [("a", 0), ("a", 1), ("queued", 0)]
    assert all(o.finish_reason == FinishReason.ABORT for o in aborted)
    for out in aborted:
        assert_aligned(out)
    assert not eng.has_work() and eng.step() == []
    eng.resume()
    outs = drain(eng, {0: [request("after", [4, 5], max_new_tokens=3)]})
    assert list(outs) == [("after", 0)] and outs["after", 0].finish_reason != FinishReason.ABORT


def test_pause_continue_keeps_work_and_stamps_tokens_after_the_update_with_the_new_version(backend):
    eng = backend.engine
    eng.add(long_request("a"))
    backend.decoding(1)
    assert eng.pause("continue") == []
    assert eng.has_work() and eng.step() == []  # nothing finishes while paused
    eng.begin_weight_update()
    if backend.loads_in_process:
        eng.load_weights([])
    eng.end_weight_update(1)
    eng.resume()
    [out] = drain(eng).values()
    assert out.finish_reason == FinishReason.LENGTH and len(out.token_ids) == LONG
    assert_aligned(out)
    assert out.versions[0] == 0 and out.versions[-1] == 1 and (np.diff(out.versions) >= 0).all()


def test_load_weights_runs_in_process_or_is_refused_with_the_broadcast_path(backend):
    """Differs by design: SGLang's scheduler ranks receive the broadcast themselves (DirectReceiver)."""
    eng = backend.engine
    eng.begin_weight_update()
    if backend.loads_in_process:
        eng.load_weights([])
    else:
        with pytest.raises(SGLangError, match="init_weights_group"):
            eng.load_weights([])
    eng.end_weight_update(2)
    assert eng.weight_version == 2 and eng.stats().weight_version == 2
