"""A hub started on a damaged journal exits with status 2 and one line saying file, offset and what to do."""

from __future__ import annotations

import subprocess
import sys

from replay_fakes import prompt

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.journal import Journal
from services.replay import EXIT_LOG_CORRUPT
from tests.doubles.run_dir import launched_run_dir


def test_log_corrupt_at_hub_start_is_one_line_and_exit_status_2(tmp_path):
    path = tmp_path / "replay.log"
    j = Journal.open(path)
    for i in range(10):
        msg = R.SubmitPrompts(prompts=[prompt(f"q{i}")])
        j.submit(wire.encode(msg), msg)
    j.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    launched_run_dir(tmp_path, endpoints={"replay": "tcp://127.0.0.1:0"})
    out = subprocess.run([sys.executable, "-m", "services.replay", "--run-dir", str(tmp_path), "--name", "replay"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_LOG_CORRUPT == 2, out.stderr
    assert "Traceback" not in out.stderr and not out.stdout  # never bound, never announced an endpoint
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("replay: cannot resume:") and str(path) in line and "record at byte" in line
    assert "move it aside" in line
    assert path.read_bytes() == bytes(data)
