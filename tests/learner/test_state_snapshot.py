"""The checkpoint's snapshot plan (state_snapshot.py): what it reads equals `get_state_dict`'s answer, tensor
for tensor and hyperparameter for hyperparameter, step after step, after a load, with and without FSDP; a
state it cannot trace is refused; a checkpoint taken through it resumes exactly."""

import pytest
import torch
from learner_helpers import make_batch, params_snapshot
from torch.distributed.checkpoint.state_dict import get_state_dict

from asyncrl.learner import checkpoint as ckpt
from asyncrl.learner.checkpoint import latest_checkpoint
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.state_snapshot import StateSnapshot
from asyncrl.learner.trainer import Trainer

CFG = {"lr": 1e-3, "warmup_steps": 2, "lr_schedule": "cosine", "steps": 6, "micro_batch_tokens": 32}
LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_lr": 1e-2}


def reference(trainer):
    msd, osd = get_state_dict(trainer.policy, trainer.optimizer, options=ckpt._options())
    return ckpt._trained_only(msd, ckpt._frozen_names(trainer.policy)), osd


def assert_same(got, want, path=""):
    """Same nesting, keys and order; tensors equal bit for bit and of the same dtype, the rest equal."""
    assert type(got) is type(want) or (isinstance(got, dict) and isinstance(want, dict)), path
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), path
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            assert_same(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}/{i}")
    else:
        assert got == want, path


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"], ids=["plain", "fsdp-one-rank"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_reads_what_get_state_dict_gives_step_after_step(tiny_model, dtype, lora):
    t = Trainer(LearnerConfig(**CFG, **(LORA if lora else {})), str(tiny_model), device="cpu", dtype=dtype)
    t.train_step(make_batch(seed=0, step=1))
    plan = StateSnapshot.trace(t.policy, t.optimizer, *reference(t))
    assert plan is not None
    lrs = set()
    for step in (2, 3, 4):
        t.train_step(make_batch(seed=step, step=step))
        msd, osd = plan.read(t.optimizer)
        want_msd, want_osd = reference(t)
        assert_same(msd, want_msd)
        assert_same(osd, want_osd)
        lrs.add(osd["param_groups"][0]["lr"])
    assert len(lrs) == 3  # the schedule moved, and the plan saw it


def test_a_load_replacing_the_optimizer_state_is_read_afresh(tiny_model, tmp_path):
    t = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    t.train_step(make_batch(seed=0, step=1))
    t.save_checkpoint(tmp_path)
    plan = StateSnapshot.trace(t.policy, t.optimizer, *reference(t))
    t.train_step(make_batch(seed=1, step=2))
    t.load_checkpoint(latest_checkpoint(tmp_path))  # new optimizer-state tensors, step 1's values
    msd, osd = plan.read(t.optimizer)
    assert_same(msd, reference(t)[0])
    assert_same(osd, reference(t)[1])


def test_a_copy_is_not_traced_and_a_changed_shape_is_not_read(tiny_model):
    t = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    t.train_step(make_batch(seed=0, step=1))
    msd, osd = reference(t)
    first = next(iter(msd))
    assert StateSnapshot.trace(t.policy, t.optimizer, {**msd, first: msd[first].clone()}, osd) is None
    plan = StateSnapshot.trace(t.policy, t.optimizer, msd, osd)
    state = t.optimizer.state[plan.model_leaves[first].owner]
    old = state["exp_avg"]
    state["exp_avg"] = torch.zeros(3)
    assert plan.read(t.optimizer) is None and "exp_avg" in plan.miss  # the writer then traces anew
    state["exp_avg"] = old
    assert plan.read(t.optimizer) is not None and plan.miss == ""
    state["max_exp_avg_sq"] = old.clone()  # an entry gains a tensor: the plan would leave it out
    assert plan.read(t.optimizer) is None and "max_exp_avg_sq" in plan.miss
    del state["max_exp_avg_sq"]
    t.optimizer.state[torch.nn.Parameter(torch.zeros(2))] = {"step": torch.tensor(1.0)}  # a parameter gains state
    assert plan.read(t.optimizer) is None and "parameters" in plan.miss


def test_the_writer_traces_once_and_its_checkpoint_resumes_exactly(tiny_model, tmp_path, monkeypatch):
    calls = []
    real = ckpt.get_state_dict
    monkeypatch.setattr(ckpt, "get_state_dict", lambda *a, **k: calls.append(1) or real(*a, **k))
    a = Trainer(LearnerConfig(**CFG, **LORA), str(tiny_model), device="cpu")
    for step in (1, 2, 3):
        a.train_step(make_batch(seed=step, step=step))
        a.save_checkpoint(tmp_path / "run", background=True)
        a.checkpoints.wait()
    assert len(calls) == 1  # traced at the first save, read by the plan after
    state = next(iter(a.optimizer.state.values()))
    state["exp_avg"] = state["exp_avg"].clone()  # a new tensor of the same shape: read as it is now, no retrace
    a.save_checkpoint(tmp_path / "run", background=True)
    a.checkpoints.wait()
    assert len(calls) == 1
    state["extra"] = torch.zeros(1)  # a changed state: traced again
    a.save_checkpoint(tmp_path / "other", background=True)
    a.checkpoints.wait()
    del state["extra"]
    assert len(calls) == 2
    m_a = a.train_step(make_batch(seed=4, step=4))

    b = Trainer(LearnerConfig(**CFG, **LORA), str(tiny_model), device="cpu")
    b.load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert b.step == 3
    m_b = b.train_step(make_batch(seed=4, step=4))
    assert all(m_a[k] == m_b[k] for k in m_a if k != "step_time_s")
    pa, pb = params_snapshot(a), params_snapshot(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
