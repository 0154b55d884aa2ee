"""The learner process loop (every rank runs it; rank 0 also talks to generators).

    hub ──Batch(step)──▶ every rank ── train_step ──▶ push weights (rank 0 sends, others gather)
     ▲                                                     │
     └── WeightVersion(v) · CommitStep(step) after a checkpoint · metrics.jsonl (rank 0)

* Each rank asks the hub for the same step; the hub hands every asker the same batch until the
  step is committed, so all ranks train on one batch without a broadcast between them.
* While waiting for a batch, the ranks stay in lockstep (one collective per wait round) so that
  rank 0 can serve a (re)joining generator a full push: that needs every rank's full_tensor().
* Checkpoints are atomic; `CommitStep(step)` follows the checkpoint, so after a crash the hub
  re-delivers every batch after the last checkpoint: nothing is dropped or trained twice. Every checkpoint,
  the last too, is written in the background; the last one beside the export, and waited for before exit.
* SIGINT/SIGTERM: finish the current step, checkpoint, commit, exit 0.
* With LoRA and `learner.lora_push = "adapter"` (the torch engine's default) each version's push carries the
  adapters only (lora.adapter_push: A and B, fp32, MBs), which members apply to the base they keep; a
  (re)joining generator gets the base and the adapters (lora.base_push) from serve_joins. "merged" (SGLang):
  every push is the whole merged model (Trainer.named_full_tensors).
* Held-out evaluation (eval.every > 0, rank 0): asked for after the weights of step 0, every N-th and the last
  step are pushed; it runs on its own thread through the generators (asyncrl.evaluation.live) and its records join
  the next metrics line; only the last one is waited for (at most eval.timeout_s).
* Every rank heartbeats the hub (asyncrl.net.heartbeat) while it waits for a batch; a crash is reported as a
  FatalError (services/learner.py), which turns on the hub's shutdown flag for the other services.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from asyncrl import records as R
from asyncrl.evaluation.config import EvalConfig
from asyncrl.evaluation.live import build_evaluator
from asyncrl.generator.config import GeneratorConfig
from asyncrl.models.config import ModelConfig, resolve_model_path
from asyncrl.net.credentials import RunSecret
from asyncrl.net.heartbeat import Heartbeats
from asyncrl.learner import fsdp, lora
from asyncrl.learner.checkpoint import latest_checkpoint
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.rescorer import build_rescorer
from asyncrl.learner.trainer import Trainer
from asyncrl.observe.metrics import MetricsWriter
from asyncrl.net.nccl_env import set_nccl_defaults
from asyncrl.net.tcp_store import bound_store, client_store
from asyncrl.net.hub_shards import hub_endpoints
from asyncrl.net.peer import HubError
from asyncrl.net.sharded_peer import hub_peer
from asyncrl.rollout.metrics import episode_metrics
from asyncrl.task.config import TaskConfig
from asyncrl.observe.timeline import Timeline
from asyncrl.weights.base_image import open_image
from asyncrl.weights.bucket import drain
from asyncrl.weights.sender import WeightSender

log = logging.getLogger(__name__)


def init_distributed(device: str, timeout_s: float = 300.0) -> None:
    """Join the learner's own process group (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher,
    like torchrun). Rank 0 hosts the rendezvous store on MASTER_ADDR only (env:// would listen on every
    interface)."""
    set_nccl_defaults()
    if dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = (bound_store(address, port, world, timeout_s) if rank == 0
             else client_store(address, port, world, timeout_s))
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)


def push_dtype(push_mode: str, lora_apply: str, compute: torch.dtype) -> torch.dtype | None:
    """What floating-point tensors travel as in each weight push (None: as the learner holds them).

    Full and merged pushes: the compute dtype the generators use them in (fp32 masters would double the bytes).
    Adapter pushes merged by the engine (generator.lora_apply = "merge"): as held, the base already in the compute
    dtype and A / B in fp32, so that the engine's merge equals the learner's bit for bit. Kept unmerged
    ("unmerged"): the compute dtype, since the engine casts A / B to it before use as the learner's forward does
    (adapter_slots.py): the same numbers in half the bytes."""
    if push_mode == "adapter" and lora_apply != "unmerged":
        return None
    return compute


class LearnerService:
    def __init__(self, cfg: LearnerConfig, model: ModelConfig, run_dir: str | Path, name: str, device: str,
                 endpoints: dict[str, str], stopping: Callable[[], bool], *, generator: GeneratorConfig,
                 evaluation: EvalConfig, task: TaskConfig, push_mode: str, max_uncommitted_steps: int, seed: int,
                 host: str, wandb_project: str = "", wandb_config: dict[str, Any] | None = None,
                 metrics_port: int | None = None) -> None:
        """The learner's own config and the model's; of the other sections only what it reads, handed in by
        services/learner.py: the generators' (the rescorer's engine, the push's pause mode, the rollout the
        evaluation decodes), the evaluation and its task, `push_mode` (RunConfig.resolved_lora_push: "full",
        "adapter" or "merged"), the hub's commit window, the seed, the address rank 0's weight store binds,
        W&B's project and the config it logs. `stopping()`: the service was asked to stop. `metrics_port`:
        rank 0 serves Prometheus gauges there (run.json's metrics_endpoints; None: off)."""
        self.cfg, self.run_dir, self.name, self.stopping = cfg, Path(run_dir), name, stopping
        self.evaluation, self.max_uncommitted_steps = evaluation, max_uncommitted_steps
        model_path = resolve_model_path(model)
        self.trainer = Trainer(cfg, model_path, dtype=model.dtype, device=device, seed=seed,
                               rescorer=build_rescorer(cfg, model, generator, model_path, device),
                               residual_fp32=model.residual_fp32, logits_fp32=model.logits_fp32,
                               base_image=open_image(run_dir, device) if generator.share_base else None)
        self.rank = self.trainer.dist.rank
        self.hub = hub_peer(hub_endpoints(endpoints), name, timeout_s=15.0)
        self.hub.give_up = stopping  # stopping: do not wait for a hub that may be gone for good
        self.beats = Heartbeats("learner", name)
        self.push_mode = push_mode  # "full" (no LoRA), "adapter" or "merged"
        self.sender = WeightSender(endpoints["weights"], device=device,
                                   bucket_bytes=cfg.weight_bucket_mb << 20,
                                   pause_mode=generator.inflight_update,
                                   master_address=host,
                                   secret=RunSecret.load(self.run_dir),
                                   dtype=push_dtype(push_mode, generator.lora_apply, self.trainer.dtype),
                                   ) if self.rank == 0 else None
        if self.sender is not None:
            self.sender.give_up = stopping  # nor for generators that died with the launcher
        self.metrics = MetricsWriter(self.run_dir, metrics_port, wandb_project,
                                     wandb_config=wandb_config) if self.rank == 0 else None
        self.timeline = Timeline(self.run_dir, name)
        self.evaluator = (build_evaluator(evaluation, task, generator.rollout.multi_turn, self.run_dir, model_path)
                          if self.rank == 0 else None)
        self.eval_pending: list[dict[str, Any]] = []  # finished evaluations not yet in a metrics line
        self.tokens_trained = 0
        self.checkpointed_step = 0
        self.checkpoint_versions: dict[int, int] = {}  # step -> policy version, until its write is committed
        self.committed_step = 0  # last step whose checkpoint is written (and sent to the hub)
        self.reserved = False  # checkpoint staging buffers allocated (after the first step)
        self.final_started: float | None = None  # when the final checkpoint's snapshot began
        self.t0 = time.time()
        self.timed_out = False  # learner.time_limit_s spent: the step just trained was the last

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """The loop, then the end: the last step's checkpoint is written in the background while the export
        runs (both only read the snapshot / the weights); the run returns once both are done and the step is
        committed. Stopped early or failed: no export, the checkpoint alone."""
        self._resume()
        try:
            self._loop()
            if self.finished:
                with self.timeline.span("export"):
                    self.trainer.export(self.run_dir / "export")
        finally:  # stopped, finished, or the hub failed us: keep every finished step
            self._final_checkpoint()

    @property
    def finished(self) -> bool:
        return self.trainer.step >= self.cfg.steps or self.timed_out

    def _loop(self) -> None:
        steps = self.cfg.steps
        while not self.finished:
            step = self.trainer.step + 1
            self._keep_commit_window(step)
            batch = self._wait_batch(step)
            if batch is None:  # asked to stop while waiting
                break
            if self.stopping():
                log.info("stop requested: finishing step %d, then checkpointing", step)
            metrics = self._train(batch)
            if not self.reserved:
                with self.timeline.span("checkpoint_setup"):
                    self.trainer.reserve_checkpoint_buffers()
                self.reserved = True
            push = self._push()
            last = step >= steps or self._out_of_time()
            if last or step % self.cfg.checkpoint_every == 0:
                self._checkpoint(final=last)
            self._commit_written()
            self._evaluate(step, last)
            self._report(step, batch, metrics, push)

    def _final_checkpoint(self) -> None:
        """Every finished step on disk and committed before the process ends (the write in flight is waited
        for: the writer thread would die with the process). Timeline: "checkpoint_final" spans the final
        checkpoint from its snapshot to its commit (with the export beside it at the end of a finished run)."""
        self.hub.timeout_s = min(self.hub.timeout_s, 5.0)  # the hub may be stopping or gone
        self.hub.reconnect_s = 0.0
        if self.trainer.step > self.checkpointed_step:
            self._checkpoint(final=True)
        self._commit_written(wait=True)
        if self.final_started is not None:
            self.timeline.record("checkpoint_final", self.final_started, time.time())
            self.final_started = None

    def close(self) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
        self.timeline.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.sender is not None:
            self.sender.close()
        self.hub.close()

    # ------------------------------------------------------------------ phases

    def _resume(self) -> None:
        path = latest_checkpoint(self.run_dir)
        if path is not None:
            self.trainer.load_checkpoint(path)
            self.checkpointed_step = self.committed_step = self.trainer.step
            log.info("resumed from %s at step %d (policy version %d)", path, self.trainer.step, self.trainer.version)
        if self.rank == 0:
            self.hub.request(R.WeightVersion(version=self.trainer.version))
            if self.trainer.step > 0:  # a checkpoint whose commit the hub never got (it was down): commit now
                self._commit(self.trainer.step)
            elif self.evaluator is not None:  # the starting weights: the baseline of every curve
                self.evaluator.request(0)

    def _wait_batch(self, step: int) -> R.Batch | None:
        batch: R.Batch | None = None
        while True:
            if self._any(self.stopping()):
                return None
            self._heartbeat()
            self._serve_joins()
            if batch is None:
                reply = self.hub.request(R.BatchRequest(learner=self.name, step=step, wait_s=0.5))
                batch = reply if isinstance(reply, R.Batch) else None
            if self._every(batch is not None):
                return batch

    def _heartbeat(self) -> None:
        """Liveness and progress for the hub's peer table. A hub shutting down does not stop the learner:
        its steps end as the launcher decides (SIGINT/SIGTERM), after a checkpoint."""
        if self.beats.due():
            self.beats.send(self.hub, {"step": float(self.trainer.step), "policy_version": float(self.trainer.version),
                                       "tokens_trained": float(self.tokens_trained),
                                       "committed_step": float(self.committed_step)})

    def _train(self, batch: R.Batch) -> dict[str, float]:
        with self.timeline.span("train"):
            return self.trainer.train_step(batch)

    def _push(self) -> dict[str, Any]:
        adapters = self.push_mode == "adapter"
        with self.timeline.span("push"):
            named = lora.adapter_push(self.trainer.masters) if adapters else self.trainer.named_full_tensors()
            if self.sender is None:
                drain(named)
                return {}
            report = self.sender.push(named, self.trainer.version, admit=not adapters, gather_first=adapters).as_dict()
            self.hub.request(R.WeightVersion(version=self.trainer.version))
            return {"kind": self.push_mode, **report}

    def _full_push(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The stream a (re)joining generator gets: the whole model (with adapter pushes, the base + adapters)."""
        if self.push_mode == "adapter":
            return lora.base_push(self.trainer.masters, self.trainer.shared)  # a joiner maps the shared matrices
        return self.trainer.named_full_tensors()

    def _serve_joins(self) -> None:
        if not self._any(self.sender is not None and self.sender.has_joins()):
            return
        if self.sender is None:
            drain(self._full_push())
        else:
            self.sender.serve_joins(self._full_push, self.trainer.version)

    def _checkpoint(self, final: bool = False) -> None:
        """Snapshot now; the write finishes in the background, and the step is committed once it is on disk.
        The `final` one (the run's last step) is never skipped: the write in flight finishes first; its write
        logs its progress, and `_final_checkpoint` waits for it. Timeline: "checkpoint" is a background save's
        stall of the learner, "checkpoint_skipped" a save skipped because the previous write was still going."""
        step = self.trainer.step
        start = time.time()
        if final:
            self.trainer.checkpoints.wait_writer()  # rank 0's; the others have none, and wait in the save's reduce
            self.trainer.checkpoints.announce_next("final checkpoint")
            self.final_started = start
        taken = self.trainer.save_checkpoint(self.run_dir, extra={"hub_committed_step": step}, background=True)
        if not final:
            self.timeline.record("checkpoint_skipped" if taken is None else "checkpoint", start, time.time())
        if taken is None:
            log.warning("checkpoint at step %d skipped: the previous one is still being written (raise "
                        "learner.checkpoint_every or use faster storage)", step)
            return
        self.checkpoint_versions[step] = self.trainer.version
        self.checkpointed_step = step

    def _commit_written(self, wait: bool = False) -> None:
        """Commit every checkpoint the background writer has finished (all of them, with `wait`)."""
        done = self.trainer.checkpoints.wait() if wait else self.trainer.checkpoints.finished()
        for step, _ in done:
            version = self.checkpoint_versions.pop(step, self.trainer.version)
            self.committed_step = max(self.committed_step, step)
            if self.rank == 0:
                self._commit(step, version)

    def _keep_commit_window(self, step: int) -> None:
        """The hub hands out at most hub.max_uncommitted_steps batches past the last commit: before asking
        for one more, let the checkpoint in flight finish (the only place the learner waits for the disk).
        Rank 0 owns the writer and the commits; one small collective makes every rank decide alike."""
        full = step - 1 - self.committed_step >= self.max_uncommitted_steps - 1
        if self._any(self.rank == 0 and full and self.trainer.checkpoints.busy):
            log.info("step %d: waiting for the checkpoint write (hub commit window)", step)
            with self.timeline.span("checkpoint_wait"):
                self._commit_written(wait=True)

    def _commit(self, step: int, version: int | None = None) -> None:
        """Tell the hub `step` is trained and checkpointed. Failing that, the checkpoint still stands: the
        resumed learner commits it again first thing."""
        try:
            self.hub.request(R.CommitStep(step=step, policy_version=self.trainer.version if version is None else version))
        except (HubError, TimeoutError) as e:
            log.warning("step %d checkpointed but not committed at the hub (%s); committed on resume", step, e)

    def _out_of_time(self) -> bool:
        """learner.time_limit_s spent (decided on every rank alike: the ranks' clocks may straddle the limit)."""
        limit = self.cfg.time_limit_s
        if limit <= 0:
            return False
        over = time.time() - self.t0 >= limit
        self.timed_out = self._any(over) if self.trainer.dist.world_size > 1 else over
        if self.timed_out:
            log.info("learner.time_limit_s=%g spent at step %d: this step is the last", limit, self.trainer.step)
        return self.timed_out

    def _evaluate(self, step: int, last: bool) -> None:
        """Ask for an evaluation of the weights just pushed (every eval.every steps and the last); the last one
        is waited for, so the run's final line and summary hold it."""
        if self.evaluator is None:
            return
        if last or step % self.evaluation.every == 0:
            self.evaluator.request(step)
        if last:
            with self.timeline.span("eval_final"):
                self.eval_pending += self.evaluator.wait(self.evaluation.timeout_s)
        else:
            self.eval_pending += self.evaluator.results()

    def _report(self, step: int, batch: R.Batch, metrics: dict[str, float], push: dict[str, Any]) -> None:
        if self.metrics is None:
            return
        evals, self.eval_pending = self.eval_pending, []
        for record in evals:
            self.metrics.write_eval(record)
        samples = [s for g in batch.groups for s in g.samples if s.status == R.ScoreStatus.OK]
        lags = Counter(int(self.trainer.version - 1 - int(s.sample.versions.min()))
                       for s in samples if len(s.sample.versions))
        generated = sum(len(s.sample.response_token_ids) for s in samples)
        self.tokens_trained += generated
        hub = self._hub_stats()
        elapsed = time.time() - self.t0
        self.metrics.write(step, {
            **metrics, "policy_version": self.trainer.version,
            "reward_mean": float(np.mean([s.reward for s in samples])) if samples else float("nan"),
            "samples_trained": len(samples), "tokens_generated": self.tokens_trained,
            "tokens_per_s": self.tokens_trained / max(elapsed, 1e-9),
            "staleness_hist": {str(k): v for k, v in sorted(lags.items())},
            "dropped_stale_in_batch": batch.dropped_stale, "time_s": elapsed, "wall_time": self.t0 + elapsed,
            "push": push,
            "hub": {k: hub.get(k) for k in ("accounting", "states", "queued_prompts", "policy_version")},
            "eval_prompts_in_batch": sum(1 for g in batch.groups if g.prompt.metadata.get("eval")),  # must stay 0
            **episode_metrics(batch.groups),
            **({"eval": evals[-1]} if evals else {}),
        })

    # ------------------------------------------------------------------ helpers

    def _hub_stats(self) -> dict[str, Any]:
        try:
            return self.hub.request(R.StatsRequest()).counters
        except Exception as e:  # noqa: BLE001 - metrics must not stop training
            log.warning("hub stats unavailable: %s", e)
            return {}

    def _any(self, flag: bool) -> bool:
        """True on every rank when the flag is set on some rank (one small collective)."""
        return fsdp.all_reduce(torch.tensor(float(flag), device=self.trainer.dist.device), "max").item() > 0

    def _every(self, flag: bool) -> bool:
        total = fsdp.all_reduce(torch.tensor(float(flag), device=self.trainer.dist.device), "sum").item()
        return total >= self.trainer.dist.world_size
