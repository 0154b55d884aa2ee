"""The base image: one copy of a model's frozen matrices on a device, mapped by every process that computes with
them (`generator.share_base`; the holder that writes it: base_holder.py).

    RUN_DIR/shared_base/manifest.json   where the image is, and every tensor's name, dtype, shape and byte offset
    RUN_DIR/shared_base/image.bin       the bytes, on a CPU device (mapped shared: the page cache holds one copy)

On a CUDA device the bytes are one allocation of the holder's, and the manifest carries its IPC handle
(asyncrl/weights/cuda_ipc.py); a consumer on the same GPU opens it in place. Either way a consumer's tensors are
views of the image, never copies.

Layout: every matrix (2-D parameter: the projections, the embedding, an untied lm_head) under its Hugging Face name,
each group the torch engine fuses (a layer's q/k/v, its gate/up) back to back with no gap, so the fused [q + k + v,
hidden] matrix is a view of the image too; groups start at 256-byte offsets. Vectors (norms, biases) are not in
the image: they are small, and the norms are what LoRA trains beside the adapters by default.

Lifetime: CUDA leaves it undefined what happens to a process that still has an allocation open when its exporter
frees it, so the holder must outlive every consumer: the launcher starts it first, stops it last and ends the run
if it dies. The manifest is written last (renamed into place), so a consumer that sees one sees a whole image;
the launcher deletes the manifest of an earlier launch before anything starts.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from asyncrl.weights import cuda_ipc

FOLDER = "shared_base"
MANIFEST = "manifest.json"
DATA = "image.bin"
ALIGN = 256  # bytes: where every group starts
FUSED = {"q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "gate_proj": ("gate_up", 0),
         "up_proj": ("gate_up", 1)}  # module leaf -> (the engine's fused group, place in it)


@dataclass(frozen=True, slots=True)
class Entry:
    name: str  # Hugging Face parameter name
    dtype: str  # e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int  # bytes from the image's start

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _dtype(self.dtype).itemsize


def folder(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / FOLDER


def matrices(named: Iterable[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
    """The tensors that go into an image: every 2-D floating-point one, a tied one once (under its first name)."""
    seen: set[int] = set()
    out = []
    for name, t in named:
        if t.dim() != 2 or not t.is_floating_point() or id(t) in seen:
            continue
        seen.add(id(t))
        out.append((name, t))
    return out


def layout(named: list[tuple[str, Tensor]]) -> tuple[list[Entry], int]:
    """(entries in image order, total bytes): fused groups back to back, groups aligned to ALIGN."""
    entries, offset = [], 0
    for group in _groups(named):
        offset = -(-offset // ALIGN) * ALIGN
        for name, t in group:
            entries.append(Entry(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
            offset += t.numel() * t.element_size()
    return entries, offset


def _groups(named: list[tuple[str, Tensor]]) -> list[list[tuple[str, Tensor]]]:
    """[[(name, tensor)]]: one group per fused set of a module (q/k/v, gate/up: in that order), else one each."""
    groups: dict[tuple[str, str], list[tuple[int, str, Tensor]]] = {}
    for i, (name, t) in enumerate(named):
        module, _, leaf = name.removesuffix(".weight").rpartition(".")
        fused = FUSED.get(leaf) if name.endswith(".weight") else None
        key = (module, fused[0]) if fused else (name, "")
        groups.setdefault(key, []).append((fused[1] if fused else i, name, t))
    return [[(name, t) for _, name, t in sorted(members, key=lambda m: m[0])] for members in groups.values()]


def write(run_dir: str | os.PathLike, named: list[tuple[str, Tensor]], device: torch.device) -> Tensor:
    """Lay `named` (matrices()) out in one image on `device`, publish its manifest; -> the image (uint8 [nbytes]),
    which the caller keeps alive for as long as any consumer may use it."""
    entries, nbytes = layout(named)
    where = folder(run_dir)
    where.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    else:
        path = where / DATA
        path.unlink(missing_ok=True)  # never map an older image
        flat = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
    tensors = dict(named)
    with torch.no_grad():
        for e in entries:
            _view(flat, e).copy_(tensors[e.name])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        place: dict[str, Any] = {"gpu_uuid": cuda_ipc.gpu_uuid(device), "ipc": _hex(cuda_ipc.share(flat))}
    else:
        place = {"file": DATA}
    manifest = {"device": device.type, "nbytes": nbytes, "pid": os.getpid(), **place,
                "tensors": [{"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "offset": e.offset}
                            for e in entries]}
    tmp = where / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, where / MANIFEST)  # last: a manifest seen is a whole image
    return flat


def clear(run_dir: str | os.PathLike) -> None:
    """Forget an earlier launch's image (the launcher, before any process starts)."""
    (folder(run_dir) / MANIFEST).unlink(missing_ok=True)


def remove(run_dir: str | os.PathLike) -> None:
    """The holder, as it stops: the manifest and a CPU image's file (a mapping still open keeps its pages)."""
    clear(run_dir)
    (folder(run_dir) / DATA).unlink(missing_ok=True)


def read_manifest(run_dir: str | os.PathLike, timeout_s: float, poll_s: float = 0.2) -> dict[str, Any]:
    """The manifest, once the holder has published it; TimeoutError naming the holder's log after `timeout_s`."""
    path = folder(run_dir) / MANIFEST
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"generator.share_base: no base image at {path} after {timeout_s:.0f}s; the base "
                               "holder writes it (see logs/base-holder.log in the run directory)")
        time.sleep(poll_s)
    return json.loads(path.read_text())


def open_image(run_dir: str | os.PathLike, device: str | torch.device, timeout_s: float = 600.0) -> dict[str, Tensor]:
    """{HF name: a view of the image} on `device`, which must be the holder's (the same GPU, or the CPU)."""
    device = torch.device(device)
    manifest = read_manifest(run_dir, timeout_s)
    if manifest["device"] != device.type:
        raise ValueError(f"generator.share_base: the base image is on {manifest['device']}, this process computes "
                         f"on {device}; the learner and every generator must be on one device to share it")
    nbytes = int(manifest["nbytes"])
    if device.type == "cuda":
        if manifest["gpu_uuid"] != cuda_ipc.gpu_uuid(device):
            raise ValueError(f"generator.share_base: the base image is on another GPU than {device}; the learner "
                             "and every generator must be on one GPU to share it")
        flat = cuda_ipc.open_shared(_unhex(manifest["ipc"]), device)
    else:
        path = folder(run_dir) / manifest["file"]
        if path.stat().st_size != nbytes:
            raise ValueError(f"generator.share_base: {path} holds {path.stat().st_size} bytes, its manifest says "
                             f"{nbytes}")
        flat = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
    if flat.numel() != nbytes:
        raise ValueError(f"generator.share_base: the base image has {flat.numel()} bytes, its manifest says {nbytes}")
    entries = [Entry(t["name"], t["dtype"], tuple(t["shape"]), int(t["offset"])) for t in manifest["tensors"]]
    return {e.name: _view(flat, e) for e in entries}


def _view(flat: Tensor, e: Entry) -> Tensor:
    return flat[e.offset:e.offset + e.nbytes].view(_dtype(e.dtype)).view(e.shape)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"base image: unknown dtype {name!r}")
    return dtype


def _hex(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: {"hex": v.hex()} if isinstance(v, bytes) else v for k, v in fields.items()}


def _unhex(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: bytes.fromhex(v["hex"]) if isinstance(v, dict) else v for k, v in fields.items()}
