"""GPU placement on one host: defaults, every arrangement that cannot work, the shipped GPU configs."""

from pathlib import Path

import pytest

from asyncrl.config.run import load_run_config
from launch.placement import nccl_env, place, run_placement

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_four_learner_ranks_and_four_generators_on_eight_gpus_by_default():
    p = place(learner_ranks=4, learner_devices=[], generators=4, generator_devices=[], gpus=8)
    assert p.learner == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert p.generators == ["cuda:4", "cuda:5", "cuda:6", "cuda:7"]
    assert p.weight_paths == ["nccl"] * 4


def test_defaults_share_learner_gpus_when_none_is_left_and_cpu_without_gpus():
    p = place(learner_ranks=2, learner_devices=[], generators=3, generator_devices=[], gpus=2)
    assert p.generators == ["cuda:0", "cuda:1", "cuda:0"]
    assert p.weight_paths == ["ipc", "nccl", "ipc"]  # on learner rank 0's GPU: CUDA IPC
    p = place(learner_ranks=2, learner_devices=[], generators=2, generator_devices=[], gpus=0)
    assert p.learner == p.generators == ["cpu", "cpu"] and p.weight_paths == ["gloo", "gloo"]
    p = place(learner_ranks=1, learner_devices=["cpu"], generators=1, generator_devices=["cuda:0"], gpus=1)
    assert p.weight_paths == ["gloo"]


@pytest.mark.parametrize("kw, words", [
    ({"learner_ranks": 3, "gpus": 2}, "learner.ranks=3 needs 3 GPUs"),
    ({"learner_devices": ["cuda:0", "cuda:0"]}, "ranks 0 and 1 both on cuda:0"),
    ({"learner_devices": ["cpu", "cuda:1"]}, "all ranks on CPU or all on GPUs"),
    ({"generator_devices": ["cuda:9"]}, "generator.devices[0]='cuda:9' but this host has 8"),
    ({"generator_devices": ["cuda"]}, "the index is required"),
    ({"generator_devices": ["cuda:1", "cuda:2"]}, "generator.devices has 2 entries but 1 are needed"),
    ({"learner_devices": ["cuda:0"]}, "learner.devices has 1 entries but 2"),
])
def test_arrangements_that_cannot_work_name_the_field(kw, words):
    args = {"learner_ranks": 2, "learner_devices": [], "generators": 1, "generator_devices": [], "gpus": 8, **kw}
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        place(**args)


def test_two_generators_may_share_a_gpu_each_has_its_own_group():
    p = place(learner_ranks=1, learner_devices=[], generators=2, generator_devices=["cuda:1", "cuda:1"], gpus=2)
    assert p.weight_paths == ["nccl", "nccl"]


@pytest.mark.parametrize("name, gpus", [("gpu-1.toml", 1), ("gpu-2.toml", 2), ("gpu-8.toml", 8)])
def test_shipped_gpu_configs_place_on_their_host_and_not_on_a_smaller_one(name, gpus):
    cfg = load_run_config(CONFIGS / name)
    p = run_placement(cfg, gpus=gpus)
    assert len(p.learner) == cfg.learner.ranks and len(p.generators) == cfg.generator.count
    if gpus > 1:
        assert set(p.weight_paths) == {"nccl"}
        with pytest.raises(ValueError, match="this host has"):
            run_placement(cfg, gpus=gpus - 1)


def test_nccl_env_keeps_multicast_off_and_cumem_equal_everywhere():
    env = nccl_env()
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NCCL_CUMEM_ENABLE"] == "0"
