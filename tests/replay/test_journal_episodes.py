"""The journal across the multi-turn fields: a journal written before they existed still replays (same state,
same sample bytes, the fields at their defaults), and one that holds them replays them exactly, from the
log and from a snapshot."""

from __future__ import annotations

import msgpack
import numpy as np
from replay_fakes import fingerprint, ok, prompt, sample

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.journal import Journal

OLD_FIELDS = ["prompt_id", "sample_index", "prompt_token_ids", "response_token_ids", "logprobs", "versions",
              "finish_reason", "response_text", "timings", "generator"]


def _ext(a: np.ndarray) -> msgpack.ExtType:
    code = {np.dtype("<i4"): 1, np.dtype("<f4"): 2}[a.dtype]
    return msgpack.ExtType(1, bytes([code, 1]) + len(a).to_bytes(4, "little") + a.tobytes())


def old_frame(lease_id: str, samples: list[R.Sample]) -> bytes:
    """A SampleBatch frame as the code before multi-turn episodes wrote it: ten fields per sample."""
    maps = [{n: _ext(v) if isinstance(v, np.ndarray) else v.value if isinstance(v, R.FinishReason) else v
             for n in OLD_FIELDS for v in [getattr(s, n)]} for s in samples]
    return msgpack.packb({"v": 1, "t": "SampleBatch", "b": {"lease_id": lease_id, "samples": maps}}, use_bin_type=True)


def episode(pid: str, i: int) -> R.Sample:
    s = sample(pid, i, version=0, tokens=6)
    s.loss_mask = np.array([1, 1, 0, 0, 1, 1], np.int32)
    s.logprobs[2:4] = 0.0
    s.turn_rewards, s.env_reward, s.rollout = np.array([0.25, 0.5], np.float32), 0.75, {"turns": 2.0}
    return s


def run(path, make_frame) -> tuple[Journal, bytes]:
    """Submit one prompt of 2 samples, generate them from `make_frame`'s SampleBatch, score, form step 1."""
    j = Journal.open(path)
    sub = R.SubmitPrompts(prompts=[prompt("a", n=2)])
    j.submit(wire.encode(sub), sub)
    lease, _ = j.grant("g0", 1, now=0.0, ttl_s=60.0)
    frame = make_frame(lease.lease_id)
    j.add_samples(frame, wire.decode_packed(frame))
    j.score([ok("a", 0, 1.0), ok("a", 1, 0.0)])
    j.form_batch(1, 1)
    return j, frame


def trained_samples(j: Journal) -> list[R.Sample]:
    """The samples of step 1's batch as the learner decodes them."""
    batch = wire.decode(wire.encode(j.state.book.delivered[1]))
    return [s.sample for g in batch.groups for s in g.samples]


def reopened(path, j: Journal, compact: bool) -> Journal:
    if compact:
        j.compact()
    live = fingerprint(j.state)
    j.close()
    again = Journal.open(path)
    assert fingerprint(again.state) == live
    return again


def test_a_journal_written_before_the_episode_fields_replays(tmp_path):
    plain = [sample("a", 0), sample("a", 1)]
    j, frame = run(tmp_path / "replay.log", lambda lease: old_frame(lease, plain))
    lease_id = msgpack.unpackb(frame, raw=False)["b"]["lease_id"]
    today = wire.encode(R.SampleBatch(lease_id=lease_id, samples=plain))  # versions as runs: other bytes,
    assert frame != today and [_fields(s) for s in wire.decode(frame).samples] == \
        [_fields(s) for s in wire.decode(today).samples]  # the same records
    for compact in (False, True):
        again = reopened(tmp_path / "replay.log", j, compact)
        old_bytes = [msgpack.packb(m, use_bin_type=True) for m in msgpack.unpackb(frame, raw=False)["b"]["samples"]]
        kept = [bytes(s.sample.raw) for s in again.state.book.delivered[1].groups[0].samples]
        assert sorted(kept) == sorted(old_bytes)  # the bytes as they were logged
        for s in trained_samples(again):
            assert (s.loss_mask, s.turn_rewards, s.env_reward, s.env_error, s.rollout) == (None, None, None, "", {})
            assert s.response_token_ids.tolist() == [0, 1, 2, 3]
        j = again
    j.close()


def test_a_journal_with_episode_fields_replays_them_exactly(tmp_path):
    eps = [episode("a", 0), episode("a", 1)]
    eps[1].finish_reason, eps[1].env_error, eps[1].env_reward = R.FinishReason.ENV_ERROR, "raised: timeout", None
    j, _ = run(tmp_path / "replay.log", lambda lease: wire.encode(R.SampleBatch(lease_id=lease, samples=eps)))
    for compact in (False, True):  # from the log, then from a snapshot
        again = reopened(tmp_path / "replay.log", j, compact)
        packed = {s.sample.sample_index: s.sample for s in again.state.book.delivered[1].groups[0].samples}
        assert [(packed[i].finish_reason, packed[i].env_reward, packed[i].env_error) for i in (0, 1)] == [
            (R.FinishReason.STOP, 0.75, ""), (R.FinishReason.ENV_ERROR, None, "raised: timeout")]
        for s in trained_samples(again):
            e = eps[s.sample_index]
            assert s.loss_mask.tolist() == [1, 1, 0, 0, 1, 1] and s.turn_rewards.tolist() == [0.25, 0.5]
            assert (s.env_reward, s.env_error, s.rollout, s.finish_reason) == (
                e.env_reward, e.env_error, {"turns": 2.0}, e.finish_reason)
        j = again
    j.close()


def _fields(s: R.Sample) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in ((f, getattr(s, f)) for f in s.__slots__)}
