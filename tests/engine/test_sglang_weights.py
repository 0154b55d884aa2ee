"""The SGLang weight push end to end over a real gloo group: the learner's rank 0 lives in this test
process, the double's two TP ranks are child processes, SGLangEngine sends the HTTP calls."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import torch.distributed as dist

from asyncrl.engine.protocol import GenerationRequest
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.engine.sglang.client import SGLangHTTP, SGLangHTTPError
from asyncrl.engine.sglang.weights import SGLangGroupError
from asyncrl.records import FinishReason, SamplingParams, WeightBucket, WeightGroupInit
from asyncrl.engine.bucket_layout import dtype_name
from tests.doubles.process_group import join_group, leave_group
from tests.doubles.sglang_double import SGLangDouble
from tests.doubles.sglang_testing import collect, free_port, wait_until

pytestmark = pytest.mark.timeout(90)

TP = 2
GROUP = "weights-test"
PROMPT = [3, 1, 4, 1, 5]


def group_init(port: int, name: str = GROUP) -> WeightGroupInit:
    return WeightGroupInit(master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=1 + TP,
                           group_name=name, backend="gloo")  # fmt: skip


def join(engine: SGLangEngine, name: str = GROUP, timeout_s: float = 30.0):
    """The learner's rank 0 and the server's ranks meet; -> the learner's process group."""
    port = free_port()
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(engine.init_weights_group, group_init(port, name))
        pg = join_group(master_address="127.0.0.1", master_port=port, world_size=1 + TP, rank=0,
                        group_name=name, timeout_s=timeout_s)  # fmt: skip
        joined.result(timeout=30)
    return pg


@pytest.fixture(scope="module")
def rig():
    """(double, engine, learner process group): joined once, the way a generator joins at start."""
    with SGLangDouble(tp_size=TP, group_timeout_s=3.0) as double:
        engine = SGLangEngine(SGLangConfig(base_url=double.url, request_timeout_s=10.0, weight_update_timeout_s=30.0))
        pg = join(engine)
        yield double, engine, pg
        engine.destroy_weights_group()
        leave_group(pg)
        engine.close()


def push(engine: SGLangEngine, pg, tensors: dict[str, torch.Tensor], version: int) -> None:
    """What the weight receiver and the learner do for one bucket: the HTTP call, the flat broadcast."""
    nbytes = [t.numel() * t.element_size() for t in tensors.values()]
    bucket = WeightBucket(version=version, names=list(tensors), dtypes=[dtype_name(t.dtype) for t in tensors.values()],
                          shapes=[list(t.shape) for t in tensors.values()],
                          offsets=[sum(nbytes[:i]) for i in range(len(nbytes))], nbytes=sum(nbytes))  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(engine.receive_bucket, bucket)
        dist.broadcast(torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors.values()]), 0, group=pg)
        done.result(timeout=30)


def test_full_update_flow_stamps_new_version_on_later_tokens(rig):
    double, engine, pg = rig
    engine.add(GenerationRequest(request_id="live", prompt_token_ids=np.asarray(PROMPT, np.int32), n=2,
                                 sampling=SamplingParams(ignore_eos=True, max_new_tokens=250)))  # fmt: skip
    wait_until(lambda: double.tokens_generated >= 20, what="tokens before the update")

    assert engine.pause("continue") == []
    engine.begin_weight_update()
    assert double.session_open and double.paused == "retract"
    bucket1 = {"model.embed_tokens.weight": torch.randn(8, 4), "model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}
    bucket2 = {"lm_head.weight": torch.randn(8, 4, dtype=torch.bfloat16), "model.scale": torch.tensor(2.5)}
    push(engine, pg, bucket1, version=1)
    push(engine, pg, bucket2, version=1)
    engine.end_weight_update(1)
    engine.resume()

    assert not double.session_open and double.version == "1" and engine.weight_version == 1
    for name, t in (bucket1 | bucket2).items():
        assert double.weights[name].dtype == t.dtype and torch.equal(double.weights[name], t), name
    outs = collect(engine)
    assert [o.finish_reason for o in outs] == [FinishReason.LENGTH] * 2
    for out in outs:
        switch = int(np.argmax(out.versions == 1))
        assert 0 < switch < 250 and (out.versions[:switch] == 0).all() and (out.versions[switch:] == 1).all()
        for i in (switch - 1, switch, 249):
            label = "default" if i < switch else "1"
            assert out.logprobs[i] == pytest.approx(
                double.model.logprobs(label, PROMPT, i, 1.0)[out.token_ids[i]], rel=1e-5
            )
    assert '"/update_weight_version"' not in str(double.calls)  # the buckets already carried the version


def test_bad_buckets_fail_before_any_broadcast_and_the_group_survives(rig):
    double, engine, pg = rig
    engine.pause("abort")
    engine.begin_weight_update()
    bad = {"names": ["w"], "dtypes": ["float33"], "shapes": [[2]], "offsets": [0], "nbytes": 8}
    with pytest.raises(ValueError, match="unknown bucket dtype 'float33'"):
        engine.receive_bucket(WeightBucket(version=2, **bad))
    misaligned = {"names": ["a", "b"], "dtypes": ["uint8", "float32"], "shapes": [[3], [2]], "offsets": [0, 3]}
    with pytest.raises(ValueError, match="not a multiple of float32 itemsize 4"):
        engine.receive_bucket(WeightBucket(version=2, nbytes=11, **misaligned))
    body = {"names": ["w"], "dtypes": ["float33"], "shapes": [[2]], "group_name": GROUP}
    with pytest.raises(SGLangHTTPError, match="has no attribute 'float33'"):  # the server checks too
        SGLangHTTP(double.url).call("/update_weights_from_distributed", body, timeout_s=10)
    t = torch.arange(6, dtype=torch.float32)
    push(engine, pg, {"w": t}, version=2)  # nothing was consumed by the failed calls
    engine.end_weight_update(2)
    engine.resume()
    assert torch.equal(double.weights["w"], t) and double.version == "2"


def test_a_join_the_learner_never_completes_is_a_group_error(rig):
    _double, engine, _ = rig
    other = SGLangEngine(SGLangConfig(base_url=engine.config.base_url, request_timeout_s=10.0))
    with pytest.raises(SGLangGroupError, match="could not join weight group 'lonely'.*join again"):
        other.init_weights_group(group_init(free_port(), "lonely"))
    other.close()


def test_a_group_left_by_a_dead_generator_is_replaced_on_the_next_join():
    """A restarted generator (and learner) reuse a name the server still holds: SGLang would refuse it
    after the rendezvous; the adapter destroys the stale group first."""
    with SGLangDouble(tp_size=TP, group_timeout_s=3.0) as double:
        config = SGLangConfig(base_url=double.url, request_timeout_s=10.0, weight_update_timeout_s=30.0)
        dead = SGLangEngine(config)
        leave_group(join(dead, "reused"))
        dead.close()  # died without destroying its group
        with SGLangEngine(config) as restarted:
            pg = join(restarted, "reused")
            assert ("/destroy_weights_update_group", {"group_name": "reused"}) in double.calls
            restarted.pause("abort")
            restarted.begin_weight_update()
            t = torch.full((3,), 4.0)
            push(restarted, pg, {"fresh": t}, version=4)
            restarted.end_weight_update(4)
            restarted.resume()
            assert torch.equal(double.weights["fresh"], t) and restarted.weight_version == 4
            restarted.destroy_weights_group()
            leave_group(pg)


def test_direct_receiver_path_forwards_flat_buckets(rig):
    """How asyncrl.weights' WeightReceiver drives SGLang: group init and one flat bucket per call."""
    double, engine, _ = rig
    transport = pytest.importorskip("asyncrl.weights.transport")
    assert isinstance(engine, transport.DirectReceiver) and engine.receiving_ranks() == TP
    port = free_port()
    init = WeightGroupInit(
        master_address="127.0.0.1",
        master_port=port,
        rank_offset=1,
        world_size=1 + TP,
        group_name="direct",
        backend="gloo",
    )
    tensors = {"a.weight": torch.randn(2, 3), "b.bias": torch.randn(4)}
    flat = torch.cat([t.view(-1).view(torch.uint8) for t in tensors.values()])
    layout = {"names": list(tensors), "dtypes": ["float32"] * 2, "shapes": [[2, 3], [4]], "nbytes": 40}
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(engine.init_weights_group, init)
        pg = join_group(master_address="127.0.0.1", master_port=port, world_size=1 + TP, rank=0, group_name="direct")
        joined.result(timeout=30)
        engine.pause("abort")
        engine.begin_weight_update()
        with pytest.raises(ValueError, match="offset 32, expected 24"):
            engine.receive_bucket(WeightBucket(version=9, offsets=[0, 32], **layout | {"nbytes": 48}))
        loaded = pool.submit(engine.receive_bucket, WeightBucket(version=9, offsets=[0, 24], **layout))
        dist.broadcast(flat, 0, group=pg)
        loaded.result(timeout=30)
    engine.end_weight_update(9)
    engine.resume()
    assert double.version == "9" and all(torch.equal(double.weights[k], t) for k, t in tensors.items())
    engine.destroy_weights_group()
    assert "direct" not in double.groups
    leave_group(pg)
