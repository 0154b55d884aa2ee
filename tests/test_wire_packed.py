"""Samples kept as their wire bytes: `decode_packed` validates like `decode`, splices are byte-identical,
and scores travel by id."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from asyncrl import records as R
from asyncrl import wire


def sample(pid: str, i: int, versions: list[int]) -> R.Sample:
    n = len(versions)
    return R.Sample(prompt_id=pid, sample_index=i, prompt_token_ids=np.arange(3, dtype=np.int32),
                    response_token_ids=np.arange(n, dtype=np.int32), logprobs=np.full(n, -0.5, np.float32),
                    versions=np.array(versions, np.int32), finish_reason=R.FinishReason.STOP,
                    response_text="hi", timings={"sent": 1.0}, generator="g")


def test_packed_samples_carry_ids_oldest_version_and_exact_bytes():
    ss = [sample("p", 0, [3, 1, 2]), sample("p", 1, [])]
    frame = wire.encode(R.SampleBatch(lease_id="L1", samples=ss))
    msg = wire.decode_packed(frame)
    assert msg.lease_id == "L1" and [type(s) for s in msg.samples] == [wire.PackedSample] * 2
    assert [(s.prompt_id, s.sample_index, s.min_version) for s in msg.samples] == [("p", 0, 1), ("p", 1, None)]
    body = msgpack.unpackb(frame, raw=False)["b"]["samples"]
    assert [bytes(s.raw) for s in msg.samples] == [msgpack.packb(b, use_bin_type=True) for b in body]
    full = msg.samples[0].unpack()
    assert full.versions.tolist() == [3, 1, 2] and full.timings == {"sent": 1.0}


def test_spliced_packed_samples_are_byte_identical_to_plain_encoding():
    ss = [sample("p", 0, [1, 2]), sample("p", 1, [2, 2])]
    packed = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=ss))).samples
    prompt = R.Prompt(prompt_id="p", n=2, text="q")

    def batch(samples):
        return R.Batch(step=1, policy_version=2, groups=[R.Group(prompt=prompt, samples=[
            R.ScoredSample(sample=s, reward=0.5) for s in samples])])

    assert wire.encode(batch(packed)) == wire.encode(batch(ss))
    done = lambda s: R.Completion(scored=R.ScoredSample(sample=s, reward=1.0))  # noqa: E731
    assert wire.encode(done(packed[0])) == wire.encode(done(ss[0]))
    # outside a splicing message a packed sample still encodes correctly (decoded first)
    assert wire.encode(R.SampleBatch(lease_id="L", samples=packed)) == wire.encode(R.SampleBatch(lease_id="L", samples=ss))


def bad_sample_frames() -> list[tuple[bytes, str]]:
    good = msgpack.unpackb(wire.encode(R.SampleBatch(lease_id="L", samples=[sample("p", 0, [1])])), raw=False)
    s = good["b"]["samples"][0]
    cases = [({**s, "prompt_id": 3}, "prompt_id: expected str"), ({**s, "sample_index": True}, "expected int"),
             ({**s, "sample_index": -1}, "sample_index -1 < 0"), ({**s, "finish_reason": "nope"}, "is not one of"),
             ({**s, "zz": 1}, "unknown fields"), ({k: v for k, v in s.items() if k != "versions"}, "needs field 'versions'"),
             ({**s, "logprobs": s["versions"]}, "expected 1-d float32"), ({**s, "versions": "x"}, "expected array"),
             ({**s, "versions": msgpack.ExtType(1, s["versions"].data[:-1])}, "payload"),
             ({**s, "timings": {"a": "b"}}, "timings.a: expected float"),
             ({**s, "response_token_ids": msgpack.ExtType(1, b"\x01\x01" + (5).to_bytes(4, "little") + bytes(20))},
              "5 tokens but 1 logprobs")]
    return [(msgpack.packb({**good, "b": {"lease_id": "L", "samples": [bad]}}, use_bin_type=True), why)
            for bad, why in cases]


@pytest.mark.parametrize("frame, why", bad_sample_frames())
def test_packed_decoding_rejects_what_full_decoding_rejects(frame, why):
    for decode in (wire.decode, wire.decode_packed):
        with pytest.raises(wire.WireError, match=why):
            decode(frame)


def test_a_repeated_samples_key_keeps_bytes_and_validated_values_together():
    a, b = (msgpack.unpackb(wire.encode(sample("p", i, [1])), raw=False)["b"] for i in (0, 1))
    pk = msgpack.packb
    frame = (b"\x83" + pk("v") + pk(1) + pk("t") + pk("SampleBatch") + pk("b")
             + b"\x83" + pk("lease_id") + pk("L") + pk("samples") + pk([a]) + pk("samples") + pk([b]))
    msg = wire.decode_packed(frame)  # the last key wins, as in the decoded map
    assert [s.sample_index for s in msg.samples] == [1] and wire.decode(frame).samples[0].sample_index == 1
    assert msgpack.unpackb(msg.samples[0].raw, raw=False)["sample_index"] == 1


def test_reward_workers_get_ids_and_text_only():
    ss = [sample("p", 0, [1, 2]), sample("p", 1, [])]
    ss[1].response_text = "é" * 40
    packed = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=ss))).samples
    assert [s.response_text for s in packed] == [s.response_text for s in ss]
    msg = R.ToScore(items=[R.ToScoreItem(prompt_id=s.prompt_id, sample_index=s.sample_index,
                                         response_text=s.response_text, reward=R.RewardSpec(target="4")) for s in packed])
    frame = wire.encode(msg)
    assert wire.decode(frame) == msg
    item = msgpack.unpackb(frame, raw=False)["b"]["items"][0]
    assert sorted(item) == ["env_error", "env_reward", "finish_reason", "prompt_id", "response_text", "reward",
                            "sample_index"]  # no logprobs, versions, ids
    assert "ScoredBatch" not in wire.MESSAGE_TYPES  # scores travel by id only


def test_scores_by_id_round_trip():
    msg = R.ScoredIds(scores=[R.ScoreResult(prompt_id="p", sample_index=2, reward=0.5, components={"f": 1.0}),
                              R.ScoreResult(prompt_id="p", sample_index=3, reward=0.0, status=R.ScoreStatus.FAILED,
                                            reason="boom")])
    assert wire.decode(wire.encode(msg)) == msg
    with pytest.raises(wire.WireError, match="sample_index: expected int"):
        wire.decode(msgpack.packb({"v": 1, "t": "ScoredIds", "b": {"scores": [{"prompt_id": "p", "sample_index": "x",
                                                                             "reward": 1.0}]}}))


def test_oldest_version_and_finiteness_per_sample_in_a_mixed_batch():
    """The batch-wide token checks give each sample what its own arrays say (empty responses between)."""
    rng = np.random.default_rng(1)
    ss, want = [], []
    for i in range(12):
        n = int(rng.integers(0, 6)) if i % 3 else 0
        s = sample("p", i, rng.integers(-5, 9, n).tolist())
        if n and i % 4 == 1:
            s.logprobs[int(rng.integers(0, n))] = [np.nan, np.inf, -np.inf][i % 3]
        ss.append(s)
        want.append((int(s.versions.min()) if n else None, bool(np.isfinite(s.logprobs).all())))
    got = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=ss))).samples
    assert [(s.min_version, s.finite) for s in got] == want and not all(f for _, f in want)


def test_scoring_fields_are_read_once_from_the_decoding_then_from_the_bytes():
    s = sample("p", 0, [1, 2])
    s.response_text = "answer"
    got = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=[s]))).samples[0]
    first = got.take_scoring()
    assert first == ("answer", R.FinishReason.STOP, None, "") and got.scoring is None
    assert got.take_scoring() == first == (got.response_text, got.finish_reason, got.env_reward, got.env_error)


def test_a_sample_outside_the_plain_path_decodes_to_the_same_record():
    """Plain single-turn samples take a straight-line check; one with an int timing (a float to the schema)
    or any multi-turn field takes the general one. Either way the record is what the schema says."""
    base = msgpack.unpackb(wire.encode(R.SampleBatch(lease_id="L", samples=[sample("p", 0, [4, 2])])), raw=False)
    body = base["b"]["samples"][0]
    for changed, want in ((body, {"sent": 1.0}), ({**body, "timings": {"sent": 1}}, {"sent": 1.0}),
                          ({**body, "timings": {}}, {}), ({k: v for k, v in body.items() if k != "timings"}, {})):
        frame = msgpack.packb({**base, "b": {"lease_id": "L", "samples": [changed]}}, use_bin_type=True)
        full = wire.decode(frame).samples[0]
        assert full.timings == want and all(type(x) is float for x in full.timings.values())
        assert full.versions.tolist() == [4, 2] and full.env_error == "" and full.loss_mask is None
        packed = wire.decode_packed(frame).samples[0]
        assert (packed.min_version, packed.take_scoring()) == (2, ("hi", R.FinishReason.STOP, None, ""))
    multi = wire.decode(wire.encode(R.SampleBatch(lease_id="L", samples=[R.Sample(
        **{**{f: getattr(sample("p", 0, [1]), f) for f in R.Sample.__slots__}, "env_reward": 0.5})]))).samples[0]
    assert multi.env_reward == 0.5


@pytest.mark.parametrize("score, why", [
    ({"prompt_id": "p", "sample_index": 1, "reward": 1}, None),  # an int reward is a float
    ({"prompt_id": "p", "sample_index": 1, "reward": 1.0, "components": {"f": 2}}, None),
    ({"prompt_id": "p", "sample_index": True, "reward": 1.0}, "sample_index: expected int"),
    ({"prompt_id": "p", "sample_index": 1, "reward": 1.0, "status": "meh"}, "is not one of"),
    ({"prompt_id": "p", "sample_index": 1}, "needs field 'reward'"),
    ({"prompt_id": "p", "sample_index": 1, "reward": 1.0, "zz": 0}, "unknown fields"),
    ({"prompt_id": "p", "sample_index": 1, "reward": 1.0, "components": None}, "components: expected map"),
    ({"prompt_id": "p", "sample_index": 1, "reward": 1.0, "components": {"f": "x"}}, "components.f: expected float"),
])
def test_scores_are_checked_alike_on_either_path(score, why):
    """Scores with exact types are built straight away; any other is converted or refused by the schema."""
    frame = msgpack.packb({"v": R.SCHEMA_VERSION, "t": "ScoredIds", "b": {"scores": [score]}})
    if why is not None:
        with pytest.raises(wire.WireError, match=why):
            wire.decode(frame)
        return
    got = wire.decode(frame).scores[0]
    assert got == R.ScoreResult(prompt_id="p", sample_index=1, reward=1.0, components=score.get("components", {}))
    assert type(got.reward) is float and all(type(x) is float for x in got.components.values())


def test_scored_samples_of_a_batch_are_checked_alike_on_either_path():
    packed = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=[sample("p", 0, [1])]))).samples
    prompt = R.Prompt(prompt_id="p", n=1, text="q")
    frame = wire.encode(R.Batch(step=1, policy_version=1, groups=[R.Group(prompt=prompt, samples=[
        R.ScoredSample(sample=packed[0], reward=0.5, components={"f": 1.0}, status=R.ScoreStatus.FAILED, reason="r")])]))
    got = wire.decode(frame).groups[0].samples[0]
    assert (got.reward, got.components, got.status, got.reason) == (0.5, {"f": 1.0}, R.ScoreStatus.FAILED, "r")
    assert got.sample.versions.tolist() == [1]
    top = msgpack.unpackb(frame, raw=False)
    top["b"]["groups"][0]["samples"][0]["reward"] = 1  # an int: the general check converts it
    assert wire.decode(msgpack.packb(top, use_bin_type=True)).groups[0].samples[0].reward == 1.0
    top["b"]["groups"][0]["samples"][0]["status"] = "meh"
    with pytest.raises(wire.WireError, match="is not one of"):
        wire.decode(msgpack.packb(top, use_bin_type=True))
