"""StepLoop: the torch engine's rounds of prefill and decode steps, and what their samples do to the sequences.

`TorchEngine.step()` runs one round: admit and prefill what fits, then one decode step. The loop owns the
steps' order and the sampled tokens' bookkeeping (append, stop rules, finish); the engine owns requests, weights
and the API around it.

Overlapped decode (`overlap`, on by default with CUDA graphs): a decode step is launched before the previous
one's results are read, and its input tokens come from that step's samples on the device (`inflight` has the
timeline), so a round returns a sample one round after its last token was sampled. Anything that needs the host
state first drains the step in flight (reads and applies its results): a prefill (new or resumed groups
waiting), blocks short for the next step (then schedule_decode preempts as usual), rows with top-k / top-p or
forced tokens, and the engine's pause / abort / begin_weight_update / score / close. Tokens, logprobs, versions
and finish reasons are those of the synchronous loop; a sequence that stops at a stop token has already been
given a row in the next step, which is computed and discarded.

A prefill is overlapped the same way (`_prefill_then_decode`, timeline in `inflight`): the next decode step is
launched before the prefill's samples are read, its new rows taking their first tokens from them on the device.

One thread (the one driving the engine) calls everything here; nothing is shared with another thread.
"""

from __future__ import annotations

import time

import torch

from asyncrl.engine.torch.inflight import InflightStep, ResultBuffers
from asyncrl.engine.torch.model_runner import ModelRunner
from asyncrl.engine.torch.scheduler import Scheduler
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup, SequenceStatus
from asyncrl.observe.stage import stage
from asyncrl.records import FinishReason


class StepLoop:
    """Rounds of steps over `scheduler`'s sequences on `runner`; every token stamped with `version` (the engine
    sets it at each weight update)."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, *, max_running: int, max_model_len: int,
                 eos_token_ids: frozenset[int], deterministic: bool, overlap: bool, version: int,
                 device: torch.device) -> None:
        self.runner, self.scheduler = runner, scheduler
        self.max_model_len, self.eos_token_ids = max_model_len, eos_token_ids
        self.deterministic, self.overlap = deterministic, overlap
        self.overlap_prefill = overlap  # `_prefill_then_decode`; benches turn it off to measure it
        self.version = version
        self._results = ResultBuffers(max_running, device) if overlap else None
        self.inflight: InflightStep | None = None  # the decode step launched and not yet read
        # decode_ahead: decode steps launched from the previous step's samples on the device (overlap);
        # discarded_rows: rows computed for a sequence that had stopped in the step before
        # prefills_overlapped: prefills whose samples were read after the next decode step was launched
        # prefills: groups admitted; prefill_batches: admissions (each its own prefill step, the groups of one together)
        self.counters = {"prefills": 0, "prefill_batches": 0, "prefill_tokens": 0, "decode_steps": 0,
                         "tokens_generated": 0, "decode_ahead": 0, "discarded_rows": 0, "prefills_overlapped": 0}

    def round(self) -> list[Sequence]:
        """One round: prefill what can be admitted, one decode step -> the sequences that finished (with overlap:
        in the decode step read in this round, launched in the previous one)."""
        if self.inflight is not None and not self.scheduler.waiting:  # nothing to admit: run ahead
            with stage("engine.decode_ahead"):
                ahead = self._decode_ahead()
            if ahead is not None:
                return ahead
        with stage("engine.drain"):
            finished = self.drain()  # admission and preemption decide on the complete host state
        with stage("engine.schedule_prefill"):
            groups = self.scheduler.schedule_prefill()
        if groups and self._overlaps_prefill(groups):
            with stage("engine.prefill_overlapped"):
                done, launched = self._prefill_then_decode(groups)
            finished += done
            if launched:
                return finished
        elif groups:
            finished += self._prefill(groups)
        with stage("engine.schedule_decode"):
            seqs = self.scheduler.schedule_decode()
        if seqs:
            with stage("engine.decode"):
                finished += self._decode(seqs)
        return finished

    def drain(self) -> list[Sequence]:
        """Read and apply the step in flight, if any (launching nothing) -> the sequences that finished."""
        prev, self.inflight = self.inflight, None
        return [] if prev is None else self._read(prev)

    # ---------------------------------------------------------------- prefill

    def _prefill(self, groups: list[SequenceGroup]) -> list[Sequence]:
        start = self._prefill_begins(groups)
        finished = []
        for batch in ([g] for g in groups) if self.deterministic else [groups]:  # alone: no batch dependence
            seqs, tokens, logprobs = self.runner.prefill(batch)
            finished += self._append(seqs, tokens, logprobs, self.version)
        self._prefill_ends(groups, start)
        return finished

    def _overlaps_prefill(self, groups: list[SequenceGroup]) -> bool:
        """Whether the next decode step can be launched before the prefill's samples are read: overlap on, some
        group samples, and every running row can run ahead (no top-k / top-p, nothing forced)."""
        return (self.overlap_prefill and any(not g.is_resume for g in groups)
                and self.runner.can_run_ahead(self.scheduler.running))

    def _prefill_then_decode(self, groups: list[SequenceGroup]) -> tuple[list[Sequence], bool]:
        """Launch the prefill, then the next decode step, whose new rows take their first tokens from the
        prefill's samples on the device, then read those samples while the GPU decodes; the step's own results
        are read in the next round. The rows and the order are schedule_decode's after a synchronous prefill,
        plus the rows of sequences whose first token stops them (computed and discarded, as in `_decode_ahead`).
        -> (the sequences that finished, whether the step was launched). Not launched when the free blocks do
        not cover it: the round then schedules (and preempts) as the synchronous loop does."""
        start = self._prefill_begins(groups)
        seqs, sampled = self.runner.launch_prefill(groups)
        prefill = self._results.launch(seqs, sampled, self.version)  # its host copy, queued behind it
        column = {id(s): i for i, s in enumerate(seqs)}
        rows, src = [], []
        for seq in self.scheduler.running:
            i = column.get(id(seq), -1)
            if i < 0 or not self._at_length(seq, pending=1):
                rows.append(seq)
                src.append(i)
        launched = bool(rows) and self.scheduler.schedule_rows(rows, [int(i >= 0) for i in src])
        if launched:
            self._launch(rows, src)
            self.counters["prefills_overlapped"] += 1
        finished = self._read(prefill)
        self._prefill_ends(groups, start)
        return finished, launched

    def _prefill_begins(self, groups: list[SequenceGroup]) -> float:
        start = time.perf_counter()
        for seq in (s for g in groups for s in g.seqs if s.prefill_start is None):
            seq.prefill_start = start
        self.counters["prefills"] += len(groups)
        self.counters["prefill_batches"] += 1  # admissions: each a prefill step of its own
        self.counters["prefill_tokens"] += sum(len(g.prefill_token_ids()) - g.num_cached for g in groups)
        return start

    def _prefill_ends(self, groups: list[SequenceGroup], start: float) -> None:
        elapsed = time.perf_counter() - start
        for seq in (s for g in groups for s in g.seqs):
            seq.prefill_s += elapsed

    # ---------------------------------------------------------------- decode

    def _decode(self, seqs: list[Sequence]) -> list[Sequence]:
        """One decode step from the host's tokens: synchronous, or with overlap launched and left in flight."""
        if self.overlap and self.runner.can_run_ahead(seqs):
            self._launch(seqs)
            return []
        tokens, logprobs = self.runner.decode(seqs)
        self.counters["decode_steps"] += 1
        return self._append(seqs, tokens, logprobs, self.version)

    def _decode_ahead(self) -> list[Sequence] | None:
        """Launch the next decode step from the in-flight one's samples on the device, then read and apply
        the in-flight step's results while the GPU runs the new one. Its rows: the in-flight step's sequences
        that still run and do not end with their pending token. -> the sequences that finished; None when the
        free KV blocks do not cover the new step (nothing launched: the round drains and schedules as usual)."""
        prev = self.inflight
        src = [i for i, s in enumerate(prev.seqs) if s.status is SequenceStatus.RUNNING and not self._at_length(s, pending=1)]
        seqs = [prev.seqs[i] for i in src]
        if not self.scheduler.schedule_ahead(seqs):
            return None
        self.inflight = None
        if seqs:
            self._launch(seqs, src)
            self.counters["decode_ahead"] += 1
        return self._read(prev)

    def _launch(self, seqs: list[Sequence], src: list[int] | None = None) -> None:
        sampled = self.runner.launch_decode(seqs, src)
        self.counters["decode_steps"] += 1
        self.inflight = self._results.launch(seqs, sampled, self.version)

    def _read(self, step: InflightStep) -> list[Sequence]:
        """Wait for a launched step and apply its tokens. A finished sequence's blocks are freed here although
        the step launched after this one may still write its pending token's KV into them: any later owner of
        those blocks writes them in a step queued after that one on the same stream, so the stale write lands
        first."""
        tokens, logprobs = step.results()
        return self._append(step.seqs, tokens, logprobs, step.version)

    # ---------------------------------------------------------------- samples

    def _append(
        self, seqs: list[Sequence], tokens: torch.Tensor, logprobs: torch.Tensor, version: int
    ) -> list[Sequence]:
        """Apply one token per row, stamped `version`. A row whose sequence no longer runs (it stopped in the step
        before this one, which ran ahead of it) is discarded."""
        now = time.perf_counter()
        finished = []
        running = SequenceStatus.RUNNING
        appended = 0
        for seq, token, logprob in zip(seqs, tokens.tolist(), logprobs.tolist(), strict=True):
            if seq.status is not running:
                continue
            seq.append(token, logprob, version, now)
            appended += 1
            reason = self._finish_reason(seq, token)
            if reason is not None:
                seq.finish(reason, now)
                self.scheduler.finish(seq)
                finished.append(seq)
        self.counters["tokens_generated"] += appended
        self.counters["discarded_rows"] += len(seqs) - appended
        return finished

    def _at_length(self, seq: Sequence, pending: int = 0) -> bool:
        """The length rule: max_new_tokens or max_model_len reached, counting `pending` tokens not yet appended
        (pending = 1: its token in flight is its last, whatever it is)."""
        return (seq.num_outputs + pending >= seq.sampling.max_new_tokens
                or seq.num_tokens + pending >= self.max_model_len)

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        if seq.forced_token_ids is not None:  # scoring: the forced tokens decide, not EOS or max_new_tokens
            return FinishReason.LENGTH if seq.forced_done else None
        params = seq.sampling
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return FinishReason.STOP
        if self._at_length(seq):
            return FinishReason.LENGTH
        return None
