"""asyncrl.Client against a fake hub that sends garbage: every bad frame is a counted rejection with a
reason, the user's calls still get their answers, nothing raises into the program."""

from __future__ import annotations

import threading

import msgpack
import numpy as np
import pytest
import zmq

import asyncrl
from asyncrl import records as R
from asyncrl import wire

pytestmark = pytest.mark.timeout(60)

MAX_FRAME = 4096


def completion(pid: str, i: int) -> bytes:
    s = R.Sample(prompt_id=pid, sample_index=i, prompt_token_ids=np.zeros(1, np.int32),
                 response_token_ids=np.array([7], np.int32), logprobs=np.zeros(1, np.float32),
                 versions=np.zeros(1, np.int32), finish_reason=R.FinishReason.STOP)
    return wire.encode(R.Completion(scored=R.ScoredSample(sample=s, reward=float(i))))


def garbage() -> list[list[bytes]]:
    """One multipart message per bad frame kind (each is one rejection)."""
    deep_info = {"v": R.SCHEMA_VERSION, "t": "Heartbeat", "b": {"service": "x", "name": "y", "info": {"k": 0}}}
    nested: object = 0
    for _ in range(500):
        nested = [nested]
    deep_info["b"]["info"]["k"] = nested
    return [
        [b"\xc1 not msgpack"],
        [b"\x91" * 2000 + b"\xc0"],  # 2000 levels deep, 2 kB
        [wire.encode(R.Ack()) + b"x" * MAX_FRAME],  # oversized
        [b"a", b"b"],  # several frames
        [msgpack.packb({"v": R.SCHEMA_VERSION, "t": "NoSuchType", "b": {}})],
        [msgpack.packb(deep_info)],  # decodes (or not); either way not an answer to SubmitPrompts
        [wire.encode(R.Batch(step=1, policy_version=0, groups=[]))],  # wrong type for the request
    ]


def fake_hub(sock: zmq.Socket, done: threading.Event) -> None:
    """Answer one SubmitPrompts after garbage; then push garbage, stray completions and the real ones."""
    if not sock.poll(20_000):
        return
    ident, frame = sock.recv_multipart()
    msg = wire.decode(frame)
    for parts in garbage():
        sock.send_multipart([ident, *parts])
    pid = msg.prompts[0].prompt_id
    sock.send_multipart([ident, wire.encode(R.Ack(info={"prompt_ids": [pid]}))])
    for parts in garbage():
        sock.send_multipart([ident, *parts])
    sock.send_multipart([ident, completion("someone-else", 0)])
    sock.send_multipart([ident, completion(pid, 0)])
    sock.send_multipart([ident, completion(pid, 0)])  # duplicate
    sock.send_multipart([ident, completion(pid, 9)])  # out of range
    sock.send_multipart([ident, completion(pid, 1)])
    done.wait(20)


def test_client_counts_every_bad_frame_and_keeps_working():
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    done = threading.Event()
    t = threading.Thread(target=fake_hub, args=(sock, done), daemon=True)
    t.start()
    try:
        with asyncrl.Client(f"tcp://127.0.0.1:{port}", timeout_s=10) as client:
            client.peer.max_frame_bytes = MAX_FRAME
            (handle,) = client.submit("2+2=?", n=2)
            got = handle.result(timeout_s=10)
            assert [s.sample.sample_index for s in got] == [0, 1] and [s.reward for s in got] == [0.0, 1.0]
            rejected = client.rejected
    finally:
        done.set()
        t.join(5)
        sock.close()
    assert rejected == {"not_msgpack": 4, "too_large": 2, "frame_count": 2, "invalid": 2, "too_deep": 2,
                        "wrong_type": 2, "unknown_prompt": 1, "bad_sample": 2}
