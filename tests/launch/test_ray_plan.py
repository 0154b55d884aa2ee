"""Which Ray node runs each service: learner ranks packed, generators spread, hub and reward on free CPUs;
a cluster that cannot hold the config is one line naming what is missing."""

import pytest

from asyncrl.config.run import load_run_config
from launch.ray_plan import Node, nodes_of, plan


def where(cfg_sets: list[str], nodes: list[Node]) -> dict[str, tuple[str, str]]:
    seats = plan(load_run_config(None, cfg_sets), nodes)
    return {name: (seat.node.address, seat.device) for name, seat in seats.items()}


def test_default_on_two_cpu_nodes_uses_both():
    nodes = [Node("a", "127.0.0.2", cpus=2, gpus=0), Node("b", "127.0.0.3", cpus=2, gpus=0)]
    assert where([], nodes) == {"replay": ("127.0.0.2", ""), "learner-0": ("127.0.0.2", "cpu"),
                                "generator-0": ("127.0.0.3", "cpu"), "reward-0": ("127.0.0.3", "")}


def test_learner_ranks_pack_on_one_gpu_node_and_generators_fill_the_other():
    nodes = [Node("a", "10.0.0.1", cpus=32, gpus=4), Node("b", "10.0.0.2", cpus=32, gpus=4)]
    seats = where(["learner.ranks=4", "generator.count=4", "reward.workers=2"], nodes)
    assert {seats[f"learner-{r}"] for r in range(4)} == {("10.0.0.1", "cuda:0")}
    assert {seats[f"generator-{i}"] for i in range(4)} == {("10.0.0.2", "cuda:0")}
    assert list(seats)[0] == "replay" and seats["replay"][1] == "" and seats["reward-1"][1] == ""


def test_ranks_spill_to_the_next_node_only_when_the_first_is_full():
    nodes = [Node("a", "10.0.0.1", cpus=8, gpus=2), Node("b", "10.0.0.2", cpus=8, gpus=4)]
    seats = where(["learner.ranks=5", "generator.count=1"], nodes)
    assert [seats[f"learner-{r}"][0] for r in range(5)] == ["10.0.0.2"] * 4 + ["10.0.0.1"]
    assert seats["generator-0"] == ("10.0.0.1", "cuda:0")


def test_cpu_devices_keep_learner_and_generators_off_the_gpus():
    nodes = [Node("a", "10.0.0.1", cpus=4, gpus=8)]
    seats = where(['learner.devices=["cpu"]', 'generator.devices=["cpu"]'], nodes)
    assert seats["learner-0"][1] == "cpu" and seats["generator-0"][1] == "cpu"


def test_host_local_device_lists_are_refused():
    with pytest.raises(ValueError, match=r"learner.devices=\['cuda:1'\]: with launch.placement=\"ray\" leave it empty"):
        where(['learner.devices=["cuda:1"]'], [Node("a", "10.0.0.1", cpus=4, gpus=8)])


def test_too_few_gpus_names_the_key_and_what_is_left():
    nodes = [Node("a", "10.0.0.1", cpus=16, gpus=2)]
    with pytest.raises(ValueError, match=r"no Ray node has a GPU and a CPU left for generator-0 .*10.0.0.1: 14 CPU "
                                         r"0 GPU.*lower generator.count or add nodes"):
        where(["learner.ranks=2"], nodes)


def test_too_few_cpus_for_the_hub():
    with pytest.raises(ValueError, match="no Ray node has a CPU left for the hub"):
        where([], [Node("a", "10.0.0.1", cpus=2, gpus=0)])


def test_nodes_of_keeps_live_nodes_in_address_order():
    raw = [{"NodeID": "b", "NodeManagerAddress": "10.0.0.10", "Alive": True, "Resources": {"CPU": 2.0}},
           {"NodeID": "c", "NodeManagerAddress": "10.0.0.3", "Alive": False, "Resources": {"CPU": 2.0}},
           {"NodeID": "a", "NodeManagerAddress": "10.0.0.9", "Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}}]
    assert nodes_of(raw) == [Node("a", "10.0.0.9", cpus=4, gpus=1), Node("b", "10.0.0.10", cpus=2, gpus=0)]
