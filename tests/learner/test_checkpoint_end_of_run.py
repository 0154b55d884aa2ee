"""The end of a run: the last step's checkpoint is written while the export runs, its progress is logged, the
step is committed once it is on disk; stopped early, the checkpoint alone is written and committed."""

import logging
import threading
import time

from learner_helpers import make_batch

from asyncrl import records as R
from asyncrl.learner import checkpoint as ckpt
from asyncrl.learner.checkpoint import latest_checkpoint
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.service import LearnerService
from asyncrl.learner.trainer import Trainer
from asyncrl.observe.timeline import Timeline


class Hub:
    def __init__(self) -> None:
        self.timeout_s, self.reconnect_s, self.sent = 15.0, 1.0, []

    def request(self, record):
        self.sent.append(record)


def service(tiny_model, run_dir, steps: int = 1) -> LearnerService:
    """A LearnerService whose loop trains `steps` batches without hub or generators."""
    svc = object.__new__(LearnerService)
    svc.cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=32, steps=steps, checkpoint_every=100)
    svc.run_dir, svc.rank, svc.hub, svc.timeline = run_dir, 0, Hub(), Timeline(run_dir, "learner-0")
    svc.trainer = Trainer(svc.cfg, str(tiny_model), device="cpu")
    svc.checkpoint_versions, svc.checkpointed_step, svc.committed_step = {}, 0, 0
    svc.final_started, svc.timed_out, svc.t0 = None, False, time.time()
    svc._resume = lambda: None

    def loop():
        for step in range(1, steps + 1):
            svc.trainer.train_step(make_batch(seed=step, step=step))
            if step == svc.cfg.steps:
                svc._checkpoint(final=True)

    svc._loop = loop
    return svc


def test_the_final_checkpoint_is_written_while_the_export_runs(tiny_model, tmp_path, monkeypatch):
    svc = service(tiny_model, tmp_path)
    exporting, seen = threading.Event(), {}
    real_write, real_export = ckpt._write, svc.trainer.export

    def write(path, obj):
        if path.name == "model.pt":
            seen["export_began_first"] = exporting.wait(60)  # without the overlap: never, until the timeout
            seen["committed_meanwhile"] = any(isinstance(r, R.CommitStep) for r in svc.hub.sent)
        real_write(path, obj)

    def export(out_dir):
        exporting.set()
        return real_export(out_dir)

    monkeypatch.setattr(ckpt, "_write", write)
    svc.trainer.export = export
    svc.run()
    assert seen == {"export_began_first": True, "committed_meanwhile": False}
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-00000001"
    assert (tmp_path / "export" / "config.json").is_file()
    assert [(r.step, r.policy_version) for r in svc.hub.sent if isinstance(r, R.CommitStep)] == [(1, 1)]
    assert svc.committed_step == 1 and not svc.trainer.checkpoints.busy


def test_the_final_write_logs_where_it_is(tiny_model, tmp_path, monkeypatch, caplog):
    svc = service(tiny_model, tmp_path)
    monkeypatch.setattr(ckpt, "PROGRESS_EVERY_S", 0.01)
    progress = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("final checkpoint: ") and " GB, " in record.getMessage():
                progress.set()

    real_write = ckpt._write

    def slow_write(path, obj):
        if path.name == "optimizer.pt":
            progress.wait(60)  # the disk is slow until a progress line is out
        real_write(path, obj)

    handler = Seen()
    logging.getLogger(ckpt.__name__).addHandler(handler)
    monkeypatch.setattr(ckpt, "_write", slow_write)
    try:
        with caplog.at_level(logging.INFO, logger=ckpt.__name__):
            svc.run()
    finally:
        logging.getLogger(ckpt.__name__).removeHandler(handler)
    finals = [r.getMessage() for r in caplog.records
              if r.name == ckpt.__name__ and r.getMessage().startswith("final checkpoint: ")]
    assert progress.is_set() and " GB, " in finals[0], finals  # e.g. "final checkpoint: 0.0/0.0 GB, 0 s"
    assert " GB written in " in finals[-1] and all(" GB written in " not in m for m in finals[:-1]), finals


def test_stopped_early_the_checkpoint_alone_is_written_and_committed(tiny_model, tmp_path):
    svc = service(tiny_model, tmp_path, steps=3)
    svc.cfg.steps = 5  # the loop ends after 3 of 5 steps, as when asked to stop
    svc.trainer.export = lambda out_dir: (_ for _ in ()).throw(AssertionError("exported an unfinished run"))
    svc.run()
    assert latest_checkpoint(tmp_path).name == "step-00000003"
    assert [r.step for r in svc.hub.sent if isinstance(r, R.CommitStep)] == [3]
    assert not (tmp_path / "export").exists()
