"""CUDA IPC link: learner and generator on one GPU share the bucket buffer instead of broadcasting."""

import pytest
import torch
from test_push import assert_has, results, spawned
from weights_procs import tiny_state_dict

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


@pytest.mark.gpu
@needs_cuda
def test_same_gpu_generator_gets_weights_by_cuda_ipc():
    sender = WeightSender("tcp://127.0.0.1:0", device="cuda:0", bucket_bytes=2048, timeout_s=20.0)
    with spawned(sender, ["colocated"], device="cuda:0") as (_, out, _start):
        assert sender.wait_for_joins(1, 60) == 1
        for version in (1, 2):  # the second push reuses freed learner blocks: still exact
            sd = {k: v.cuda() for k, v in tiny_state_dict(seed=version).items()}
            report = sender.push(sd.items(), version=version)
            assert report.generators == ["colocated"] and report.dropped == {}
            assert type(sender._members["colocated"].transport) is IpcTransport
            r = results(out, ["colocated"], timeout_s=60)["colocated"]
            assert_has(r, sd)
            assert r["version"] == version
