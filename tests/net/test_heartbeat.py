"""asyncrl.net.heartbeat: the clock, the answer read from the hub's reply, best-effort fatal reports."""

import pytest

from asyncrl import records as R
from asyncrl.net.heartbeat import Heartbeats, fatal_to_hub, report_fatal


class RecordingHub:
    timeout_s = 30.0

    def __init__(self, reply=None, fail: bool = False) -> None:
        self.sent, self.reply, self.fail = [], reply, fail

    def request(self, msg):
        self.sent.append(msg)
        if self.fail:
            raise TimeoutError("hub gone")
        return self.reply


def test_due_then_not_until_the_interval_passes(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("asyncrl.net.heartbeat.time.monotonic", lambda: now[0])
    hb = Heartbeats("learner", "learner-0", every_s=2.0)
    assert hb.due()
    msg = hb.message({"step": 3.0})
    assert isinstance(msg, R.Heartbeat) and (msg.service, msg.name, msg.stats) == ("learner", "learner-0", {"step": 3.0})
    now[0] += 1.9
    assert not hb.due()
    now[0] += 0.1
    assert hb.due()


def test_answer_reads_shutdown_and_version_and_tolerates_other_replies():
    hub = RecordingHub(R.Ack(info={"shutdown": True, "policy_version": 7}))
    answer = Heartbeats("generator", "g0").send(hub, {})
    assert answer.shutdown and answer.policy_version == 7 and isinstance(hub.sent[0], R.Heartbeat)
    empty = Heartbeats.answer(R.Ack())
    assert not empty.shutdown and empty.policy_version is None
    assert Heartbeats.answer(None) == empty


def test_fatal_report_is_best_effort_and_reraises():
    hub = RecordingHub(fail=True)
    report_fatal(hub, "reward", "r0", ValueError("bad"))  # the hub is gone: logged, not raised
    assert hub.timeout_s <= 5.0 and hub.sent[0].reason == "ValueError: bad"
    ok = RecordingHub(R.Ack())
    with pytest.raises(RuntimeError, match="boom"):
        with fatal_to_hub(ok, "learner", "learner-0"):
            raise RuntimeError("boom")
    assert isinstance(ok.sent[0], R.FatalError) and ok.sent[0].service == "learner"
