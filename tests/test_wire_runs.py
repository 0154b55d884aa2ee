"""Per-token versions as runs (ext type 2): smaller frames, the same records, and every malformed run refused
with its reason by both decoders, before anything is expanded."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from asyncrl import records as R
from asyncrl import wire
from asyncrl.wire.arrays import ARRAY_EXT, RUNS_EXT, expand_runs, int_runs, runs_ok


def sample(versions: list[int] | np.ndarray, i: int = 0) -> R.Sample:
    n = len(versions)
    return R.Sample(prompt_id="p", sample_index=i, prompt_token_ids=np.arange(3, dtype=np.int32),
                    response_token_ids=np.arange(n, dtype=np.int32), logprobs=np.full(n, -0.5, np.float32),
                    versions=np.asarray(versions, np.int32), finish_reason=R.FinishReason.STOP, response_text="hi")


def versions_ext(frame: bytes) -> msgpack.ExtType:
    top = msgpack.unpackb(frame, raw=False, ext_hook=msgpack.ExtType)
    return top["b"]["samples"][0]["versions"]


def both_decoders(frame: bytes) -> tuple[R.Sample, wire.PackedSample]:
    return wire.decode(frame).samples[0], wire.decode_packed(frame).samples[0]


@pytest.mark.parametrize("versions, runs", [
    ([7] * 1024, True),  # one version: the usual sample
    ([3] * 300 + [4] * 500 + [2] * 224, True),  # weight updates landed twice during the generation
    ([], True),  # an empty response
    (list(range(40)), False),  # every token its own version: runs would be larger
    ([1, 1, 2, 2, 2, 5], False),  # three runs of six: 32 bytes as runs against 30 as a vector
])
def test_versions_travel_as_runs_where_smaller_and_decode_to_the_same_array(versions, runs):
    frame = wire.encode(R.SampleBatch(lease_id="L", samples=[sample(versions)]))
    ext = versions_ext(frame)
    assert ext.code == (RUNS_EXT if runs else ARRAY_EXT)
    full, packed = both_decoders(frame)
    assert full.versions.dtype == np.int32 and full.versions.tolist() == versions
    assert packed.unpack().versions.tolist() == versions
    assert packed.min_version == (min(versions) if versions else None)


def test_a_thousand_tokens_of_one_version_cost_16_bytes_not_4102():
    n = 1024
    one = wire.encode(R.SampleBatch(lease_id="L", samples=[sample([5] * n)]))
    each = wire.encode(R.SampleBatch(lease_id="L", samples=[sample(np.arange(n) % 2)]))  # no two neighbours alike
    assert len(versions_ext(one).data) == 16 and len(versions_ext(each).data) == 6 + 4 * n
    assert len(each) - len(one) == (6 + 4 * n + 4) - (16 + 2)  # payloads and their ext headers (ext 16 / fixext 16)


def test_runs_round_trip_in_a_batch_spliced_from_packed_samples():
    prompt = R.Prompt(prompt_id="p", n=2, text="q")
    ss = [sample([2] * 50, 0), sample([1] * 20 + [2] * 30, 1)]
    packed = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=ss))).samples
    batch = R.Batch(step=1, policy_version=2, groups=[R.Group(prompt=prompt, samples=[
        R.ScoredSample(sample=p, reward=1.0) for p in packed])])  # type: ignore[misc]
    got = wire.decode(wire.encode(batch))
    assert [s.sample.versions.tolist() for s in got.groups[0].samples] == [s.versions.tolist() for s in ss]


def runs_frame(payload: bytes, n: int = 4) -> bytes:
    """A SampleBatch of one sample of `n` tokens whose versions are the RUNS_EXT `payload`, as a peer could send."""
    frame = wire.encode(R.SampleBatch(lease_id="L", samples=[sample([0] * n)]))
    top = msgpack.unpackb(frame, raw=False, ext_hook=msgpack.ExtType)
    top["b"]["samples"][0]["versions"] = msgpack.ExtType(RUNS_EXT, payload)
    return msgpack.packb(top, use_bin_type=True)


def runs(n: int, values: list[int], ends: list[int], extra: bytes = b"") -> bytes:
    r = len(values)
    return (n.to_bytes(4, "little") + r.to_bytes(4, "little") + np.array(values, "<i4").tobytes()
            + np.array(ends, "<u4").tobytes() + extra)


@pytest.mark.parametrize("payload, reason", [
    (b"\x04\x00\x00", "truncated"),
    (runs(4, [1], [4], extra=b"\x00"), "need 16 bytes"),
    (runs(4, [1, 2], [2]), "need"),  # ends cut short
    (runs(4, [1, 2], [3, 3]), "strictly increasing"),
    (runs(4, [1, 2], [3, 2]), "strictly increasing"),
    (runs(4, [1, 2], [1, 3]), "strictly increasing"),  # the last run ends before n
    (runs(4, [1], [5]), "strictly increasing"),  # past n
    (runs(4, [], []), "strictly increasing"),  # no run for 4 values
    (runs(2, [1, 2, 3], [1, 2, 3]), "strictly increasing"),  # more runs than values
    (runs(5, [1], [5]), "5 versions"),  # a well-formed run of the wrong length
    (runs(1 << 31, [1], [1 << 31]), "versions"),  # a huge claimed length: refused, never expanded
])
def test_malformed_runs_are_refused_with_the_reason_by_both_decoders(payload, reason):
    frame = runs_frame(payload)
    for decode in (wire.decode, wire.decode_packed):
        with pytest.raises(wire.WireError, match=reason):
            decode(frame)


def test_int_runs_is_exact_for_random_arrays():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 300))
        arr = np.repeat(rng.integers(-5, 5, 8), rng.integers(0, 60, 8))[:n].astype(np.int32)
        got = int_runs(arr)
        if got is not None:
            assert runs_ok(got.payload) and np.array_equal(expand_runs(got.payload), arr)


def test_random_runs_payloads_either_decode_to_the_response_length_or_are_refused():
    rng = np.random.default_rng(1)
    n = 4
    for _ in range(2000):
        r = int(rng.integers(0, 4))
        if rng.random() < 0.5:  # plausible headers with random runs
            payload = runs(int(rng.choice([0, 3, 4, 5, 1 << 32 - 1])), rng.integers(-3, 3, r).tolist(),
                           rng.integers(0, 6, r).tolist())
        else:
            payload = rng.bytes(int(rng.integers(0, 40)))
        frame = runs_frame(payload, n)
        for decode in (wire.decode, wire.decode_packed):
            try:
                got = decode(frame).samples[0]
            except wire.WireError:
                continue
            versions = got.versions if isinstance(got, R.Sample) else got.unpack().versions
            assert len(versions) == n and versions.dtype == np.int32
