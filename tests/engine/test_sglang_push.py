"""One weight push for every engine: the learner's WeightSender drives an SGLang server (the double,
TP=2, its ranks real gloo processes) through WeightReceiver + SGLangEngine, exactly as it drives the
built-in engine."""

from __future__ import annotations

import threading

import pytest
import torch

from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.weights.receiver import WeightReceiver
from asyncrl.weights.sender import WeightSender
from tests.doubles.sglang_double import SGLangDouble

pytestmark = pytest.mark.timeout(120)
TP = 2


def test_sender_pushes_versioned_buckets_into_sglang_ranks():
    weights = {f"layers.{i}.weight": torch.randn(64, 32) for i in range(6)} | {"norm.weight": torch.randn(32)}
    with SGLangDouble(tp_size=TP, group_timeout_s=20.0) as double:
        engine = SGLangEngine(SGLangConfig(base_url=double.url, request_timeout_s=10.0, weight_update_timeout_s=30.0))
        sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=16 * 1024, timeout_s=30.0)
        receiver = WeightReceiver(sender.endpoint, "generator-0", "cpu", engine, timeout_s=30.0)
        stop = threading.Event()

        def serve() -> None:  # the generator loop's weight polling, between decode steps
            while not stop.is_set():
                receiver.poll(0.02)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            assert sender.wait_for_joins(1, 30) == 1
            for version in (1, 2):
                scaled = {k: v * version for k, v in weights.items()}
                report = sender.push(iter(scaled.items()), version)
                assert report.generators == ["generator-0"] and not report.dropped, report.as_dict()
                assert report.buckets > 1  # 16 KiB buckets: never one message for the whole model
                assert double.version == str(version)
                for name, t in scaled.items():
                    assert torch.equal(double.weights[name], t), name
        finally:
            stop.set()
            thread.join(10)
            receiver.close()
            sender.close()
            engine.close()
