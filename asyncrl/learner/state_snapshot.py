"""Where each tensor of the learner's checkpointed state lives, found once (one process only).

torch's `get_state_dict` walks every module and every optimizer entry and rebuilds their names on each call:
~0.2 s of Python for a 28-layer LoRA learner on the 2-core CPU machine, all of it inside a background
checkpoint's stall (learner/checkpoint.py). On one process the tensors it returns are the live ones — views of the
parameters', buffers' and optimizer states' own storage — so its first answer says where every leaf comes from:

    model.pt     key -> the parameter or buffer object    read as its local shard
    optimizer.pt state/key/name -> (parameter, name)    read as optimizer.state[parameter][name], local shard
                 param_groups                            the traced groups with each live group's hyperparameters

The model's objects are the ones registered on their modules when traced: FSDP2's sharded parameters, which
it registers again at every reshard (between steps it may leave its unsharded compute-dtype copies registered
instead, which `get_state_dict`'s pre-hook swaps back first: the plan never reads a module attribute). Later
saves read the leaves from those places (whatever tensor is there now: `load_state_dict` replaces the
optimizer's state tensors) and rebuild only the non-tensor parts, so a learning-rate schedule is seen. A leaf that cannot be traced to a live tensor (several
ranks: `get_state_dict` returns gathered copies), or a read whose shape or dtype differs from the traced one,
gives None: the caller then calls `get_state_dict` again and traces anew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class _Leaf:
    owner: torch.Tensor  # the parameter or buffer (model.pt), or the parameter whose optimizer state it is
    name: str | None  # the optimizer-state key; None for model.pt
    shape: torch.Size
    dtype: torch.dtype


class StateSnapshot:
    """The model and optimizer state dicts of `get_state_dict`, read from their live tensors (see module doc)."""

    def __init__(self, model_leaves: dict[str, _Leaf], optim_leaves: dict[str, dict[str, _Leaf]],
                 optim_extras: dict[str, dict[str, Any]], groups: list[dict[str, Any]]) -> None:
        self.model_leaves, self.optim_leaves = model_leaves, optim_leaves
        self.optim_extras = optim_extras  # non-tensor entries of a parameter's optimizer state, as traced
        self.groups = groups  # the traced param_groups ("params" holds names)
        self.miss = ""  # why the last read gave None

    @classmethod
    def trace(cls, model: nn.Module, optimizer: torch.optim.Optimizer, msd: dict[str, Any],
              osd: dict[str, Any]) -> StateSnapshot | None:
        """The plan of `get_state_dict`'s answer (msd, osd) for `model` and `optimizer`; None when a tensor of
        it is not a live one (a copy: several ranks, offloading)."""
        places = _model_places(model)
        for p, state in optimizer.state.items():
            for name, v in state.items():
                if isinstance(v, torch.Tensor):
                    places.setdefault(_where(_local(v)), (p, name))
        model_leaves = {}
        for key, v in msd.items():
            place = places.get(_where(v)) if isinstance(v, torch.Tensor) else None
            if place is None or place[1] is not None:
                return None
            model_leaves[key] = _Leaf(*place, v.shape, v.dtype)
        optim_leaves: dict[str, dict[str, _Leaf]] = {}
        extras: dict[str, dict[str, Any]] = {}
        for key, state in osd.get("state", {}).items():
            optim_leaves[key], extras[key] = {}, {}
            for name, v in state.items():
                if not isinstance(v, torch.Tensor):
                    extras[key][name] = v
                elif (place := places.get(_where(v))) is None or place[1] is None:
                    return None
                else:
                    optim_leaves[key][name] = _Leaf(*place, v.shape, v.dtype)
            if not optim_leaves[key]:  # no tensor to say whose state it is
                return None
        if set(osd) - {"state", "param_groups"} or len(osd.get("param_groups", [])) != len(optimizer.param_groups):
            return None
        return cls(model_leaves, optim_leaves, extras, [dict(g) for g in osd.get("param_groups", [])])

    def read(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(model state dict, optimizer state dict) as `get_state_dict` would give them now; None when the
        live state no longer matches the plan (trace again), with the first difference in `self.miss`."""
        self.miss = ""
        msd = {}
        for key, leaf in self.model_leaves.items():
            if (t := _read(leaf.owner, leaf)) is None:
                return self._missed(f"model.pt {key}")
            msd[key] = t
        if len(optimizer.state) != len(self.optim_leaves):
            return self._missed(f"optimizer state for {len(optimizer.state)} parameters, traced with "
                                f"{len(self.optim_leaves)}")
        state: dict[str, dict[str, Any]] = {}
        for key, leaves in self.optim_leaves.items():
            entry = dict(self.optim_extras[key])
            live = optimizer.state.get(next(iter(leaves.values())).owner, {})
            if len(live) != len(entry) + len(leaves):
                return self._missed(f"optimizer.pt {key}: {sorted(live)}")
            for name, leaf in leaves.items():
                if (t := _read(live.get(name), leaf)) is None:
                    return self._missed(f"optimizer.pt {key}/{name}")
                entry[name] = t
            state[key] = entry
        groups = [{**traced, **{k: v for k, v in live.items() if k != "params"}}
                  for traced, live in zip(self.groups, optimizer.param_groups)]
        return msd, {"state": state, "param_groups": groups}

    def _missed(self, what: str) -> None:
        self.miss = what
        return None


def _model_places(model: nn.Module) -> dict[tuple, tuple[torch.Tensor, None]]:
    """Every parameter and buffer of `model` by where its (local) data is -> (the tensor, None)."""
    places: dict[tuple, tuple[torch.Tensor, None]] = {}
    for t in [*model.parameters(), *model.buffers()]:
        places.setdefault(_where(_local(t)), (t, None))
    return places


def _read(t: Any, leaf: _Leaf) -> torch.Tensor | None:
    if not isinstance(t, torch.Tensor):
        return None
    t = _local(t).detach()
    return t if t.shape == leaf.shape and t.dtype == leaf.dtype else None


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the whole tensor on a one-rank mesh); a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _where(t: torch.Tensor) -> tuple:
    """What makes two tensors the same view of the same memory."""
    return (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
