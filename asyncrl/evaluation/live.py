"""`LiveEvaluator`: held-out evaluation during training, through the run's own generators at the current weights.

    learner rank 0 ──request(step)──► eval thread ──SubmitPrompts(evaluate)──► hub ──lease──► generators
          ▲                              │  ▲                                    │
          └──── results() ◄── eval.jsonl ┘  └──────── Completion (pushed) ◄──────┘ (scored by reward workers)

The learner asks for an evaluation after pushing the weights of a step; the eval thread submits the round's
prompts (`asyncrl.evaluation.rounds`) as evaluation prompts: the hub leases them before any training prompt and
outside admission, and forgets them once scored, so they never enter a batch or the run's accounting
(`asyncrl.replay.state`). The thread scores each response strictly itself and appends the round's record to
RUN_DIR/eval.jsonl (a multi-turn round adds `turns_mean` and `tool_calls_mean` per greedy episode, `@k` per
sampled one: `rounds.episode_figures`; each greedy answer, with its question and score, goes to
RUN_DIR/eval_responses.jsonl); the learner drains `results()` into its next metrics line, so training never waits
for an evaluation, except the final one (`wait`), bounded by eval.timeout_s.

Backpressure: one round at a time; requests that arrive while one runs wait, and of those only the newest
is kept (a skipped round is logged): evaluation can lag training but never piles up. Versions: a generator
may still hold the previous weights when it leases a round's prompts; each record says which policy
versions its samples were made by.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl.evaluation.config import EvalConfig
from asyncrl.evaluation.rounds import Response, episode_figures, round_prompts, summarize
from asyncrl.records import Prompt, Sample, SamplingParams, ScoredSample
from asyncrl.task.config import TaskConfig

log = logging.getLogger(__name__)
SUBMIT_CHUNK = 64  # prompts per SubmitPrompts frame


class LiveEvaluator:
    def __init__(self, cfg: EvalConfig, heldout: list[Prompt], sampling: SamplingParams, run_dir: str | Path,
                 client_factory: Any = None, score: Any = None, decode: Callable[[np.ndarray], str] | None = None
                 ) -> None:
        """`client_factory()` makes the hub client in the eval thread (default: `asyncrl.Client(run_dir=...)`);
        `score` is the strict check (default `asyncrl.reward.strict.strict_score`); `decode` (token ids -> text)
        lets a multi-turn episode be scored on its last model turn only (`final_turn`)."""
        self.score, self.decode = score, decode
        self.cfg, self.heldout, self.sampling, self.run_dir = cfg, heldout, sampling, Path(run_dir)
        self.client_factory = client_factory or self._default_client
        self._pending: int | None = None  # the newest requested step not yet started
        self._busy = False
        self._cond = threading.Condition()
        self._results: queue.Queue[dict[str, Any]] = queue.Queue()
        self._closed = False
        self.t0 = time.time()
        self._thread = threading.Thread(target=self._run, name="asyncrl-eval", daemon=True)
        self._thread.start()

    def request(self, step: int) -> None:
        """Evaluate the weights of `step` (0: before training) as soon as the previous round is done."""
        with self._cond:
            if self._pending is not None:
                log.info("eval of step %d skipped: step %d asks while a round is still running", self._pending, step)
            self._pending = step
            self._cond.notify_all()

    def results(self) -> list[dict[str, Any]]:
        """Records of the rounds finished since the last call (never blocks)."""
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def wait(self, timeout_s: float) -> list[dict[str, Any]]:
        """Wait until no round is pending or running (at most `timeout_s`), then `results()`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._pending is not None or self._busy) and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("final evaluation not done after %.0f s; the run ends without it", timeout_s)
                    break
                self._cond.wait(min(left, 1.0))
        return self.results()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    # ------------------------------------------------------------------ eval thread

    def _default_client(self) -> Any:
        from asyncrl.client import Client
        from asyncrl.net.credentials import Credentials, RunSecret, SECRET_FILE

        # the learner's own credentials (environment) are the learner's role: submitting is a client's
        creds = Credentials.for_role(RunSecret.load(self.run_dir), "client") if (self.run_dir / SECRET_FILE).exists() else None
        return Client(run_dir=self.run_dir, name="eval", credentials=creds)

    def _run(self) -> None:
        client = None
        try:
            while True:
                with self._cond:
                    while self._pending is None and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    step, self._pending, self._busy = self._pending, None, True
                try:
                    client = client or self.client_factory()
                    self._publish(self._round(client, step))
                except Exception:  # noqa: BLE001 - an evaluation failure must not stop training
                    log.exception("evaluation of step %d failed", step)
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        finally:
            if client is not None:
                client.close()

    def _round(self, client: Any, step: int) -> dict[str, Any]:
        start = time.time()
        prompts = round_prompts(self.heldout, self.cfg, self.sampling, tag=f"eval-{step}-{int(start * 1000) % 10**8}")
        handles = []
        for i in range(0, len(prompts), SUBMIT_CHUNK):
            handles += client.submit(prompts[i:i + SUBMIT_CHUNK], evaluate=True)
        deadline = time.monotonic() + self.cfg.timeout_s
        got: list[ScoredSample] = []
        for h in handles:
            try:
                got += h.result(timeout_s=max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                got += h.scored
        for h in handles:  # late samples of this round are counted as rejected by the client, not kept
            client.handles.pop(h.prompt_id, None)
        rows: list[dict[str, Any]] = []
        record = summarize(step, prompts, [response(s.sample, self.decode) for s in got], self.cfg, self.score,
                           greedy_rows=rows)
        if self.decode is not None:  # multi-turn: how often the held-out episodes called a tool, how long they ran
            record.update(episode_figures([s.sample for s in got]))
        now = time.time()
        record.update(time_s=now - self.t0, duration_s=now - start, wall_time=now)
        with open(self.run_dir / "eval_responses.jsonl", "a") as f:  # what the model answered, for reading
            f.writelines(json.dumps(row) + "\n" for row in rows)
        return record

    def _publish(self, record: dict[str, Any]) -> None:
        with open(self.run_dir / "eval.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        log.info("eval step %d: pass@1 %.3f%s%s (%d prompts, %.1f s)", record["step"], record["pass@1"],
                 f", mean@{record['k']} {record['mean@k']:.3f}, pass@{record['k']} {record['pass@k']:.3f}"
                 if "mean@k" in record else "",
                 f", tool calls {record['tool_calls_mean']:.3f} an episode" if "tool_calls_mean" in record else "",
                 record["prompts"], record["duration_s"])
        self._results.put(record)


def response(s: Sample, decode: Callable[[np.ndarray], str] | None = None) -> Response:
    """A sample as the strict check reads it: its text, or with `decode` an episode's last model turn."""
    versions = (int(s.versions.min()), int(s.versions.max())) if len(s.versions) else None
    text = s.response_text
    if decode is not None and s.loss_mask is not None and not s.loss_mask.all():
        text = decode(final_turn(s.response_token_ids, s.loss_mask))
    return Response(prompt_id=s.prompt_id, greedy=s.prompt_id.endswith("-g"), text=text,
                    tokens=len(s.response_token_ids), versions=versions)


def final_turn(token_ids: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """The model's last turn of an episode: its last run of policy tokens (mask 1) — [] when the episode ends on
    environment tokens. The strict check reads only this, never a tool's output: the last number of the whole
    episode could be a calculator's result the model never gave as its answer."""
    model = np.flatnonzero(loss_mask)
    if len(model) == 0 or model[-1] != len(loss_mask) - 1:
        return token_ids[:0]
    env = np.flatnonzero(loss_mask[: model[-1]] == 0)
    start = env[-1] + 1 if len(env) else 0
    return token_ids[start:]


def build_evaluator(evaluation: EvalConfig, task: TaskConfig, multi_turn: bool, run_dir: Path,
                    model_path: str) -> LiveEvaluator | None:
    """Held-out evaluation through the generators (eval.every > 0): the task's held-out prompts, which the
    feeder leaves out of training; a multi-turn run's episodes are scored on their last model turn."""
    if not evaluation.enabled:
        return None
    from asyncrl.task import task_sampling
    from asyncrl.task.heldout import heldout_prompts

    heldout = heldout_prompts(task, evaluation.prompts, model_path if task.chat_template else None)
    return LiveEvaluator(evaluation, heldout, task_sampling(task), run_dir,
                         decode=tokenizer_decode(model_path) if multi_turn else None)


def tokenizer_decode(model_path: str) -> Callable[[np.ndarray], str]:
    """Token ids -> text with the model's tokenizer (what the strict check reads of an episode's last turn)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
