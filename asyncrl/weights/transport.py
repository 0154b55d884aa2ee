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
    sending.wait(timeout_s)             bytes delivered; keep `flat` alive until the generator acks

Launching before announcing deadlocks NCCL's first broadcast: the learner sits inside communicator
creation while the generator waits for the announcement that would bring it there (gloo's broadcast is
asynchronous, so that order once worked on CPU).
Generator: `flat = transport.recv(bucket, device)` blocks until the bytes are there (or times out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from asyncrl.records import WeightBucket, WeightGroupInit
from asyncrl.weights.group import WeightGroup


class Sending(Protocol):
    handle: dict[str, Any] | None  # what the WeightBucket announces (CUDA IPC handle), else None

    def launch(self) -> None:
        """Start moving the bytes; call only after the WeightBucket went out."""

    def wait(self, timeout_s: float) -> None: ...


@runtime_checkable
class WeightTransport(Protocol):
    kind: str  # "nccl" | "gloo" | "ipc"

    def start(self, flat: torch.Tensor) -> Sending:
        """Learner: prepare moving `flat` (uint8 [nbytes]) to the peer; `launch()` moves it."""

    def recv(self, bucket: WeightBucket, device: torch.device) -> torch.Tensor:
        """Generator: the announced bucket's bytes as uint8 [nbytes] on `device`."""

    def close(self) -> None: ...


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


class BroadcastTransport:
    def __init__(self, group: WeightGroup, timeout_s: float, give_up: Callable[[], bool] | None = None):
        """give_up: polled while the sender waits for a broadcast (its owner is stopping: stop waiting)."""
        self.group, self.timeout_s, self.give_up = group, timeout_s, give_up
        self.kind = group.backend

    def start(self, flat: torch.Tensor) -> Sending:
        if self.kind == "gloo" and flat.is_cuda:
            flat = flat.cpu()
        return _Broadcasting(self.group, flat, self.give_up)

    def recv(self, bucket: WeightBucket, device: torch.device) -> torch.Tensor:
        on = torch.device("cpu") if self.kind == "gloo" else device
        flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=on)
        self.group.wait(self.group.broadcast(flat), self.timeout_s)
        return flat.to(device)

    def close(self) -> None:
        self.group.close()
