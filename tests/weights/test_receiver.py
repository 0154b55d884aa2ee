"""WeightReceiver pieces that need no second process."""

import time

import pytest
import torch
from weights_procs import FakeEngine

from asyncrl.weights.cuda_ipc import IpcTransport
from asyncrl.weights.group import WeightGroup, host_store
from asyncrl.weights.receiver import WeightReceiver
from asyncrl.weights.sender import WeightSender
from asyncrl.weights.transport import BroadcastTransport, WeightTransport


def test_poll_with_nothing_pending_returns_none_and_join_is_sent():
    sender = WeightSender("tcp://127.0.0.1:0", timeout_s=5.0)
    engine = FakeEngine()
    rx = WeightReceiver(sender.endpoint, "g0", "cpu", engine, timeout_s=5.0)
    try:
        assert rx.poll() is None
        assert not rx.ready and rx.version == 0
        deadline = time.monotonic() + 5  # hang guard only
        while not sender.has_joins() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sender.has_joins() and sender.members == []
        assert engine.events == []  # nothing touched the engine
    finally:
        rx.close()
        sender.close()


def test_both_transports_satisfy_the_protocol():
    group = WeightGroup(host_store("127.0.0.1", 1, 5.0), group_name="solo", rank=0, world_size=1, backend="gloo", timeout_s=5.0)
    transports = [BroadcastTransport(group, 5.0), IpcTransport()]
    assert all(isinstance(t, WeightTransport) for t in transports)
    assert [t.kind for t in transports] == ["gloo", "ipc"]
    sending = transports[0].start(torch.arange(8, dtype=torch.uint8))
    assert sending.handle is None
    with pytest.raises(RuntimeError, match="before launch"):
        sending.wait(5.0)  # the order is announce, launch, wait
    sending.launch()
    sending.wait(5.0)
    transports[0].close()
