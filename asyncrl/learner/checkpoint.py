"""Atomic learner checkpoints: model, optimizer, scheduler, RNG states, step, policy version and an
opaque `extra` dict (the hub's commit point, data cursor).

Only trained parameters are saved: frozen ones (requires_grad False: with LoRA the whole base, see lora.py) are
the model folder's own, so a LoRA checkpoint holds the adapters and their optimizer state alone (+ scheduler,
RNG, step, version, extra). Loading checks that the model files hold exactly the model's trained parameters.

Layout: <run_dir>/checkpoints/step-00000042/{model.pt, model-1.pt, .., optimizer.pt, optimizer-1.pt, ..,
scheduler.pt, rng-rank<r>.pt, meta.json}: model.pt whole on one file thread, the optimizer's "state" split by
parameter into contiguous runs of about equal bytes, one per other thread (`CheckpointWriter(writers=4)`), all
written at once, and rebuilt (keys in order) from meta.json's "files" (absent: one file each, as before). All is
written under `.tmp-step-...`, each file paced to disk (durable.PacedFile, PACE_BYTES / writers: the threads
together keep at most PACE_BYTES unsynced) and fsynced; once every thread is done meta.json, then the folder
is renamed into place and the parent fsynced. A crash leaves a `.tmp-*` folder, which `latest_checkpoint`
ignores (the next save of that step replaces it).

With FSDP2 the state is gathered to rank 0 (`get_state_dict(full_state_dict=True, cpu_offload=True)`), loaded
back with `broadcast_from_rank0`: plain files, loadable with any world size (rank 0 holds the whole fp32 state in
CPU memory; past tens of billions of parameters, a sharded `dcp.save` layout). Assumes a filesystem shared by the ranks.

Non-blocking saves (`save(background=True)`): the learner stalls only for the snapshot — the state dict gathered
(a collective; on one process read from the live tensors by a plan traced from the first `get_state_dict`,
state_snapshot.py: 0.13 s against 0.89 s for a 7B LoRA learner on an H100), copied into pinned host buffers kept
for the next save (~50 GB/s on an H200 host) — then a
thread, touching no GPU, writes and renames. At most one write is in flight: one due while the previous is being
written is skipped (logged), never waited for; the learner waits only where the hub's commit window would run
out (learner/service.py) and at the end of the run, and commits a step once it is on disk (`finished`).

    learner thread:  train k ─ snapshot(k) ─ train k+1 ─ train k+2 ─ finished() -> [k] -> CommitStep(k)
    writer thread:                 └─ N file threads: write, fsync ─ meta.json, rename ─┘
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from asyncrl.durable import PACE_BYTES, PacedFile, fsync_dir, replace_dir, write_synced
from asyncrl.learner import fsdp
from asyncrl.learner.rng_state import rng_state, set_rng_state
from asyncrl.learner.state_snapshot import StateSnapshot

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
WRITERS = 4  # file threads per checkpoint
PROGRESS_EVERY_S = 2.0


@dataclass(slots=True)
class CheckpointMeta:
    step: int
    policy_version: int
    extra: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    files: dict[str, list[str]] = field(default_factory=dict)  # "model" / "optimizer" -> its files, in order


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step (a folder with meta.json), or None."""
    done = _complete(Path(run_dir) / "checkpoints")
    return done[-1][1] if done else None


def _complete(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint under `root`, by step."""
    return sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else ())
                  if (m := _STEP_DIR.match(p.name)) and (p / "meta.json").is_file())


class CheckpointWriter:
    """Writes checkpoints, at most one in the background at a time (see the module docstring)."""

    def __init__(self, writers: int = WRITERS) -> None:
        if writers < 1:
            raise ValueError(f"CheckpointWriter(writers={writers}): must be >= 1")
        self.writers, self._next_label = writers, ""  # the label of the next write (announce_next)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._finished: list[tuple[int, Path]] = []
        self._lock = threading.Lock()
        self._pinned: dict[str, torch.Tensor] = {}  # staging buffers, reused by every save (rank 0)
        self._snapshot: StateSnapshot | None = None  # where the state's tensors live (one process)

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
        msd, osd = self._state(model, optimizer, multi)
        fsdp.barrier()
        if info.rank == 0:
            state = self._stage({"model.pt": msd, "optimizer.pt": osd, "scheduler.pt": scheduler.state_dict()},
                                clone=not multi)  # the keys `reserve` allocates under
            jobs, files = _deal(state, self.writers)
            meta = {"step": step, "policy_version": policy_version, "extra": extra, "world_size": info.world_size,
                    "files": files}
            label, self._next_label = self._next_label, ""
            job = (jobs, meta, tmp, root / f"step-{step:08d}", keep, label)
            if background:
                self._thread = threading.Thread(target=self._run, args=job, name="checkpoint-writer", daemon=True)
                self._thread.start()
            else:
                self._run(*job)
        if not background:
            fsdp.barrier()  # every rank returns with the checkpoint in place
        return True

    def announce_next(self, label: str) -> None:
        """The next save's write logs its progress every PROGRESS_EVERY_S ("final checkpoint: 2.1/6.0 GB, 4 s")
        and its end under `label` (rank 0; call on the learner thread)."""
        self._next_label = label

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
        msd, osd = self._state(model, optimizer, multi=False)
        _map_tensors({"model.pt": msd, "optimizer.pt": osd}, "", self._buffer)

    def forget_snapshot(self) -> None:
        """The next save gathers with `get_state_dict` and traces again (bench.learner times both ways)."""
        self._snapshot = None

    def _state(self, model: nn.Module, optimizer: torch.optim.Optimizer, multi: bool) -> tuple[dict, dict]:
        """The trained model's and the optimizer's whole state dicts. One process: read from the live tensors
        by the plan traced from the first `get_state_dict` (state_snapshot.py: its Python walk was most of the
        stall), traced anew when the state changed shape."""
        if not multi and self._snapshot is not None:
            if (state := self._snapshot.read(optimizer)) is not None:
                return state
            log.info("checkpoint: the state changed since its snapshot plan was traced (%s); tracing again",
                     self._snapshot.miss)
        msd, osd = get_state_dict(model, optimizer, options=_options(cpu_offload=multi))
        msd = _trained_only(msd, _frozen_names(model))
        self._snapshot = None if multi else StateSnapshot.trace(model, optimizer, msd, osd)
        return msd, osd

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

    def _run(self, jobs: list[list[tuple[str, Any]]], meta: dict[str, Any], tmp: Path, final: Path, keep: int,
             label: str) -> None:
        """Disk only (the state is already in host memory): one thread per job writes and fsyncs its files;
        once all have, meta.json, rename, prune."""
        try:
            self._write_parallel(jobs, tmp, label)
            write_synced(tmp / "meta.json", json.dumps(meta, indent=1).encode())
            fsync_dir(tmp)
            replace_dir(tmp, final)
            _prune(final.parent, keep)
            with self._lock:
                self._finished.append((meta["step"], final))
        except BaseException as e:  # noqa: BLE001 - handed to the learner thread by finished()
            with self._lock:
                self._error = e

    def _write_parallel(self, jobs: list[list[tuple[str, Any]]], tmp: Path, label: str) -> None:
        """Every job's files written, each job on its own thread; with `label`, progress logged meanwhile.
        Raises the first failure, once every thread has stopped."""
        total = sum(_nbytes(obj) for job in jobs for _, obj in job)
        written = [0] * len(jobs)  # bytes per job, each slot added to by its own thread only
        pace, t0 = max(PACE_BYTES // len(jobs), 8 << 20), time.monotonic()

        def write_job(i: int) -> None:
            def count(n: int) -> None:
                written[i] += n
            for name, obj in jobs[i]:
                _write(tmp / name, _Part(obj, pace, count))

        with futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="checkpoint-file") as pool:
            running = [pool.submit(write_job, i) for i in range(len(jobs))]
            while futures.wait(running, PROGRESS_EVERY_S, futures.FIRST_EXCEPTION).not_done:
                if any(f.done() and f.exception() is not None for f in running):
                    break
                if label:
                    log.info("%s: %.1f/%.1f GB, %.0f s", label, min(sum(written), total) / 1e9, total / 1e9,
                             time.monotonic() - t0)
        for f in running:
            f.result()  # the first failure, raised
        if label:
            log.info("%s: %.1f GB written in %.1f s (%d files at once)", label, total / 1e9,
                     time.monotonic() - t0, len(jobs))


@dataclass(slots=True)
class _Part:
    """One file of a parallel write: its object, its PacedFile's pacing, the write's byte counter."""
    obj: Any
    pace_bytes: int = PACE_BYTES
    on_write: Callable[[int], None] | None = None


def _deal(state: dict[str, Any], writers: int) -> tuple[list[list[tuple[str, Any]]], dict[str, list[str]]]:
    """{"model.pt", "optimizer.pt", "scheduler.pt"} -> the file threads' jobs ((name, object) each) and the model's
    and the optimizer's files in order: job 0 writes model.pt (whole: a third of the bytes with Adam) and the
    scheduler, jobs 1.. the optimizer's "state" cut into `writers - 1` runs (_runs; optimizer.pt has param_groups)."""
    osd = state["optimizer.pt"]
    jobs: list[list[tuple[str, Any]]] = [[("model.pt", state["model.pt"]), ("scheduler.pt", state["scheduler.pt"])]]
    files: dict[str, list[str]] = {"model": ["model.pt"], "optimizer": []}
    for i, run in enumerate(_runs(list(osd["state"].items()), max(writers - 1, 1))):
        name = "optimizer.pt" if i == 0 else f"optimizer-{i}.pt"
        jobs.append([(name, {**osd, "state": dict(run)} if i == 0 else {"state": dict(run)})])
        files["optimizer"].append(name)
    return ([[f for job in jobs for f in job]] if writers == 1 else jobs), files


def _runs(items: list[tuple[str, Any]], n: int) -> list[list[tuple[str, Any]]]:
    """`items` cut into at most `n` contiguous non-empty runs of about equal tensor bytes ([[]] for none)."""
    total, acc = sum(_nbytes(v) for _, v in items), 0
    runs: list[list[tuple[str, Any]]] = [[]]
    for key, value in items:
        if runs[-1] and len(runs) < n and acc >= total * len(runs) / n:
            runs.append([])
        runs[-1].append((key, value))
        acc += _nbytes(value)
    return runs


def _nbytes(obj: Any) -> int:
    sizes: list[int] = []
    _map_tensors(obj, "", lambda _, t: sizes.append(t.numel() * t.element_size()))
    return sum(sizes)


def load_checkpoint(path: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> CheckpointMeta:
    """Collective under FSDP. Restores model, optimizer, scheduler and this rank's RNG states."""
    path = Path(path)
    if not (path / "meta.json").is_file():
        raise ValueError(f"{path}: not a complete checkpoint (no meta.json); use latest_checkpoint(run_dir)")
    info = fsdp.dist_info()
    meta = CheckpointMeta(**json.loads((path / "meta.json").read_text()))
    if info.rank == 0 or not info.sharded:
        msd, osd = _read_state(path, meta.files)
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


def _read_state(path: Path, files: dict[str, list[str]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and the optimizer's state dicts, each rebuilt from its files in order."""
    def read(name: str) -> Any:
        return torch.load(path / name, map_location="cpu", weights_only=True)

    msd: dict[str, Any] = {}
    for name in files.get("model", ["model.pt"]):
        msd.update(read(name))
    names = files.get("optimizer", ["optimizer.pt"])
    osd = read(names[0])
    for name in names[1:]:
        osd["state"].update(read(name)["state"])
    return msd, osd


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


def _write(path: Path, obj: Any) -> None:
    """torch.save of `obj` (a _Part: its object, paced and counted so) into a durable.PacedFile, fsynced."""
    part = obj if isinstance(obj, _Part) else _Part(obj)
    with PacedFile(path, part.pace_bytes, on_write=part.on_write) as f:
        torch.save(part.obj, f)


def _prune(root: Path, keep: int) -> None:
    if keep > 0:
        for _, p in _complete(root)[:-keep]:
            shutil.rmtree(p, ignore_errors=True)
