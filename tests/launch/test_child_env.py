"""The services' environment: idle OpenMP threads spin briefly, unless the user says otherwise."""

from __future__ import annotations

import time

from launch.processes import ProcessSpec, spawn

SHOW = "import os; print('spin=' + os.environ.get('GOMP_SPINCOUNT', '-'))"


def spin_of(tmp_path, name) -> str:
    child = spawn(ProcessSpec(name=name, module="timeit", args=["-n", "1", "-r", "1", SHOW]), tmp_path)
    deadline = time.monotonic() + 30
    while child.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(l for l in child.log_path.read_text().splitlines() if l.startswith("spin="))
    return line.removeprefix("spin=")


def test_services_spin_briefly_by_default_and_a_users_setting_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert spin_of(tmp_path, "default") == "10000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "123")
    assert spin_of(tmp_path, "user") == "123"
