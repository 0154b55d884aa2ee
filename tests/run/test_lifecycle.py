"""The stop flag: a signal stops a service once; the same stop delivered twice (the parent-death signal and a
process-group kill, ms apart) is not taken for a user's second Ctrl-C, which exits at once."""

from __future__ import annotations

import os
import signal
import time

import pytest

from asyncrl.run.lifecycle import REPEAT_S, StopFlag


@pytest.fixture
def restored_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_repeated_signal_is_one_stop_and_a_later_one_exits(restored_handlers):
    stopped = []
    flag = StopFlag().install()
    flag.on_set(lambda: stopped.append(True))
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)  # the duplicate: ignored, no SystemExit
    assert flag.is_set() and flag.signal == signal.SIGTERM and stopped == [True]
    time.sleep(REPEAT_S + 0.1)
    with pytest.raises(SystemExit) as exit_:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs at the next bytecode
    assert exit_.value.code == 128 + signal.SIGINT
