"""The learner's side of one generator's link: what `WeightSender` offers a joining generator.

A generator on the learner's own GPU (same uuid) gets CUDA IPC: nothing to build. Any other gets a
broadcast group of its own (NCCL between GPUs, gloo otherwise; world = learner rank 0 + the generator's
receiving ranks) over a rendezvous store the learner hosts. Building the learner's side blocks until the
generator connects (gloo's constructor does), so it runs on a thread of its own and reports into
`Member.build` ("transport" or "error"); the sender reads acks meanwhile and admits the member once both
its group Ack and the build are in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from asyncrl.records import WeightGroupInit, WeightJoin
from asyncrl.weights.cuda_ipc import IpcTransport
from asyncrl.weights.group import WeightGroup, host_store
from asyncrl.weights.member import Member
from asyncrl.weights.transport import BroadcastTransport


def start_link(m: Member, join: WeightJoin, group_name: str, *, device: torch.device, gpu_uuid: str,
               master_address: str, timeout_s: float, give_up: Callable[[], bool]) -> WeightGroupInit:
    """Begin building `m`'s link; returns the WeightGroupInit to send it (before the build can finish)."""
    if gpu_uuid and join.gpu_uuid == gpu_uuid:
        m.build["transport"] = IpcTransport()
        return WeightGroupInit(master_address="", master_port=0, rank_offset=1, world_size=2, group_name=group_name,
                               backend="ipc")
    backend = "nccl" if device.type == "cuda" and join.device.startswith("cuda") else "gloo"
    world = 1 + join.receiving_ranks  # learner rank 0 + the generator's receiving ranks (SGLang TP)
    store = host_store(master_address, world, timeout_s)

    def build() -> None:
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # a new thread starts on cuda:0
            group = WeightGroup(store, group_name=group_name, rank=0, world_size=world, backend=backend,
                                timeout_s=timeout_s)
            transport = BroadcastTransport(group, timeout_s, give_up=give_up)
        except Exception as e:
            m.build["error"] = str(e)
            return
        if m.gone:
            transport.close()  # dropped while this thread was building
        else:
            m.build["transport"] = transport

    threading.Thread(target=build, name=f"weights-join-{join.generator}", daemon=True).start()
    return WeightGroupInit(master_address=master_address, master_port=store.port, rank_offset=1, world_size=world,
                           group_name=group_name, backend=backend)
