"""WeightGroup: a standalone two-rank group, no default process group on either side."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from weights_procs import fingerprint, group_member

from asyncrl.weights.group import WeightGroup, WeightGroupError, host_store

CTX = mp.get_context("spawn")


def _broadcast_to_member(backend: str, use_helper: bool, device: str, member_device: str) -> None:
    store = host_store("127.0.0.1", 2, timeout_s=20.0)
    out = CTX.Queue()
    proc = CTX.Process(target=group_member, args=(store.port, "wg-test", backend, use_helper, member_device, out))
    proc.start()
    try:
        group = WeightGroup(store, group_name="wg-test", rank=0, world_size=2, backend=backend, timeout_s=20.0)
        data = torch.arange(1000, dtype=torch.int64).remainder(251).to(torch.uint8).to(device)
        group.wait(group.broadcast(data), 20.0)
        default_group_in_member, got = out.get(timeout=30)
        assert got == fingerprint(data)
        assert not default_group_in_member and not dist.is_initialized()
        group.close()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


@pytest.mark.parametrize("use_helper", [False, True], ids=["asyncrl", "sglang-recipe"])
def test_gloo_broadcast_meets_both_recipes(use_helper):
    _broadcast_to_member("gloo", use_helper, "cpu", "cpu")


def test_wait_times_out_when_nobody_joins_the_broadcast():
    store = host_store("127.0.0.1", 1, timeout_s=5.0)
    group = WeightGroup(store, group_name="alone", rank=0, world_size=1, backend="gloo", timeout_s=5.0)
    group.wait(group.broadcast(torch.zeros(4)), 1.0)  # world of one: completes at once

    class Never:
        def is_completed(self):
            return False

    with pytest.raises(WeightGroupError, match="timed out"):
        group.wait(Never(), 0.05)
    stopping = iter([False, False, True])  # the owner starts stopping while it waits
    with pytest.raises(WeightGroupError, match="stopping"):
        group.wait(Never(), 600.0, give_up=lambda: next(stopping))  # returns at once, not after 600 s
    group.close()
    group.close()  # idempotent


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend"):
        WeightGroup(None, group_name="x", rank=0, world_size=2, backend="mpi", timeout_s=1.0)
    with pytest.raises(ValueError, match="rank 2"):
        WeightGroup(None, group_name="x", rank=2, world_size=2, backend="gloo", timeout_s=1.0)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL refuses two ranks on one GPU)")
@pytest.mark.parametrize("use_helper", [False, True], ids=["asyncrl", "sglang-recipe"])
def test_nccl_broadcast_meets_both_recipes(use_helper):
    torch.cuda.set_device(0)
    _broadcast_to_member("nccl", use_helper, "cuda:0", "cuda:1")
