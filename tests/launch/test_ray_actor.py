"""The keeper a Ray node runs per service, as a plain object: it starts the process in the launch directory,
reports its exit, signals its process group, and keeps no role key of the node's environment."""

import os
import signal
import time

import pytest

from asyncrl.net.credentials import ENV_KEY, ENV_ROLE
from launch.processes import ProcessSpec
from launch.ray_actor import ServiceActor


def wait_exit(actor: ServiceActor, pid: int, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (code := actor.poll(pid)) is None:
        assert time.monotonic() < deadline, "the process did not exit"
        time.sleep(0.05)
    return code


def test_starts_in_the_launch_directory_and_reports_the_exit(tmp_path):
    actor = ServiceActor()
    (tmp_path / "here.py").write_text("import os; print('cwd', os.getcwd())\n")
    pid = actor.start(ProcessSpec(name="probe", module="here", args=[]), str(tmp_path / "logs"), str(tmp_path))
    assert wait_exit(actor, pid) == 0
    assert f"cwd {tmp_path}" in (tmp_path / "logs" / "probe.log").read_text()
    actor.signal(pid, signal.SIGTERM)  # gone already: nothing happens


def test_signal_reaches_the_running_service(tmp_path):
    actor = ServiceActor()
    spec = ProcessSpec(name="sleeper", module="timeit", args=["-n", "1", "-r", "1", "import time; time.sleep(60)"])
    pid = actor.start(spec, str(tmp_path / "logs"), str(tmp_path))
    assert actor.poll(pid) is None
    actor.signal(pid, signal.SIGTERM)
    assert wait_exit(actor, pid) == -signal.SIGTERM


def test_sigint_reaches_a_service_started_where_sigint_is_blocked(tmp_path):
    """A Ray worker blocks SIGINT and a blocked mask survives exec: Ctrl-C would never reach the learner."""
    actor = ServiceActor()
    spec = ProcessSpec(name="sleeper", module="timeit", args=["-n", "1", "-r", "1", "import time; time.sleep(60)"])
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = actor.start(spec, str(tmp_path / "logs"), str(tmp_path))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    time.sleep(0.5)  # past interpreter start-up, where SIGINT is its own
    actor.signal(pid, signal.SIGINT)
    assert wait_exit(actor, pid) in (-signal.SIGINT, 1)  # KeyboardInterrupt


def test_sigint_reaches_a_service_started_where_sigint_is_ignored(tmp_path):
    """An ignored SIGINT (a launcher run as a script's background job) survives exec too."""
    actor = ServiceActor()
    spec = ProcessSpec(name="sleeper", module="timeit", args=["-n", "1", "-r", "1", "import time; time.sleep(60)"])
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pid = actor.start(spec, str(tmp_path / "logs"), str(tmp_path))
    finally:
        signal.signal(signal.SIGINT, previous)
    time.sleep(0.5)  # past interpreter start-up
    actor.signal(pid, signal.SIGINT)
    assert wait_exit(actor, pid) in (-signal.SIGINT, 1)  # KeyboardInterrupt


def test_a_launch_directory_missing_on_the_node_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist on this node"):
        ServiceActor().start(ProcessSpec(name="x", module="this", args=[]), str(tmp_path), str(tmp_path / "nope"))


def test_role_keys_of_the_node_environment_are_dropped(monkeypatch):
    monkeypatch.setenv(ENV_ROLE, "learner")
    monkeypatch.setenv(ENV_KEY, "0" * 64)
    ServiceActor()
    assert ENV_ROLE not in os.environ and ENV_KEY not in os.environ


def test_free_ports_are_distinct():
    ports = ServiceActor().free_ports(["127.0.0.1"] * 3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)
