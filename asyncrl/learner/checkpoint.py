"""Atomic learner checkpoints: model, optimizer, scheduler, RNG states, step, policy version and an
opaque `extra` dict (the hub's commit point, data cursor).

Only trained parameters are saved: frozen ones (requires_grad False: with LoRA the whole base, see lora.py)
are the model folder's own and are left out of model.pt, so a LoRA checkpoint holds the adapters and their
optimizer state alone (+ scheduler, RNG, step, version, extra). Loading checks that model.pt holds exactly
the model's trained parameters.

Layout: <run_dir>/checkpoints/step-00000042/{model.pt, optimizer.pt, scheduler.pt, rng-rank<r>.pt,
meta.json}. A checkpoint is written under `.tmp-step-...`, every file fsynced, meta.json written last,
then the folder is renamed into place and the parent fsynced; a crash leaves only a `.tmp-*` folder,
which `latest_checkpoint` ignores (and the next save of that step replaces).

With FSDP2 the state is gathered to rank 0 through torch.distributed.checkpoint's state-dict API
(`get_state_dict(full_state_dict=True, cpu_offload=True)`) and loaded back with `broadcast_from_rank0`:
one plain file per component, readable without torch.distributed and loadable with any world size.
(The trade-off: rank 0 holds the whole fp32 model + optimizer state in CPU memory while saving; for
models past tens of billions of parameters a sharded `dcp.save` layout would be the next step.)
Assumes a filesystem shared by the learner ranks (one host, or a network mount).

Non-blocking saves (`CheckpointWriter.save(background=True)`): the learner stalls only for the snapshot —
the state dict is gathered (a collective) and copied into pinned host buffers that are kept for the next
save (one DMA copy per tensor, ~50 GB/s on an H200 host; the first save also allocates them) — then a
background thread, which touches no GPU, writes and fsyncs the files and renames the folder into place.
At most one write is in flight: a checkpoint due while the previous one is still being written is skipped
(logged), never waited for; the learner waits only where the hub's commit window would run out (see
learner/service.py) and for the final checkpoint. A crash during the background write leaves only a
`.tmp-*` folder: the previous checkpoint stays the latest. The learner reports a step as committed to the
hub only once its checkpoint is on disk (`CheckpointWriter.finished`).

    learner thread:  train k ─ snapshot(k) ─ train k+1 ─ train k+2 ─ finished() -> [k] -> CommitStep(k)
    writer thread:                 └─ write, fsync, rename ─┘
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from asyncrl.durable import PacedFile, fsync_dir, write_synced
from asyncrl.learner import fsdp

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(slots=True)
class CheckpointMeta:
    step: int
    policy_version: int
    extra: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step (a folder with meta.json), or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = [(int(m.group(1)), p) for p in root.iterdir()
            if (m := _STEP_DIR.match(p.name)) and (p / "meta.json").is_file()]
    return max(done)[1] if done else None


def save_checkpoint(run_dir: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, step: int, policy_version: int, extra: dict[str, Any],
                    keep: int = 0) -> Path:
    """Collective under FSDP (every rank calls it); returns once the checkpoint is on disk."""
    writer = CheckpointWriter()
    writer.save(run_dir, model=model, optimizer=optimizer, scheduler=scheduler, step=step,
                policy_version=policy_version, extra=extra, keep=keep, background=False)
    writer.wait()
    return Path(run_dir) / "checkpoints" / f"step-{step:08d}"


class CheckpointWriter:
    """Writes checkpoints, at most one in the background at a time (see the module docstring)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._finished: list[tuple[int, Path]] = []
        self._lock = threading.Lock()
        self._pinned: dict[str, torch.Tensor] = {}  # staging buffers, reused by every save (rank 0)

    def save(self, run_dir: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             step: int, policy_version: int, extra: dict[str, Any], keep: int = 0, background: bool = True) -> bool:
        """Collective under FSDP. Snapshots the state now and writes it now, or in the background. A background
        save while the previous write is still going is skipped (returns False): the learner never waits
        for the disk; a foreground save waits for the write in flight first."""
        if background and bool(fsdp.all_reduce(torch.tensor(float(self.busy)), "max").item()):
            return False
        self.wait_writer()
        info = fsdp.dist_info()
        root = Path(run_dir) / "checkpoints"
        tmp = root / f".tmp-step-{step:08d}"
        if info.rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        fsdp.barrier()
        _write(tmp / f"rng-rank{info.rank}.pt", rng_state())
        multi = info.sharded and info.world_size > 1  # then rank 0 gets fresh CPU copies (cpu_offload)
        msd, osd = get_state_dict(model, optimizer, options=_options(cpu_offload=multi))
        msd = _trained_only(msd, _frozen_names(model))
        fsdp.barrier()
        if info.rank == 0:
            state = self._stage({"model.pt": msd, "optimizer.pt": osd, "scheduler.pt": scheduler.state_dict()},
                                clone=not multi)  # the keys `reserve` allocates under
            meta = {"step": step, "policy_version": policy_version, "extra": extra, "world_size": info.world_size}
            job = (state, meta, tmp, root / f"step-{step:08d}", keep)
            if background:
                self._thread = threading.Thread(target=self._run, args=job, name="checkpoint-writer", daemon=True)
                self._thread.start()
            else:
                self._run(*job)
        if not background:
            fsdp.barrier()  # every rank returns with the checkpoint in place
        return True

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def finished(self) -> list[tuple[int, Path]]:
        """(step, folder) of every checkpoint completed since the last call; raises a background failure."""
        with self._lock:
            if self._error is not None:
                error, self._error = self._error, None
                raise RuntimeError(f"checkpoint write failed: {error}") from error
            done, self._finished = self._finished, []
        return done

    def wait(self) -> list[tuple[int, Path]]:
        """Block until no write is in flight; then as `finished`."""
        self.wait_writer()
        return self.finished()

    def wait_writer(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def reserve(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """One process on GPU: allocate the pinned staging buffers of `save` now (pinning ~6 GB takes seconds),
        so that the first checkpoint in the middle of a run does not pay for it. Call once the optimizer has
        state (after the first step). Several ranks stage nothing (rank 0 gets CPU copies), so it is a no-op."""
        info = fsdp.dist_info()
        if info.device.type != "cuda" or info.world_size > 1:
            return
        msd, osd = get_state_dict(model, optimizer, options=_options())
        msd = _trained_only(msd, _frozen_names(model))
        _map_tensors({"model.pt": msd, "optimizer.pt": osd}, "", self._buffer)

    def _stage(self, obj: Any, clone: bool) -> Any:
        """Host copies of a state dict: device tensors into pinned buffers kept for the next save (one DMA
        copy each, then one sync); host tensors cloned when they are views of the live state."""
        def copy(key: str, t: torch.Tensor) -> torch.Tensor:
            if not t.is_cuda:
                return t.detach().clone() if clone else t
            return self._buffer(key, t).copy_(t.detach(), non_blocking=True)

        out = _map_tensors(obj, "", copy)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()
        return out

    def _buffer(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """The pinned host buffer for the device tensor at `key` (allocated on first use, or on a new shape)."""
        buf = self._pinned.get(key)
        if t.is_cuda and (buf is None or buf.shape != t.shape or buf.dtype != t.dtype):
            buf = self._pinned[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return buf

    def _run(self, state: dict[str, Any], meta: dict[str, Any], tmp: Path, final: Path, keep: int) -> None:
        """Disk only (the state is already in host memory): write, fsync, rename, prune."""
        try:
            for name, obj in state.items():
                _write(tmp / name, obj)
            write_synced(tmp / "meta.json", json.dumps(meta, indent=1).encode())
            fsync_dir(tmp)
            _replace_dir(tmp, final)
            _prune(final.parent, keep)
            with self._lock:
                self._finished.append((meta["step"], final))
        except BaseException as e:  # noqa: BLE001 - handed to the learner thread by finished()
            with self._lock:
                self._error = e


def load_checkpoint(path: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> CheckpointMeta:
    """Collective under FSDP. Restores model, optimizer, scheduler and this rank's RNG states."""
    path = Path(path)
    if not (path / "meta.json").is_file():
        raise ValueError(f"{path}: not a complete checkpoint (no meta.json); use latest_checkpoint(run_dir)")
    info = fsdp.dist_info()
    meta = CheckpointMeta(**json.loads((path / "meta.json").read_text()))
    if info.rank == 0 or not info.sharded:
        msd = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
        osd = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        _check_trained_keys(path, model, msd)
    else:
        msd, osd = {}, {}
    # Model then optimizer, in separate calls: set_state_dict() treats an empty (non-zero rank) model
    # dict as "optimizer only" and the ranks' collectives then diverge. Frozen parameters are not in the
    # file: not strict then (they keep the values the model was built with).
    frozen = any(not p.requires_grad for p in model.parameters())
    options = _options(broadcast_from_rank0=info.sharded, strict=not frozen)
    set_model_state_dict(model, msd, options=options)
    set_optimizer_state_dict(model, optimizer, osd, options=options)
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng = path / f"rng-rank{info.rank}.pt"
    if rng.is_file():
        set_rng_state(torch.load(rng, weights_only=True))
    return meta


def _options(**kwargs: Any) -> StateDictOptions:
    """Whole (unsharded) state dicts of the trained parameters only."""
    return StateDictOptions(full_state_dict=True, ignore_frozen_params=True, **kwargs)


def _frozen_names(model: nn.Module) -> set[str]:
    """Every name of a frozen parameter, tied aliases too (ignore_frozen_params drops one name per tensor)."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _trained_only(msd: dict[str, Any], frozen: set[str]) -> dict[str, Any]:
    return {k: v for k, v in msd.items() if k not in frozen} if frozen else msd


def _check_trained_keys(path: Path, model: nn.Module, msd: dict[str, Any]) -> None:
    """model.pt holds every trained parameter of `model` and no other parameter (e.g. not one written with
    other LoRA settings)."""
    named = dict(model.named_parameters(remove_duplicate=False))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    known = {n for n, p in named.items() if p.requires_grad} | {n for n, _ in model.named_buffers()}
    missing, extra = sorted(trained - msd.keys()), sorted(msd.keys() - known)
    if missing or extra:
        raise ValueError(f"{path}: its model.pt does not match this learner's trained parameters ({len(missing)} "
                         f"missing, e.g. {missing[:1]}; {len(extra)} unexpected, e.g. {extra[:1]}); was it written "
                         "with other learner.lora_* settings? Resume with the run's own config")


def _map_tensors(obj: Any, key: str, fn: Any) -> Any:
    """Rebuild a nested state dict with fn(key, tensor) for every tensor; keys are "/"-joined paths, the same
    for every save of one model, so staging buffers can be found again."""
    if isinstance(obj, torch.Tensor):
        return fn(key, obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, f"{key}/{k}", fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(v, f"{key}/{i}", fn) for i, v in enumerate(obj))
    return obj


def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def _write(path: Path, obj: Any) -> None:
    """torch.save, its bytes paced to disk as they are written (durable.PacedFile) and fsynced at the end."""
    with PacedFile(path) as f:
        torch.save(obj, f)


def _replace_dir(tmp: Path, final: Path) -> None:
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _prune(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    done = sorted((int(m.group(1)), p) for p in root.iterdir()
                  if (m := _STEP_DIR.match(p.name)) and (p / "meta.json").is_file())
    for _, p in done[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


