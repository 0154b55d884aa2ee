"""CUDA IPC transport: a generator on the learner's own GPU reads the learner's bucket buffer in place.

NCCL refuses two ranks on one GPU, so when WeightJoin.gpu_uuid equals the learner's GPU the bucket is
shared instead of broadcast. The handle is the plain fields of `UntypedStorage._share_cuda_()` (bytes and
ints), carried in WeightBucket.ipc_handle as ordinary msgpack data, and opened on the other side with
`UntypedStorage._new_shared_cuda(...)`. No pickling: torch.multiprocessing's reducer is never used.

Lifetime (who waits for whom):

    learner: flatten -> share (records an event after the copy) -> announce WeightBucket(ipc_handle)
             ... keeps `flat` alive until the generator's Ack of this bucket ...
    generator: open handle (waits on that event) -> load_weights copies into its params -> drops the view
               (decrements torch's IPC ref counter) -> Ack

Even if the learner frees `flat` early, torch's IPC ref counter keeps the block out of the allocator until
every opener has released it; the Ack ordering is what makes the bytes stable while they are read.

Staged (`IpcTransport(stage=True)`, generator.ipc_staging): the generator opens each bucket on a side stream and
copies it into a buffer of its own there, so the copy waits for the learner's event only, not for the decode
step in flight on the engine's stream; once that copy is done the bucket may be acked, and the engine loads from
its own copy with nothing on its stream waited for:

    generator: open handle on the side stream -> copy into a local buffer (same stream) -> poll its event
               -> drop the view -> Ack -> load_weights from the local buffer (engine stream, no host wait)
"""

from __future__ import annotations

from typing import Any

import torch

from asyncrl.records import WeightBucket
from asyncrl.weights.group import poll

_FIELDS = (
    "device", "handle", "storage_size_bytes", "storage_offset_bytes",
    "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required",
)


def gpu_uuid(device: torch.device | str) -> str:
    """Stable identity of a physical GPU ('' for a CPU device): equal uuids => same GPU."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return ""
    return str(torch.cuda.get_device_properties(device).uuid)


def share(flat: torch.Tensor) -> dict[str, Any]:
    """The IPC handle of `flat` (a CUDA tensor) as plain msgpack-able fields."""
    if not flat.is_cuda:
        raise ValueError(f"CUDA IPC needs a CUDA buffer, got {flat.device}")
    fields = dict(zip(_FIELDS, flat.untyped_storage()._share_cuda_(), strict=True))
    fields["tensor_offset"] = flat.storage_offset() * flat.element_size()
    fields["nbytes"] = flat.numel() * flat.element_size()
    return {k: (bytes(v) if isinstance(v, bytes | bytearray) else v) for k, v in fields.items()}


def open_shared(handle: dict[str, Any], device: torch.device) -> torch.Tensor:
    """The shared buffer as uint8 [nbytes] on `device` (the same physical GPU as the sharer's)."""
    missing = [k for k in (*_FIELDS, "tensor_offset", "nbytes") if k not in handle]
    if missing:
        raise ValueError(f"CUDA IPC handle lacks fields {missing}")
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"CUDA IPC needs a CUDA device, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda._lazy_init()
    args = [handle[k] for k in _FIELDS]
    args[0] = index  # the sharer's index may differ here (CUDA_VISIBLE_DEVICES); the uuid matched
    storage = torch.UntypedStorage._new_shared_cuda(*args)
    flat = torch.empty(0, dtype=torch.uint8, device=device)
    return flat.set_(storage, handle["tensor_offset"], (handle["nbytes"],), (1,))


class _Shared:
    def __init__(self, handle: dict[str, Any]):
        self.handle = handle

    def launch(self) -> None:
        pass  # the generator reads the buffer in place once it has the handle

    def wait(self, timeout_s: float) -> None:
        pass  # nothing moves until the generator reads; the bucket Ack is the completion


class _Opened:
    def __init__(self, flat: torch.Tensor):
        self._flat = flat

    def ready(self) -> bool:
        return True

    def result(self, timeout_s: float) -> torch.Tensor:
        return self._flat


class _Staged:
    """A bucket being copied out of the learner's buffer on a side stream; `result` is the generator's copy."""

    def __init__(self, shared: torch.Tensor, local: torch.Tensor, done: torch.cuda.Event):
        self._shared, self._local, self._done = shared, local, done

    def ready(self) -> bool:
        return self._done.query()

    def result(self, timeout_s: float) -> torch.Tensor:
        if poll(self._done.query, timeout_s):  # a host-side wait: no stream of the engine waits on the copy
            raise TimeoutError(f"CUDA IPC staging copy not done within {timeout_s:.0f}s")
        self._shared = None  # the learner's buffer is read: it may go once this bucket is acked
        # made on the side stream, read on the engine's: not reused before the engine's reads are done
        self._local.record_stream(torch.cuda.current_stream(self._local.device))
        return self._local


class IpcTransport:
    kind = "ipc"

    def __init__(self, stage: bool = False):
        """stage (generator side): copy each bucket out on a side stream before its Ack (module docstring)."""
        self.stage = stage
        self.reads_in_place = not stage  # staged, the engine never reads the learner's buffer itself
        self._side: torch.cuda.Stream | None = None

    def start(self, flat: torch.Tensor) -> _Shared:
        return _Shared(share(flat))

    def post(self, bucket: WeightBucket, device: torch.device) -> _Opened | _Staged:
        if bucket.ipc_handle is None:
            raise ValueError("WeightBucket on a CUDA IPC link carries no ipc_handle")
        if not self.stage:
            return _Opened(self._open(bucket, device))
        if self._side is None:
            self._side = torch.cuda.Stream(device)
        with torch.cuda.stream(self._side):  # the open waits for the learner's event on this stream
            shared = self._open(bucket, device)
            local = torch.empty_like(shared)
            local.copy_(shared, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._side)
        return _Staged(shared, local, done)

    @staticmethod
    def _open(bucket: WeightBucket, device: torch.device) -> torch.Tensor:
        flat = open_shared(bucket.ipc_handle, device)
        if flat.numel() != bucket.nbytes:
            raise ValueError(f"CUDA IPC buffer has {flat.numel()} bytes, bucket announces {bucket.nbytes}")
        return flat

    def close(self) -> None:
        pass
