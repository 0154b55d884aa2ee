"""The data path of the weight push: how one flat bucket gets from the learner to one generator.

The control path (which bucket, its layout, acks) is ZeroMQ and lives in sender.py / receiver.py; a
transport only moves bytes. Two implementations:

* `BroadcastTransport` — a `WeightGroup` broadcast (NCCL across GPUs, gloo on CPU).
* `IpcTransport` (cuda_ipc.py) — the learner's CUDA buffer opened in place by a generator on the same GPU.

Learner: `sending = transport.start(flat)`; announce `sending.handle` in the WeightBucket;
`sending.wait(timeout_s)`; keep `flat` alive until the generator acks the bucket.
Generator: `flat = transport.recv(bucket, device)` blocks until the bytes are there (or times out).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from asyncrl.records import WeightBucket, WeightGroupInit
from asyncrl.weights.group import WeightGroup


class Sending(Protocol):
    handle: dict[str, Any] | None  # what the WeightBucket announces (CUDA IPC handle), else None

    def wait(self, timeout_s: float) -> None: ...


@runtime_checkable
class WeightTransport(Protocol):
    kind: str  # "nccl" | "gloo" | "ipc"

    def start(self, flat: torch.Tensor) -> Sending:
        """Learner: begin moving `flat` (uint8 [nbytes]) to the peer."""

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

    def __init__(self, group: WeightGroup, work: Any, keep: torch.Tensor):
        self._group, self._work, self._keep = group, work, keep

    def wait(self, timeout_s: float) -> None:
        self._group.wait(self._work, timeout_s)
        self._keep = None


class BroadcastTransport:
    def __init__(self, group: WeightGroup, timeout_s: float):
        self.group, self.timeout_s = group, timeout_s
        self.kind = group.backend

    def start(self, flat: torch.Tensor) -> Sending:
        if self.kind == "gloo" and flat.is_cuda:
            flat = flat.cpu()
        return _Broadcasting(self.group, self.group.broadcast(flat), flat)

    def recv(self, bucket: WeightBucket, device: torch.device) -> torch.Tensor:
        on = torch.device("cpu") if self.kind == "gloo" else device
        flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=on)
        self.group.wait(self.group.broadcast(flat), self.timeout_s)
        return flat.to(device)

    def close(self) -> None:
        self.group.close()
