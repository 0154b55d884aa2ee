"""Checkpoints: save -> load restores identical state and the next step; torn saves are ignored."""

import json

import numpy as np
import torch
from learner_helpers import make_batch, params_snapshot

from asyncrl.learner.checkpoint import latest_checkpoint
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer

CFG = {"algorithm": "dapo", "lr": 1e-3, "warmup_steps": 2, "lr_schedule": "cosine", "steps": 5, "micro_batch_tokens": 32,
           "clip_eps_high": 0.28}


def test_round_trip_resumes_exactly(tiny_model, tmp_path):
    a = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    a.train_step(make_batch(seed=0, step=1))
    path = a.save_checkpoint(tmp_path, extra={"hub": {"committed_step": 1}})
    assert path.name == "step-00000001" and latest_checkpoint(tmp_path) == path
    rng_a = (torch.rand(3), np.random.rand(2))
    m_a = a.train_step(make_batch(seed=1, step=2))

    b = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    extra = b.load_checkpoint(latest_checkpoint(tmp_path))
    assert extra == {"hub": {"committed_step": 1}} and b.step == 1 and b.version == 1
    rng_b = (torch.rand(3), np.random.rand(2))
    assert torch.equal(rng_a[0], rng_b[0]) and np.array_equal(rng_a[1], rng_b[1])
    m_b = b.train_step(make_batch(seed=1, step=2))
    for k in m_a:
        if k != "step_time_s":
            assert m_a[k] == m_b[k], k
    pa, pb = params_snapshot(a), params_snapshot(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_torn_checkpoints_are_ignored(tiny_model, tmp_path):
    t = Trainer(LearnerConfig(**CFG, keep_checkpoints=2), str(tiny_model), device="cpu")
    for step in (3, 5, 7):
        t.step = step
        t.save_checkpoint(tmp_path)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000005", "step-00000007"]  # pruned to 2
    (root / ".tmp-step-00000009").mkdir()  # crash while writing
    (root / ".tmp-step-00000009" / "model.pt").write_bytes(b"partial")
    (root / "step-00000011").mkdir()  # no meta.json: never completed
    assert latest_checkpoint(tmp_path) == root / "step-00000007"
    assert json.loads((root / "step-00000007" / "meta.json").read_text())["step"] == 7
    t.step = 9
    assert t.save_checkpoint(tmp_path) == root / "step-00000009"  # replaces the torn temp folder
    assert not (root / ".tmp-step-00000009").exists()
    assert latest_checkpoint(tmp_path / "nothing-here") is None


def test_background_save_holds_the_snapshot_while_training_goes_on(tiny_model, tmp_path):
    """The learner trains on while the checkpoint is written: the checkpoint holds the state of the moment
    it was taken, and resuming from it repeats the next step exactly."""
    a = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    a.train_step(make_batch(seed=0, step=1))
    a.save_checkpoint(tmp_path, extra={"k": 1}, background=True)
    snap = params_snapshot(a)
    m_a = a.train_step(make_batch(seed=1, step=2))  # mutates the live tensors during / before the write
    assert [s for s, _ in a.checkpoints.wait()] == [1]
    b = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    assert b.load_checkpoint(latest_checkpoint(tmp_path)) == {"k": 1}
    pb = params_snapshot(b)
    assert all(torch.equal(snap[k], pb[k]) for k in snap)
    m_b = b.train_step(make_batch(seed=1, step=2))
    assert {k: v for k, v in m_a.items() if k != "step_time_s"} == {k: v for k, v in m_b.items() if k != "step_time_s"}


def test_failed_background_write_keeps_the_previous_checkpoint(tiny_model, tmp_path, monkeypatch):
    from asyncrl.learner import checkpoint as ckpt

    t = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    t.step = 2
    t.save_checkpoint(tmp_path)
    real_write = ckpt._write

    def failing_write(path, obj):
        if path.name == "optimizer.pt":
            raise OSError("disk full")
        real_write(path, obj)

    monkeypatch.setattr(ckpt, "_write", failing_write)
    t.step = 4
    t.save_checkpoint(tmp_path, background=True)
    try:
        t.checkpoints.wait()
        raise AssertionError("the failed write was not reported")
    except RuntimeError as e:
        assert "disk full" in str(e)
    assert latest_checkpoint(tmp_path).name == "step-00000002"  # the half-written step 4 is not taken


def test_a_checkpoint_due_while_the_last_is_still_writing_is_skipped_not_waited_for(tiny_model, tmp_path, monkeypatch):
    import threading

    from asyncrl.learner import checkpoint as ckpt

    release = threading.Event()
    real_write = ckpt._write

    def slow_write(path, obj):
        if path.name == "model.pt":
            release.wait(30)  # the disk is slow
        real_write(path, obj)

    monkeypatch.setattr(ckpt, "_write", slow_write)
    t = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    t.step = 1
    assert t.save_checkpoint(tmp_path, background=True) is not None
    t.step = 2
    assert t.save_checkpoint(tmp_path, background=True) is None  # returns at once: skipped
    release.set()
    t.step = 3
    assert t.save_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-00000003"  # foreground: waits, writes
    assert [s for s, _ in t.checkpoints.wait()] == [1, 3]
