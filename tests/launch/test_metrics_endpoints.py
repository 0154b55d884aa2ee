"""run.json lists the Prometheus endpoints the launcher chose (each service reads its own there); launch.* switches."""

from __future__ import annotations

import os

import pytest

from asyncrl.config.launch import LaunchConfig
from asyncrl.config.run import load_run_config
from asyncrl.net.endpoints import unix_endpoint
from asyncrl.observe.prometheus import url_port
from asyncrl.run.rundir import read_run_json
from launch.placement import Placement
from launch.supervisor import Supervisor

PLACEMENT = Placement(learner=["cpu"], generators=["cpu"], weight_paths=["gloo"])


def test_a_launcher_inside_another_process_leaves_its_environment_alone(tmp_path):
    """The launcher's own peers get its credentials passed in: a Supervisor built inside a bench or a test must
    not make that process's later clients prove the launcher's role with another run's key (a hub drops such
    frames unanswered: three e2e tests timed out after an in-process bench.pipeline run)."""
    before = dict(os.environ)
    sup = Supervisor(load_run_config(None, []), tmp_path, resume=False, placement=PLACEMENT)
    assert dict(os.environ) == before
    assert sup.credentials.role == "launcher"


def test_run_json_lists_loopback_metrics_endpoints_and_services_get_only_run_dir_and_name(tmp_path):
    sup = Supervisor(load_run_config(None, []), tmp_path, resume=False, placement=PLACEMENT)
    sup._write_run_json()
    endpoints = read_run_json(tmp_path)["metrics_endpoints"]
    assert set(endpoints) == {"hub", "learner"}
    assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in endpoints.values())
    assert url_port(endpoints["hub"]) != url_port(endpoints["learner"])
    for spec in sup.specs():  # the rest (config, endpoints, metrics ports) is in the run directory
        assert spec.args[:4] == ["--run-dir", str(tmp_path), "--name", spec.name], spec
        assert spec.args[4:] in ([], ["--device", "cpu"]), spec


def test_prometheus_off_lists_nothing_and_starts_no_exporter(tmp_path):
    sup = Supervisor(load_run_config(None, ["launch.prometheus=false"]), tmp_path, resume=False, placement=PLACEMENT)
    sup._write_run_json()
    assert read_run_json(tmp_path)["metrics_endpoints"] == {}


def test_wandb_project_without_wandb_names_the_key_and_the_fix(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "wandb" else object())
    with pytest.raises(ValueError, match=r"launch.wandb_project='p'.*pip install wandb.*wandb_project=\"\""):
        LaunchConfig(wandb_project="p")
    assert LaunchConfig(wandb_project="").wandb_project == ""


def test_a_local_run_reaches_its_hub_through_a_unix_socket_in_the_run_directory(tmp_path):
    sup = Supervisor(load_run_config(None, ["hub.shards=2"]), tmp_path, resume=False, placement=PLACEMENT)
    assert sup.endpoints["replay_shards"] == [f"ipc://{tmp_path}/replay-0.sock", f"ipc://{tmp_path}/replay-1.sock"]
    assert sup.endpoints["replay"] == sup.endpoints["replay_shards"][0]


@pytest.mark.parametrize("sets", [["launch.unix_sockets=false"], ["launch.host=10.1.2.3"]])
def test_tcp_when_asked_or_when_the_hub_binds_a_network_address(tmp_path, sets, monkeypatch):
    ports = iter(range(40000, 41000))
    monkeypatch.setattr("launch.host.free_ports", lambda addresses: [next(ports) for _ in addresses])
    sup = Supervisor(load_run_config(None, sets), tmp_path, resume=False, placement=PLACEMENT)
    host = "10.1.2.3" if "launch.host=10.1.2.3" in sets else "127.0.0.1"
    assert sup.endpoints["replay"] == f"tcp://{host}:40000"


def test_a_run_directory_where_no_unix_socket_can_live_uses_tcp(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)  # the launcher makes the run directory first
    sup = Supervisor(load_run_config(None, []), deep, resume=False, placement=PLACEMENT)
    assert sup.endpoints["replay"].startswith("tcp://127.0.0.1:")
    assert unix_endpoint(deep, "replay") is None and unix_endpoint(tmp_path, "replay") == f"ipc://{tmp_path}/replay.sock"
    assert unix_endpoint(tmp_path / "missing", "replay") is None  # no socket can be bound there: TCP
    assert [f.name for f in tmp_path.iterdir()] == [deep.parent.name]  # the probes leave nothing behind


def test_the_probe_leaves_a_live_hub_s_socket_alone(tmp_path):
    """A launcher started on a run directory whose hub still serves must not unlink that hub's socket."""
    import socket

    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(tmp_path / "replay.sock"))
    live.listen()
    try:
        assert unix_endpoint(tmp_path, "replay") == f"ipc://{tmp_path}/replay.sock"
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.connect(str(tmp_path / "replay.sock"))  # still reachable
        peer.close()
    finally:
        live.close()
