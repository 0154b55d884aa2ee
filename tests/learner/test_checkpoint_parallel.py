"""Checkpoints written by several file threads (model.pt on one, the optimizer split over the others): the files
rebuild the state exactly, a resume from them repeats the next step bit for bit, a failure or a kill in any one
file leaves the previous checkpoint the latest, and a checkpoint of the single-file layout still loads."""

import json
import subprocess
import sys
import textwrap

import torch
from learner_helpers import make_batch, params_snapshot
from torch.distributed.checkpoint.state_dict import get_state_dict

from asyncrl.learner import checkpoint as ckpt
from asyncrl.learner.checkpoint import CheckpointWriter, latest_checkpoint
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer

CFG = {"algorithm": "dapo", "lr": 1e-3, "warmup_steps": 2, "lr_schedule": "cosine", "steps": 5, "micro_batch_tokens": 32}


def trained(tiny_model, writers: int = 4) -> Trainer:
    t = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    t.checkpoints = CheckpointWriter(writers=writers)
    t.train_step(make_batch(seed=0, step=1))
    return t


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):  # (a resumed optimizer's betas are a list: load_state_dict's, either layout)
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_split_files_rebuild_the_state_dicts_in_order(tiny_model, tmp_path):
    t = trained(tiny_model)
    path = t.save_checkpoint(tmp_path)
    files = json.loads((path / "meta.json").read_text())["files"]
    assert files["model"] == ["model.pt"]  # whole, as other readers expect (docs/lora.md)
    assert files["optimizer"] == ["optimizer.pt", "optimizer-1.pt", "optimizer-2.pt"]
    assert sorted(p.name for p in path.iterdir()) == sorted(
        files["model"] + files["optimizer"] + ["scheduler.pt", "rng-rank0.pt", "meta.json"])
    msd, osd = get_state_dict(t.policy, t.optimizer, options=ckpt._options())
    read_msd, read_osd = ckpt._read_state(path, files)
    assert same(msd, read_msd) and same(osd, read_osd)


def test_resume_from_split_files_repeats_the_next_step_exactly(tiny_model, tmp_path):
    a = trained(tiny_model)
    a.save_checkpoint(tmp_path, extra={"k": 1}, background=True)
    assert [s for s, _ in a.checkpoints.wait()] == [1]
    m_a = a.train_step(make_batch(seed=1, step=2))
    b = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    assert b.load_checkpoint(latest_checkpoint(tmp_path)) == {"k": 1} and b.step == 1
    m_b = b.train_step(make_batch(seed=1, step=2))
    assert {k: v for k, v in m_a.items() if k != "step_time_s"} == {k: v for k, v in m_b.items() if k != "step_time_s"}
    pa, pb = params_snapshot(a), params_snapshot(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    sa = get_state_dict(a.policy, a.optimizer, options=ckpt._options())[1]
    sb = get_state_dict(b.policy, b.optimizer, options=ckpt._options())[1]
    assert same(sa, sb)


def test_a_checkpoint_in_one_file_each_still_loads(tiny_model, tmp_path):
    a = trained(tiny_model, writers=1)
    path = a.save_checkpoint(tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    assert meta.pop("files") == {"model": ["model.pt"], "optimizer": ["optimizer.pt"]}
    (path / "meta.json").write_text(json.dumps(meta))  # as written before the split
    snap = params_snapshot(a)
    b = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    b.load_checkpoint(path)
    pb = params_snapshot(b)
    assert all(torch.equal(snap[k], pb[k]) for k in snap)


def test_a_failure_in_any_one_file_keeps_the_previous_checkpoint(tiny_model, tmp_path, monkeypatch):
    t = trained(tiny_model)
    t.save_checkpoint(tmp_path)
    real_write = ckpt._write

    def failing_write(path, obj):
        if path.name == "optimizer-2.pt":
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
    assert latest_checkpoint(tmp_path).name == "step-00000001"
    assert not (tmp_path / "checkpoints" / ".tmp-step-00000004" / "meta.json").exists()


KILLED_MID_WRITE = """
import os, signal, sys
sys.path.insert(0, {helpers!r})
from learner_helpers import make_batch
from asyncrl.learner import checkpoint as ckpt
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer

t = Trainer(LearnerConfig(lr=1e-3, micro_batch_tokens=32), {model!r}, device="cpu")
t.train_step(make_batch(seed=0, step=1))
t.save_checkpoint({run!r})
real_write = ckpt._write

def dying_write(path, obj):
    if path.name == "optimizer-1.pt":  # the other threads are writing theirs
        with open(path, "wb") as f:
            f.write(b"half a file")
        os.kill(os.getpid(), signal.SIGKILL)
    real_write(path, obj)

ckpt._write = dying_write
t.train_step(make_batch(seed=1, step=2))
t.save_checkpoint({run!r})
"""


def test_a_kill_mid_write_leaves_the_previous_checkpoint_the_latest(tiny_model, tmp_path):
    from pathlib import Path

    helpers = str(Path(__file__).parent)
    script = KILLED_MID_WRITE.format(helpers=helpers, model=str(tiny_model), run=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    root = tmp_path / "checkpoints"
    assert (root / ".tmp-step-00000002").is_dir() and latest_checkpoint(tmp_path) == root / "step-00000001"
    b = Trainer(LearnerConfig(lr=1e-3, micro_batch_tokens=32), str(tiny_model), device="cpu")
    b.load_checkpoint(latest_checkpoint(tmp_path))
    assert b.step == 1
