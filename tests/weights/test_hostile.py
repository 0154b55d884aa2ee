"""The weight sockets under hostile input, and joins that fail: bad frames are counted rejections, a failed
join is dropped at once and retried with backoff, group names never repeat across learner incarnations."""

import random
import threading

import torch.multiprocessing as mp
import zmq
from test_push import assert_has, results, spawned
from weights_procs import FakeEngine, tiny_state_dict

from asyncrl import wire
from asyncrl.records import Ack, WeightBegin, WeightGroupInit, WeightJoin
from asyncrl.weights.receiver import WeightReceiver
from asyncrl.weights.sender import WeightSender

CTX = mp.get_context("spawn")


def _garbage(rng: random.Random, count: int) -> list[list[bytes]]:
    """Bounded random multi-frame messages, plus well-formed records a peer may not send."""
    out = [[rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 5))] for _ in range(count)]
    out += [[wire.encode(WeightBegin(version=1, pause_mode="abort"))],  # wrong direction
            [wire.encode(Ack(info={"stage": "end"}))],  # not a member
            [wire.encode(WeightJoin(generator="x" * 500, weight_version=0, device="cpu"))],
            [wire.encode(WeightJoin(generator="g", weight_version=0, device="tpu:0"))],
            [wire.encode(WeightJoin(generator="g", weight_version=0, device="cpu", receiving_ranks=10**9))],
            [b"\x81\xa1v" * 100]]
    rng.shuffle(out)
    return out


def test_random_frames_at_both_weight_sockets_are_rejected_and_the_push_still_works():
    rng = random.Random(9)
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=1024, timeout_s=10.0)
    fuzz = zmq.Context.instance().socket(zmq.DEALER)
    fuzz.setsockopt(zmq.LINGER, 0)
    fuzz.connect(sender.endpoint)
    with spawned(sender, ["g0"]) as (_, out, _start):
        flood = _garbage(rng, 300)
        for frames in flood:
            fuzz.send_multipart(frames)
        assert sender.wait_for_joins(1, 30) == 1
        for _ in range(200):  # bounded: until the learner has read the whole flood
            if sender.rejected.total >= len(flood):
                break
            sender.has_joins()
        sd = tiny_state_dict(1)
        assert sender.push(sd.items(), version=1).generators == ["g0"]
        assert_has(results(out, ["g0"])["g0"], sd)
        counts = sender.rejected.as_dict()
        assert counts["total"] == len(flood) and {"frame_count", "undecodable", "unexpected_type", "not_a_member", "bad_join"} <= counts.keys()
        assert sender.members == ["g0"]  # no fuzzed join got in

        identity = sender.roster.members["g0"].identity  # the learner's own socket is the only way to reach g0
        flood = [m for m in _garbage(rng, 100) if b"WeightBegin" not in m[0]]  # a real learner message would start an update
        for frames in flood:
            sender.roster.sock.send_multipart([identity, *frames])
        sd2 = tiny_state_dict(2)
        assert sender.push(sd2.items(), version=2).generators == ["g0"]
        r = results(out, ["g0"])["g0"]
        assert_has(r, sd2)
        assert r["rejected"]["total"] == len(flood) and {"frame_count", "undecodable", "outside_update"} <= r["rejected"].keys()
    fuzz.close(0)


class _FakeLearner:
    """A ROUTER standing in for the learner: reads the receiver's messages, sends what the test says."""

    def __init__(self):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def recv(self, timeout_s: float = 10.0):
        assert self.sock.poll(int(timeout_s * 1000)), f"nothing from the receiver within {timeout_s}s"
        identity, frame = self.sock.recv_multipart()
        return identity, wire.decode(frame)


def test_receiver_rejoins_with_backoff_after_a_failed_join():
    learner = _FakeLearner()
    rx = WeightReceiver(learner.endpoint, "g0", "cpu", FakeEngine(), timeout_s=1.0)
    try:
        identity, join = learner.recv()
        assert isinstance(join, WeightJoin)
        for attempt in range(2):  # nobody listens on this port: the join fails each time
            learner.sock.send_multipart([identity, wire.encode(WeightGroupInit(
                master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2, group_name=f"x-{attempt}",
                backend="gloo"))])
            rx.poll(2.0)
            _, ack = learner.recv()
            assert not ack.ok and ack.info["stage"] == "group"
            got = None
            for _ in range(200):  # the retry comes from poll() once the backoff passed (bounded loop)
                rx.poll(0.05)
                if learner.sock.poll(0):
                    got = learner.recv()[1]
                    break
            assert isinstance(got, WeightJoin) and got.generator == "g0", got
        assert not rx.ready
    finally:
        rx.close()
        learner.sock.close(0)


def test_learner_drops_a_failed_join_at_once_and_names_groups_per_incarnation():
    names = []
    for _incarnation in range(2):
        sender = WeightSender("tcp://127.0.0.1:0", timeout_s=120.0)
        gen = zmq.Context.instance().socket(zmq.DEALER)
        gen.setsockopt(zmq.LINGER, 0)
        gen.connect(sender.endpoint)
        gen.send(wire.encode(WeightJoin(generator="g0", weight_version=0, device="cpu")))
        assert sender.wait_for_joins(1, 10) == 1
        box = {}
        pushing = threading.Thread(target=lambda: box.update(r=sender.push(tiny_state_dict(1).items(), 1)), daemon=True)
        pushing.start()
        assert gen.poll(10_000)
        init = wire.decode(gen.recv())
        assert isinstance(init, WeightGroupInit)
        names.append(init.group_name)
        gen.send(wire.encode(Ack(ok=False, info={"stage": "group", "error": "group name has already been created"})))
        pushing.join(30)  # far below the learner's 120 s timeout: it did not wait for the failed joiner
        assert not pushing.is_alive()
        assert "join failed on the generator: group name has already been created" in box["r"].dropped["g0"]
        assert gen.poll(5_000) and wire.decode(gen.recv()).info["stage"] == "dropped"
        gen.close(0)
        sender.close()
    assert names[0] != names[1] and all(n.startswith("asyncrl-weights-g0-") for n in names)
