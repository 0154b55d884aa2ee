"""CUDA IPC link: learner and generator on one GPU share the bucket buffer instead of broadcasting."""

import pytest
import torch
from test_push import assert_has, results, spawned
from weights_procs import FakeEngine, tiny_state_dict

from asyncrl.weights.cuda_ipc import IpcTransport, gpu_uuid, open_shared, share
from asyncrl.weights.sender import WeightSender

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_handle_checks_without_cuda():
    with pytest.raises(ValueError, match="CUDA buffer"):
        share(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="lacks fields"):
        open_shared({"device": 0}, torch.device("cpu"))
    assert gpu_uuid("cpu") == ""
    assert IpcTransport.kind == "ipc"
    # the learner's side (and an unstaged generator) reads in place: the buffer lives until the bucket's Ack;
    # a staged generator copies each bucket out before acking it
    assert IpcTransport().reads_in_place and not IpcTransport(stage=True).reads_in_place


def test_a_staging_receiver_makes_staging_ipc_links():
    from asyncrl.records import WeightGroupInit
    from asyncrl.weights.receiver import WeightReceiver

    init = WeightGroupInit(group_name="g", backend="ipc", master_address="127.0.0.1", master_port=1, rank_offset=1,
                           world_size=2)
    for staging in (False, True):
        rx = WeightReceiver("tcp://127.0.0.1:9", "g0", "cpu", FakeEngine("cpu", None, None, 0.0), timeout_s=1.0,
                            ipc_staging=staging)
        try:
            transport = rx._make_transport(init)
            assert isinstance(transport, IpcTransport) and transport.stage is staging
        finally:
            rx.close()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("staging", [False, True])
def test_same_gpu_generator_gets_weights_by_cuda_ipc(staging):
    """Staged too: each bucket copied out on a side stream before its Ack, loaded with no wait on the engine's
    stream; the learner reuses its freed blocks for the second push, so a load that read them late would differ."""
    sender = WeightSender("tcp://127.0.0.1:0", device="cuda:0", bucket_bytes=2048, timeout_s=20.0)
    with spawned(sender, ["colocated"], device="cuda:0", ipc_staging=staging) as (_, out, _start):
        assert sender.wait_for_joins(1, 60) == 1
        for version in (1, 2):  # the second push reuses freed learner blocks: still exact
            sd = {k: v.cuda() for k, v in tiny_state_dict(seed=version).items()}
            report = sender.push(sd.items(), version=version)
            assert report.generators == ["colocated"] and report.dropped == {}
            assert type(sender.roster.members["colocated"].transport) is IpcTransport
            r = results(out, ["colocated"], timeout_s=60)["colocated"]
            assert_has(r, sd)
            assert r["version"] == version
