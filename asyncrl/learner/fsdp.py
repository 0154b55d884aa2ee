"""Process-group helpers and FSDP2 wrapping of the policy.

With an initialised default process group (any world size, gloo on CPU, NCCL on GPU) the model is
sharded with `fully_shard`: one FSDP unit per decoder layer (the classes HF lists in `_no_split_modules`;
with one rank there is no communication to overlap, so the whole model is one unit and the per-layer
hooks' host time is saved) and the `PolicyModel` as root (embeddings, final norm, lm_head, value head). Master parameters stay fp32
and only the optimizer touches them; forward and backward run on bf16 copies that FSDP makes once per
unit per micro-batch, with fp32 gradient reduction (`MixedPrecisionPolicy`). A single process that trains
in bf16 joins a one-rank group of its own (`init_single_rank`) so it gets the same mixed precision instead
of autocast over fp32 weights (which re-casts every weight in every matmul). Without a group (fp32, e.g.
the CPU default) the model is used as is.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True, slots=True)
class DistInfo:
    rank: int
    world_size: int
    device: torch.device
    sharded: bool  # FSDP2 in use (a process group is initialised)


def default_device(rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def dist_info(device: str | torch.device | None = None) -> DistInfo:
    sharded = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if sharded else 0
    world = dist.get_world_size() if sharded else 1
    dev = torch.device(device) if device is not None else default_device(rank)
    return DistInfo(rank=rank, world_size=world, device=dev, sharded=sharded)


def init_single_rank(device: torch.device) -> None:
    """A one-rank process group over an in-process store (no port, no file, nothing to collide with or
    leave behind), for a Trainer used outside the launcher."""
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)


def decoder_layers(hf: nn.Module) -> list[nn.Module]:
    names = set(getattr(hf, "_no_split_modules", None) or [])
    layers = [m for m in hf.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(hf).__name__}: no decoder layers found (_no_split_modules={sorted(names)}); "
                         "FSDP2 needs per-layer units")
    return layers


def shard(root: nn.Module, hf: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """fully_shard every decoder layer, then the root, in place, over a 1-D mesh of all ranks on
    `device`'s type (explicit: the default mesh would pick CUDA whenever it exists, even for CPU ranks).
    One rank: the frozen parameters (LoRA's base, a shared base image's views, a whole KL reference model) are cast
    to the compute dtype once and left out of FSDP (`ignored_params`). FSDP2 on one rank keeps the unsharded compute
    copy beside each shard for the whole run (ComputeCopy), so a frozen tensor given to it would be held twice: 14 GiB
    more for a 7B LoRA base in bf16, 6 bytes a parameter instead of 2 for an fp32 reference. A model with nothing
    left to train is not wrapped at all."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    world = dist.get_world_size()
    ignored = held_once(root, dtype) if world == 1 else set()
    if ignored and len(ignored) == len(list(root.parameters())):
        return
    mesh = init_device_mesh(device.type, (world,))
    # One rank: keep each unit's compute-dtype copy from forward to backward (there is nothing to free).
    kwargs: dict = {"mesh": mesh, "reshard_after_forward": world > 1, **({"ignored_params": ignored} if ignored else {})}
    if dtype != torch.float32:
        # Inputs keep their dtype: the root's float input is the per-token temperature, which must stay fp32
        # (0.8 in bf16 is 0.80078); the embedding output is already in the compute dtype.
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                                   cast_forward_inputs=False)
    if world > 1:  # per-layer units overlap communication with compute; one rank has nothing to overlap
        for layer in decoder_layers(hf):
            fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)


def held_once(root: nn.Module, dtype: torch.dtype) -> set[nn.Parameter]:
    """The frozen parameters of `root`, each cast to `dtype` in place (the cast FSDP2's unshard would make, made once;
    a tensor already in it, such as a shared image's view, is kept as it is). Buffers keep their dtype."""
    frozen = {p for p in root.parameters() if not p.requires_grad}
    for p in frozen:
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return frozen


def accumulating(model: nn.Module, last: bool) -> None:
    """Before each micro-batch of a mini-batch. With one rank, keep the unsharded compute-dtype parameters (for
    the whole run: see ComputeCopy) and skip the gradient "reduction" (a cast and copy) until the mini-batch's
    last micro-batch: FSDP2 then accumulates the unsharded gradients in its reduce dtype (fp32), so the numbers
    are unchanged. With several ranks every micro-batch reduce-scatters as before (holding unsharded gradients
    would cost memory)."""
    if getattr(model, "set_requires_gradient_sync", None) is None or dist.get_world_size() > 1:
        return
    model.set_requires_gradient_sync(last)
    model.set_reshard_after_backward(False)


class ComputeCopy:
    """One rank: the compute-dtype parameters stay unsharded for the whole run, refreshed from the fp32
    masters after each optimizer step by one multi-tensor cast.

    FSDP2 unshards a one-rank group parameter by parameter (a cast and a copy each: for the 0.5B model 290 pairs
    of small kernels and ~14 ms of host time before a step's first forward kernel, the GPU idle meanwhile).
    With one rank nothing needs freeing: `shard` sets no reshard after forward and `accumulating` none after
    backward, so the copy FSDP made at the first forward stays, and `refresh` brings it to the updated masters.
    A state-dict call (checkpoint, reserve) makes FSDP reshard and free the copy; until the next forward
    unshards again the usual way, `refresh` has nothing to do. Several ranks: a no-op (FSDP re-gathers).
    Frozen parameters (LoRA's base) never change, so only the trained ones are refreshed."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        sharded = dist.is_available() and dist.is_initialized()
        self.enabled = sharded and dist.get_world_size() == 1
        # name -> the fp32 master's local tensor (the whole tensor on one rank; updated in place by the optimizer)
        self.masters = {name: local_tensor(p).detach() for name, p in model.named_parameters()
                        if p.requires_grad} if self.enabled else {}

    @torch.no_grad()
    def refresh(self) -> None:
        if not self.enabled:
            return
        current = [(name, p) for name, p in self.model.named_parameters() if name in self.masters]
        if not current or hasattr(current[0][1], "device_mesh"):
            return  # resharded (DTensor parameters): FSDP's next unshard casts the masters itself
        dst = [p.detach() for _, p in current]
        src = [self.masters[name] for name, _ in current]
        torch._foreach_copy_(dst, src)


def local_tensor(t: Tensor) -> Tensor:
    """This rank's shard of a DTensor (FSDP2 parameter or gradient); a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def autocast(info: DistInfo, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """bf16/fp16 compute without FSDP (FSDP's MixedPrecisionPolicy handles it when sharded)."""
    if info.sharded or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(info.device.type, dtype=dtype)


def full_tensor(t: Tensor) -> Tensor:
    """The whole tensor of a (possibly DTensor-sharded) parameter; a collective under FSDP with several ranks.
    On a one-rank mesh the local shard is the whole tensor (no all-gather launched per parameter)."""
    if not hasattr(t, "full_tensor"):
        return t
    if t.device_mesh.size() == 1:
        return t.to_local()
    return t.full_tensor()


def all_reduce(t: Tensor, op: str = "sum") -> Tensor:
    """Sum / max over learner ranks (identity without a process group); returns a tensor on t's device."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    device = t.device
    backend_device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    buf = t.detach().to(backend_device).clone()
    dist.all_reduce(buf, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return buf.to(device)


def barrier() -> None:
    """Wait for every learner rank. Nothing to wait for on one: NCCL's barrier would sync the device on every
    call and set up its communicator on the first: the first checkpoint's stall was 1.37-1.49 s against ~0.14 s for
    the later ones on an H100 (48d9b76), and 0.11 s like the rest once this skipped it (7805461, docs/lora.md)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
