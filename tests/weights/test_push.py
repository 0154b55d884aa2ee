"""Learner-side WeightSender + generator-side WeightReceiver in spawned processes, over gloo on 127.0.0.1."""

import contextlib
import queue
import re
import time

import pytest
import torch
import torch.multiprocessing as mp
from weights_procs import fingerprint, run_generator, tiny_state_dict

from asyncrl.weights.sender import WeightSender

CTX = mp.get_context("spawn")


@contextlib.contextmanager
def spawned(sender: WeightSender, names: list[str], **kw):
    stop = CTX.Event()
    procs, out = {}, {}  # one queue per process: killing a process can leave a shared queue's lock held

    def start(name: str):
        out[name] = CTX.Queue()
        procs[name] = CTX.Process(target=run_generator, args=(sender.endpoint, name, out[name], stop), kwargs=kw, daemon=True)
        procs[name].start()

    for name in names:
        start(name)
    try:
        yield procs, out, start
    finally:
        stop.set()
        for p in procs.values():
            p.join(5)
            if p.is_alive():
                p.kill()
        sender.close()


def results(out: dict, names: list[str], timeout_s: float = 30.0) -> dict[str, dict]:
    """The next update result of each named generator."""
    got = {}
    deadline = time.monotonic() + timeout_s
    for name in names:
        try:
            got[name] = out[name].get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"{name} reported no update within {timeout_s}s (got {sorted(got)})")
    return got


def assert_has(result: dict, sd) -> None:
    assert result["ok"], result["error"]
    assert result["weights"] == {k: fingerprint(v) for k, v in sd.items()}  # every tensor, bit-exact


def test_the_work_end_weight_update_does_is_timed_and_inside_the_pause():
    """An engine's end of update (adapter merges, FP8 requantization) is reported as apply_s and counted in the
    paused time: the generator decodes nothing until it is done."""
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=1 << 20, pause_mode="continue", timeout_s=10.0)
    with spawned(sender, ["g0"], end_s=0.2) as (_, out, _start):
        assert sender.wait_for_joins(1, 30) == 1
        report = sender.push(tiny_state_dict(seed=1).items(), version=1)
        assert report.generators == ["g0"]
        assert 0.2 <= report.apply_s < 5 and report.paused_s >= report.apply_s + report.load_s
        assert report.as_dict()["apply_s"] == report.apply_s
        assert results(out, ["g0"])["g0"]["timings"]["apply_s"] >= 0.2


def test_push_round_trip_bit_exact_versioned_and_timed():
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=1024, pause_mode="abort", timeout_s=10.0)
    with spawned(sender, ["g0"]) as (_, out, _start):
        assert sender.wait_for_joins(1, 30) == 1
        sd = tiny_state_dict(seed=1)
        report = sender.push(sd.items(), version=1)
        assert report.generators == ["g0"] and report.dropped == {}
        assert report.buckets > 3 and report.bytes == sum(t.numel() * t.element_size() for t in sd.values())
        assert report.total_s > 0 and report.transfer_s > 0 and report.gather_s > 0 and report.gbps > 0
        assert report.per_generator["g0"]["load_s"] > 0 and report.paused_s >= report.load_s > 0
        assert report.recv_s == report.per_generator["g0"]["recv_s"] > 0 and report.as_dict()["recv_s"] == report.recv_s

        r = results(out, ["g0"])["g0"]
        assert_has(r, sd)
        assert r["version"] == 1 and r["aborted"] == 1  # pause('abort') hands its outputs back
        events = r["events"]
        assert events[:2] == ["pause:abort", "begin"] and events[-2:] == ["end:1", "resume"]
        assert events.count("load") == report.buckets

        sd2 = tiny_state_dict(seed=2)
        assert sender.push(sd2.items(), version=2).generators == ["g0"]
        assert_has(r2 := results(out, ["g0"])["g0"], sd2)
        assert r2["version"] == 2


@pytest.mark.parametrize("window", [1, 3])
def test_many_buckets_in_flight_and_a_push_dtype(window):
    """More buckets than the 64 unread acks a member may hold (bucket acks are read as they come), with one
    and with three buckets in flight; floating tensors travel in bf16, the int buffer as it is."""
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=64, timeout_s=10.0, dtype=torch.bfloat16, window=window)
    with spawned(sender, ["g0"]) as (_, out, _start):
        assert sender.wait_for_joins(1, 30) == 1
        sd = {f"w{i}": torch.randn(20) for i in range(90)} | {"steps": torch.arange(4)}
        report = sender.push(sd.items(), version=1)
        assert report.generators == ["g0"] and report.dropped == {} and report.buckets == 91
        assert report.bytes == 90 * 20 * 2 + 4 * 8
        r = results(out, ["g0"])["g0"]
        assert r["ok"], r["error"]
        expected = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}
        assert r["weights"] == {k: fingerprint(v) for k, v in expected.items()}
        assert r["events"].count("load") == 91


def test_late_joiner_gets_a_full_push_and_a_dead_member_is_dropped():
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=2048, timeout_s=5.0)
    with spawned(sender, ["a"]) as (procs, out, start):
        assert sender.wait_for_joins(1, 30) == 1
        sd1 = tiny_state_dict(seed=1)
        assert sender.push(sd1.items(), version=1).generators == ["a"]
        assert_has(results(out, ["a"])["a"], sd1)

        start("b")  # joins late, between learner steps
        assert sender.wait_for_joins(2, 30) == 2
        report = sender.serve_joins(lambda: sd1.items(), version=1)
        assert report is not None and report.generators == ["b"]  # only the joiner is pushed to
        assert_has(rb := results(out, ["b"])["b"], sd1)
        assert rb["version"] == 1
        assert sender.serve_joins(lambda: pytest.fail("no joiner: the iterator must not be made"), 1) is None

        sd2 = tiny_state_dict(seed=2)
        assert sender.push(sd2.items(), version=2).generators == ["a", "b"]
        both = results(out, ["a", "b"])
        assert_has(both["a"], sd2) and assert_has(both["b"], sd2)

        procs["a"].kill()
        procs["a"].join()
        sd3 = tiny_state_dict(seed=3)
        report = sender.push(sd3.items(), version=3)  # hang guard: pytest-timeout
        assert report.generators == ["b"] and "a" in report.dropped
        assert_has(results(out, ["b"])["b"], sd3)
        assert sender.members == ["b"]


def test_failed_load_drops_then_rejoins_and_next_push_completes():
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=4096, timeout_s=5.0)
    with spawned(sender, ["g"], fail_load_at_version=1) as (_, out, _start):
        assert sender.wait_for_joins(1, 30) == 1
        sd1 = tiny_state_dict(seed=1)
        report = sender.push(sd1.items(), version=1)
        assert report.generators == [] and "injected load failure" in report.dropped["g"]
        r = results(out, ["g"])["g"]
        assert not r["ok"] and r["version"] == 0 and "resume" not in r["events"]  # stays paused
        assert r["mid_update"]  # so the generator's worker does not step it (GeneratorWorker.run_once)

        assert sender.wait_for_joins(1, 10) == 1  # it asked again
        report = sender.serve_joins(lambda: sd1.items(), version=1)
        assert report is not None and report.generators == ["g"]
        r = results(out, ["g"])["g"]
        assert_has(r, sd1)
        assert r["events"][0] != "begin" and r["events"][-2:] == ["end:1", "resume"]  # completed the open session
        assert not r["mid_update"]


def test_hung_member_is_dropped_after_the_timeout_and_the_other_carries_on():
    import os
    import signal

    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=2048, timeout_s=2.0)
    with spawned(sender, ["a", "b"]) as (procs, out, _start):
        assert sender.wait_for_joins(2, 30) == 2
        sd = tiny_state_dict(seed=1)
        assert sender.push(sd.items(), version=1).generators == ["a", "b"]
        results(out, ["a", "b"])
        os.kill(procs["a"].pid, signal.SIGSTOP)
        try:
            report = sender.push(sd.items(), version=2)  # hang guard: pytest-timeout
            assert report.generators == ["b"] and re.search(r"timed out|timeout|within 2\.0s", report.dropped["a"], re.I)
            assert results(out, ["b"])["b"]["version"] == 2
        finally:
            os.kill(procs["a"].pid, signal.SIGCONT)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL refuses two ranks on one GPU)")
def test_push_over_nccl_to_another_gpu():
    sender = WeightSender("tcp://127.0.0.1:0", device="cuda:0", bucket_bytes=2048, timeout_s=30.0)
    with spawned(sender, ["gpu1"], device="cuda:1") as (_, out, _start):
        assert sender.wait_for_joins(1, 60) == 1
        sd = {k: v.cuda() for k, v in tiny_state_dict(seed=1).items()}
        report = sender.push(sd.items(), version=1)
        assert report.generators == ["gpu1"] and report.dropped == {}
        assert sender.roster.members["gpu1"].transport.kind == "nccl"
        r = results(out, ["gpu1"], timeout_s=60)["gpu1"]
        assert_has(r, sd) and r["version"] == 1
        sd2 = {k: v.cuda() for k, v in tiny_state_dict(seed=2).items()}
        assert sender.push(sd2.items(), version=2).generators == ["gpu1"]
        assert_has(results(out, ["gpu1"], timeout_s=60)["gpu1"], sd2)
