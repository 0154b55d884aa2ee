"""The data path of the weight push: how one flat bucket gets from the learner to one generator.

The control path (which bucket, its layout, acks) is ZeroMQ and lives in sender.py / receiver.py; a
transport only moves bytes. Two implementations:

* `BroadcastTransport` — a `WeightGroup` broadcast (NCCL across GPUs, gloo on CPU).
* `IpcTransport` (cuda_ipc.py) — the learner's CUDA buffer opened in place by a generator on the same GPU.

Order on the learner, per bucket (this order is what keeps NCCL from deadlocking):

    sending = transport.start(flat)     nothing moves yet; `sending.handle` is ready (CUDA IPC)
    announce WeightBucket(handle)       ZeroMQ; the generator reads it and enters its side of the transfer
    sending.launch()                    NCCL/gloo broadcast posted; the first one creates the communicator
                                        and blocks until the generator is inside it too (bounded)
    ... the learner gathers, announces and launches the next bucket (at most `window` in flight) ...
    sending.wait(timeout_s)             bytes delivered; then `flat` may go (CUDA IPC: once the generator
                                        acked the bucket, `reads_in_place`)

Launching before announcing deadlocks NCCL's first broadcast: the learner sits inside communicator
creation while the generator waits for the announcement that would bring it there (gloo's broadcast is
asynchronous, so that order once worked on CPU).

Generator: `receiving = transport.post(bucket, device)` enters its side of the transfer without waiting,
so the next bucket's transfer can be posted before this one is loaded (broadcasts of one group run in the
order posted, on both sides); `receiving.ready()` asks without blocking; `receiving.result(timeout_s)`
returns the bytes once there. Waits are host-side polls with a timeout, never a GPU stream waiting on a
transfer whose peer may be dead: a stream that waited on a hung broadcast would wedge the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from asyncrl.engine.bucket_layout import BucketLayout
from asyncrl.records import WeightBucket, WeightGroupInit
from asyncrl.weights.group import WeightGroup, connect_store


class Sending(Protocol):
    handle: dict[str, Any] | None  # what the WeightBucket announces (CUDA IPC handle), else None

    def launch(self) -> None:
        """Start moving the bytes; call only after the WeightBucket went out."""

    def wait(self, timeout_s: float) -> None: ...


class Receiving(Protocol):
    def ready(self) -> bool:
        """Whether the bytes are there (never blocks)."""

    def result(self, timeout_s: float) -> torch.Tensor:
        """The bucket's bytes as uint8 [nbytes] on the generator's device (waits <= timeout_s)."""


@runtime_checkable
class WeightTransport(Protocol):
    kind: str  # "nccl" | "gloo" | "ipc"
    reads_in_place: bool  # the generator reads the learner's buffer itself: it lives until the bucket's Ack

    def start(self, flat: torch.Tensor) -> Sending:
        """Learner: prepare moving `flat` (uint8 [nbytes]) to the peer; `launch()` moves it."""

    def post(self, bucket: WeightBucket, device: torch.device) -> Receiving:
        """Generator: enter this side of the announced bucket's transfer without waiting for the bytes."""

    def close(self) -> None: ...


@runtime_checkable
class BucketLoader(Protocol):
    """An engine that loads a received flat bucket by its layout (the torch engine: `load_plan.py` replays the
    copies of an earlier bucket of the same layout). `WeightReceiver` hands it the buffer instead of named views."""

    def load_bucket(self, flat: torch.Tensor, layout: BucketLayout) -> None:
        """Load `flat` (uint8 [nbytes]) as `layout` (already validated) says, inside a weight update."""


@runtime_checkable
class DirectReceiver(Protocol):
    """An engine whose own ranks join the weight group and receive buckets themselves (SGLang: the
    scheduler ranks, driven by /init_weights_update_group and /update_weights_from_distributed with
    load_format="flattened_bucket"). `WeightReceiver` then forwards instead of receiving."""

    def init_weights_group(self, init: WeightGroupInit) -> None: ...

    def receive_bucket(self, bucket: WeightBucket) -> None:
        """Join the broadcast of this bucket, load it, return when loaded."""

    def destroy_weights_group(self) -> None: ...


class _Broadcasting:
    handle = None

    def __init__(self, group: WeightGroup, flat: torch.Tensor, give_up: Callable[[], bool] | None):
        self._group, self._keep, self._give_up = group, flat, give_up
        self._work: Any = None

    def launch(self) -> None:
        self._work = self._group.broadcast(self._keep)

    def wait(self, timeout_s: float) -> None:
        if self._work is None:
            raise RuntimeError("wait() before launch(): announce the bucket, then launch, then wait")
        self._group.wait(self._work, timeout_s, self._give_up)
        self._keep = None


class _Incoming:
    """One posted receive of a broadcast."""

    def __init__(self, group: WeightGroup, flat: torch.Tensor, device: torch.device):
        self._group, self._flat, self._device = group, flat, device
        self._work = group.broadcast(flat)

    def ready(self) -> bool:
        return self._work.is_completed()

    def result(self, timeout_s: float) -> torch.Tensor:
        self._group.wait(self._work, timeout_s)
        return self._flat.to(self._device)


class BroadcastTransport:
    reads_in_place = False

    def __init__(self, group: WeightGroup, timeout_s: float, give_up: Callable[[], bool] | None = None):
        """give_up: polled while the sender waits for a broadcast (its owner is stopping: stop waiting)."""
        self.group, self.timeout_s, self.give_up = group, timeout_s, give_up
        self.kind = group.backend

    def start(self, flat: torch.Tensor) -> Sending:
        if self.kind == "gloo" and flat.is_cuda:
            flat = flat.cpu()
        return _Broadcasting(self.group, flat, self.give_up)

    def post(self, bucket: WeightBucket, device: torch.device) -> Receiving:
        on = torch.device("cpu") if self.kind == "gloo" else device
        return _Incoming(self.group, torch.empty(bucket.nbytes, dtype=torch.uint8, device=on), device)

    def close(self) -> None:
        self.group.close()


def join_as_receiver(init: WeightGroupInit, timeout_s: float) -> BroadcastTransport:
    """This process as the one receiving rank (rank 1 of 2) of `init`'s group: what an engine that receives pushes
    itself broadcasts on (the SGLang adapter's LoRA mode, asyncrl/engine/sglang/lora.py)."""
    store = connect_store(init.master_address, init.master_port, init.world_size, timeout_s)
    group = WeightGroup(store, group_name=init.group_name, rank=1, world_size=2, backend=init.backend,
                        timeout_s=timeout_s)
    return BroadcastTransport(group, timeout_s)
