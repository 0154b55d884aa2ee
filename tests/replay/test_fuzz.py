"""10^4 hostile frames at a live hub: every one is answered or counted, none crashes it."""

from __future__ import annotations

import random
import struct

import msgpack
import pytest
import zmq
from replay_fakes import prompt, sample

from asyncrl import records as R
from asyncrl import wire
from asyncrl.net.peer import HubPeer
from asyncrl.replay.config import BatchConfig, HubConfig

pytestmark = pytest.mark.timeout(60)

MAX_FRAME = 8192
# A protocol-0 pickle that would run a shell command if anything unpickled it.
PICKLE = b"cos\nsystem\n(S'touch /tmp/asyncrl-pwned'\ntR."
PICKLE4 = b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94."


def junk(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(12 if depth < 3 else 8)
    return [
        lambda: rng.randint(-(2**63), 2**64 - 1), lambda: rng.choice([float("nan"), float("inf"), -0.0, 1e308]),
        lambda: "".join(rng.choice("ab\x00é") for _ in range(rng.randrange(8))), lambda: rng.random() < 0.5,
        lambda: None, lambda: rng.randbytes(rng.randrange(16)),
        lambda: msgpack.ExtType(rng.choice([1, 2, 100]), rng.randbytes(rng.randrange(12))),
        lambda: rng.choice(["stop", "ok", "failed", "x", "", "L1", "p1"]),
        lambda: [junk(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: {rng.choice(FIELDS): junk(rng, depth + 1) for _ in range(rng.randrange(5))},
        lambda: {rng.choice(FIELDS): junk(rng, depth + 1) for _ in range(rng.randrange(5))},
        lambda: [{rng.choice(FIELDS): junk(rng, depth + 1) for _ in range(6)}],
    ][kind]()


FIELDS = sorted({f for cls in wire.MESSAGE_TYPES.values() for f in cls.__dataclass_fields__} | {"v", "t", "b", "zz"})


def valid_frames() -> list[bytes]:
    sb = R.SampleBatch(lease_id="L1", samples=[sample("p1", i, tokens=50) for i in range(2)])
    return [wire.encode(m) for m in (
        sb, R.SubmitPrompts(prompts=[prompt("fz", 2)]), R.LeaseRequest(generator="g", max_prompts=2),
        R.ScoredIds(scores=[R.ScoreResult(prompt_id="p1", sample_index=i, reward=1.0) for i in range(2)]),
        R.BatchRequest(learner="l", step=1, wait_s=0.0), R.Heartbeat(service="x", name="y"),
    )]


def hostile(rng: random.Random, valid: list[bytes]) -> bytes:
    pick = rng.randrange(9)
    if pick == 0:
        return rng.randbytes(rng.randrange(64))
    if pick == 1:
        v = rng.choice(valid)
        return v[: rng.randrange(len(v))]  # truncated
    if pick == 2:
        return msgpack.packb({"v": 1, "t": "SubmitPrompts", "b": {"prompts": [], "pad": b"x" * (MAX_FRAME + rng.randrange(100))}})
    if pick == 3:
        return msgpack.packb({"v": rng.choice([0, 2, "1", None, 1.0]), "t": "StatsRequest", "b": {}})
    if pick == 4:
        return rng.choice([PICKLE, PICKLE4])
    if pick == 5:  # valid envelope, garbage body
        return msgpack.packb({"v": 1, "t": rng.choice(list(wire.MESSAGE_TYPES)), "b": junk(rng)}, use_bin_type=True)
    if pick == 6:  # valid frame with one byte flipped
        v = bytearray(rng.choice(valid))
        v[rng.randrange(len(v))] ^= 1 << rng.randrange(8)
        return bytes(v)
    if pick == 7:  # array ext with lying headers
        ext = msgpack.ExtType(1, struct.pack("<BBI", rng.randrange(10), 1, rng.randrange(2**32)) + rng.randbytes(8))
        body = {"lease_id": "L1", "samples": [{"prompt_id": "p1", "sample_index": 0, "prompt_token_ids": ext,
                                               "response_token_ids": ext, "logprobs": ext, "versions": ext,
                                               "finish_reason": "stop"}]}
        return msgpack.packb({"v": 1, "t": "SampleBatch", "b": body}, use_bin_type=True)
    return msgpack.packb(junk(rng), use_bin_type=True)


def test_hub_survives_and_counts_10k_hostile_frames(start_hub):
    h = start_hub(HubConfig(max_frame_bytes=MAX_FRAME, max_wait_s=0.05), BatchConfig(prompts_per_step=1, samples_per_prompt=2))
    rng = random.Random(1234)
    valid = valid_frames()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(h.endpoint)
    sent = errors = 0
    try:
        for _ in range(20):  # windows of 500 keep every queue below its high-water mark
            frames = [hostile(rng, valid) for _ in range(500)]
            for f in frames:
                sock.send(f)
            for _ in frames:
                assert sock.poll(10_000), "hub stopped answering"
                reply = wire.decode(sock.recv())
                errors += isinstance(reply, R.ErrorReply)
            sent += len(frames)
    finally:
        sock.close()
    with HubPeer(h.endpoint, "check") as peer:
        stats = peer.request(R.StatsRequest()).counters
    hub = stats["hub"]
    assert sent == 10_000
    assert hub["internal_errors"] == 0
    assert hub["rejected_frames"] + hub["rejected_requests"] == errors
    assert hub["rejected_frames"] > 8000
    assert stats["accounting"]["lost"] == 0
