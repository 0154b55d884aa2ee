"""GPU placement on one host: which device each learner rank and each generator gets, checked at load.

    place(learner_ranks=4, learner_devices=[], generators=4, generator_devices=[], gpus=8)
      -> Placement(learner=[cuda:0..cuda:3], generators=[cuda:4..cuda:7], weight_paths=[nccl x4])

Defaults (empty device lists): learner ranks take cuda:0..K-1 (one GPU each: they form one NCCL group),
generators take the GPUs left, round-robin; with no GPU left they share the learner's GPUs (the one on
learner rank 0's GPU then receives by CUDA IPC). Without GPUs everything is "cpu" (gloo).

An arrangement that cannot work is a ValueError naming the field and the fix, before any process starts:
a device index this host lacks, "cuda" without an index, a count that does not match the device list,
learner ranks split over CPU and GPU, or two learner ranks on one GPU (NCCL refuses two ranks of one group
on one GPU). A learner on CPU pushes to a GPU generator by gloo (stated in `weight_paths`). Two generators
may share one GPU: each generator has its own weight group with learner rank 0, so no group holds two ranks
there. `run_placement(cfg)` applies this to a RunConfig (the launcher calls it before starting anything).

`nccl_env()` is the environment every GPU child gets so that NCCL is configured the same in every process
(a learner and a generator that disagree on NCCL_CUMEM_ENABLE may fail to connect), with NVLink multicast
off as the GPU hosts require.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.net.nccl_env import nccl_env  # noqa: F401  (the launcher's children get it; asyncrl.net.nccl_env owns it)


@dataclass(frozen=True, slots=True)
class Placement:
    learner: list[str]  # device of each learner rank
    generators: list[str]  # device of each generator
    weight_paths: list[str]  # per generator: "nccl" | "ipc" | "gloo" (how its weights arrive)

    def describe(self) -> str:
        gens = ", ".join(f"{d} ({p})" for d, p in zip(self.generators, self.weight_paths, strict=True))
        return f"learner ranks on {', '.join(self.learner)}; generators on {gens}"


def place(*, learner_ranks: int, learner_devices: list[str], generators: int, generator_devices: list[str],
          gpus: int) -> Placement:
    """Assign and check devices for `learner_ranks` learner ranks and `generators` generators on a host
    with `gpus` GPUs. ValueError names the config field and the fix."""
    if learner_ranks < 1 or generators < 0:
        raise ValueError(f"learner.ranks={learner_ranks}, generator.count={generators}: need >= 1 rank and >= 0 generators")
    learner = list(learner_devices) or _default_learner(learner_ranks, gpus)
    gens = list(generator_devices) or _default_generators(generators, learner, gpus)
    _check_list("learner.devices", learner, learner_ranks, gpus)
    _check_list("generator.devices", gens, generators, gpus)
    _check_learner(learner)
    return Placement(learner=learner, generators=gens, weight_paths=[_path(learner[0], g) for g in gens])


def run_placement(cfg: Any, gpus: int | None = None) -> Placement:
    """The placement of a RunConfig on this host (`gpus`: default torch.cuda.device_count())."""
    if gpus is None:
        gpus = visible_gpus()
    placement = place(learner_ranks=cfg.learner.ranks, learner_devices=cfg.learner.devices,
                      generators=cfg.generator.count, generator_devices=cfg.generator.devices, gpus=gpus)
    if cfg.generator.share_base:
        _check_one_device(placement)
    return placement


def _check_one_device(placement: Placement) -> None:
    """generator.share_base: the base image is one device's, mapped by the learner and every generator."""
    apart = [d for d in placement.generators if d != placement.learner[0]]
    if apart:
        raise ValueError(f"generator.share_base = true with generator.devices={placement.generators} and the learner "
                         f"on {placement.learner[0]}: every generator must be on the learner's device to map its "
                         f"base image; set generator.devices = {[placement.learner[0]] * len(placement.generators)} or "
                         "generator.share_base = false")


def visible_gpus() -> int:
    """GPUs torch can use here; a host without GPU device nodes answers 0 without importing torch (1-3 s of a
    CPU launch's start-up)."""
    if not any(next(Path("/dev").glob(pattern), None) for pattern in ("nvidia[0-9]*", "kfd", "dxg")):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _default_learner(ranks: int, gpus: int) -> list[str]:
    if gpus == 0:
        return ["cpu"] * ranks
    if ranks > gpus:
        raise ValueError(f"learner.ranks={ranks} needs {ranks} GPUs (one per rank) but this host has {gpus}: "
                         f"lower learner.ranks or set learner.devices")
    return [f"cuda:{i}" for i in range(ranks)]


def _default_generators(count: int, learner: list[str], gpus: int) -> list[str]:
    if gpus == 0:
        return ["cpu"] * count
    used = {_index(d) for d in learner if d.startswith("cuda")}
    free = [i for i in range(gpus) if i not in used] or sorted(used)
    return [f"cuda:{free[i % len(free)]}" for i in range(count)]


def _check_list(field: str, devices: list[str], expected: int, gpus: int) -> None:
    if len(devices) != expected:
        raise ValueError(f"{field} has {len(devices)} entries but {expected} are needed: give one device per process")
    for i, d in enumerate(devices):
        if d == "cpu":
            continue
        if not d.startswith("cuda:") or not d[5:].isdigit():
            raise ValueError(f"{field}[{i}]={d!r}: write 'cpu' or 'cuda:<index>' (the index is required)")
        if _index(d) >= gpus:
            have = f"cuda:0..cuda:{gpus - 1}" if gpus else "no GPU"
            raise ValueError(f"{field}[{i}]={d!r} but this host has {gpus} GPU(s) ({have}): fix the index or run on a larger host")


def _check_learner(learner: list[str]) -> None:
    kinds = {d == "cpu" for d in learner}
    if len(kinds) > 1:
        raise ValueError(f"learner.devices={learner}: all ranks on CPU or all on GPUs (one process group holds them)")
    seen: dict[str, int] = {}
    for rank, d in enumerate(learner):
        if d != "cpu" and d in seen:
            raise ValueError(f"learner.devices: ranks {seen[d]} and {rank} both on {d}; NCCL refuses two ranks of one "
                             "group on one GPU: give each rank its own GPU")
        seen.setdefault(d, rank)


def _path(learner0: str, generator: str) -> str:
    """How weights reach a generator from learner rank 0 (WeightSender picks the same at join time)."""
    if learner0 == "cpu" or generator == "cpu":
        return "gloo"
    return "ipc" if learner0 == generator else "nccl"


def _index(device: str) -> int:
    return int(device.split(":", 1)[1])
