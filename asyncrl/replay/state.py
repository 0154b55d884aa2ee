"""The replay hub's state machine (`HubState`): pure, synchronous, no I/O, no clock, no config.

Every mutation takes all it depends on as arguments (the time `now`, lease ttl, batch size, minimum
version), so the hub logs a mutation with its arguments and a restart replays the log through the same
methods to rebuild the same state: queue order, leases, delivered batches, counters, version.

    submit ──► queue ──grant──► lease ──add_samples──► generated ──score──► ready groups ──form_batch──►
                 ▲                │                                             │          delivered batch
                 └─return/expire──┘                                  prune_stale (dropped)       │ commit
                                                                     filter_uniform (filtered)   │
                                                                                              trained

Admission (AReaL): a prompt is leased only while ``admitted < (max_staleness + version + 1) *
prompts_per_step`` where ``admitted`` = accepted (ready, delivered or trained groups) + running (leased
or generated, not yet in a batch). Groups that end failed, wholly stale or filtered (no signal) leave
``admitted`` so they never block admission. Sample accounting lives in `SampleCounts` (checked after every
mutation).

Client prompts (`submit(..., client=True)`: a `SubmitPrompts` with `watch`, as `asyncrl.Client` sends) are
leased, scored and trained like the run's own, but their failed samples count as `client_failed` and their
failed groups and prompts as the events ``client_groups_failed`` / ``client_prompts_failed``, never as the
run's failures (see `asyncrl.replay.counts`).

Evaluation prompts (`submit(..., evaluate=True)`: held-out prompts of `asyncrl.evaluation`) wait in their own
`eval_queue`, which every lease drains first and which admission does not gate (an evaluation must not wait
for training to make room, nor take training's room); they are generated and scored like any prompt, and a
complete evaluation group is forgotten at once (its watcher got every sample): never READY, never in a
batch. Their samples are counted in `eval_counts`, apart from the run's accounting.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from asyncrl.records import Batch, Group, Prompt, SampleState, ScoredSample, ScoreResult, ScoreStatus
from asyncrl.wire import PackedSample
from asyncrl.replay.batches import BatchBook
from asyncrl.replay.counts import SampleCounts
from asyncrl.replay.groups import NEVER_STALE, GroupEntry, Phase
from asyncrl.replay.leases import LeaseEntry, LeaseTable

S = SampleState


@dataclass(slots=True)
class Outcome:
    """What a batch of samples or scores did: accepted ids (and scored samples), rejections by reason."""

    accepted: list[tuple[str, int]] = field(default_factory=list)
    scored: list[ScoredSample] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)


class HubState:
    def __init__(self) -> None:
        self.counts = SampleCounts()
        self.groups: dict[str, GroupEntry] = {}  # live prompts (forgotten once trained/failed/dropped)
        self.queue: deque[str] = deque()  # prompt ids in lease order
        self.eval_queue: deque[str] = deque()  # evaluation prompt ids, leased before `queue`, outside admission
        self.eval_counts = SampleCounts()  # samples of evaluation prompts (not the run's accounting)
        self.leases = LeaseTable()
        self.ready: dict[str, None] = {}  # READY prompt ids, oldest first (insertion-ordered)
        self.book = BatchBook()
        self.version = 0  # newest policy version announced by the learner
        self.admitted = 0  # accepted + running prompts (admission count)
        self.events: Counter[str] = Counter()  # prompts_submitted, rejected_*, dropped_stale, ...
        self.pending_dropped = 0  # samples dropped stale since the last batch was formed
        self.prompts_seq = 0  # ids "p<seq>" for prompts submitted without one

    # ------------------------------------------------------------------------------------- queries

    def admissible(self, max_staleness: int, prompts_per_step: int) -> int:
        """How many more prompts may be leased now under the staleness bound."""
        return max(0, (max_staleness + self.version + 1) * prompts_per_step - self.admitted)

    @property
    def accepted(self) -> int:
        return len(self.ready) + self.events["groups_batched"]

    @property
    def running(self) -> int:
        return self.admitted - self.accepted

    def generated_ids(self) -> list[tuple[str, int]]:
        """Samples waiting for a score, oldest prompt first (used to rebuild dispatch after a restart)."""
        return [(pid, i) for pid, g in self.groups.items() for i in g.indices(S.GENERATED)]

    def is_client(self, prompt_id: str) -> bool:
        """Whether a live prompt was submitted by a client."""
        g = self.groups.get(prompt_id)
        return g is not None and g.client

    def sample(self, prompt_id: str, index: int) -> GroupEntry | None:
        """The group of a sample that waits for its score, else None."""
        g = self.groups.get(prompt_id)
        if g is None or not 0 <= index < g.prompt.n or g.states[index] is not S.GENERATED:
            return None
        return g

    # ----------------------------------------------------------------------------------- mutations

    def submit(self, prompts: list[Prompt], client: bool = False, evaluate: bool = False) -> list[str]:
        """Queue prompts (all or none). A prompt without an id gets "p<seq>". `client`: sent by a client
        (its outcomes are counted apart from the run's); `evaluate`: held-out evaluation prompts (module doc)."""
        empty = next((p for p in prompts if _is_empty(p)), None)
        if empty is not None:
            raise ValueError(f"prompt {empty.prompt_id!r} is empty (no token_ids and no text): nothing to generate from")
        ids = [p.prompt_id for p in prompts if p.prompt_id]
        dup = next((i for i in ids if i in self.groups), None) or _first_duplicate(ids)
        if dup is not None:
            raise ValueError(f"prompt_id {dup!r} is already live in the hub: give each prompt a unique id")
        for p in prompts:
            if not p.prompt_id:
                self.prompts_seq += 1
                p.prompt_id = f"p{self.prompts_seq}"
                assert p.prompt_id not in self.groups, f"generated prompt id {p.prompt_id} collides"
            self.groups[p.prompt_id] = GroupEntry.new(p, client, evaluate)
            (self.eval_queue if evaluate else self.queue).append(p.prompt_id)
            (self.eval_counts if evaluate else self.counts).add(p.n, client)
        self._bump("eval_prompts_submitted" if evaluate else "prompts_submitted", len(prompts))
        self._check()
        return [p.prompt_id for p in prompts]

    def grant(self, generator: str, count: int, now: float, ttl_s: float,
              lease_id: str = "") -> tuple[LeaseEntry, list[Prompt]] | None:
        """Lease up to `count` queued prompts to `generator` until `now + ttl_s`, evaluation prompts first; None
        if none. `lease_id` is the logged id on replay (else a fresh one)."""
        evals = [self.eval_queue.popleft() for _ in range(min(count, len(self.eval_queue)))]
        take = evals + [self.queue.popleft() for _ in range(min(count - len(evals), len(self.queue)))]
        if not take:
            return None
        entry = self.leases.open(generator, take, now + ttl_s, lease_id)
        for pid in take:
            g = self.groups[pid]
            g.phase, g.lease_id = Phase.OUT, entry.lease_id
            self._move(g, S.QUEUED, S.LEASED)
        self.admitted += len(take) - len(evals)
        self._bump("leases_granted", 1)
        self._check()
        return entry, [self.groups[pid].prompt for pid in take]

    def add_samples(self, lease_id: str, samples: list[PackedSample]) -> Outcome:
        """Generated samples of a lease (kept as their wire bytes); anything not leased under it is rejected
        with a reason."""
        out = Outcome()
        entry = self.leases.get(lease_id)
        for s in samples:
            reason = self._sample_reject_reason(entry, s)
            if reason:
                out.rejected[reason] += 1
                continue
            g = self.groups[s.prompt_id]
            if not s.finite:  # the datum fails (never trained on), the lease goes on
                self._set(g, s.sample_index, S.LEASED, S.FAILED)
                out.rejected["non_finite_logprobs"] += 1
            else:
                self._set(g, s.sample_index, S.LEASED, S.GENERATED)
                g.samples[s.sample_index] = s
                g.min_versions[s.sample_index] = _oldest_version(s)
                out.accepted.append((s.prompt_id, s.sample_index))
            if not g.count(S.LEASED):
                g.lease_id = ""
                self.leases.release(lease_id, s.prompt_id)
                if g.is_complete():  # its last samples failed here: nothing left to score
                    self._complete(g)
        self._count_rejects("samples", out.rejected)
        self._check()
        return out

    def return_prompts(self, lease_id: str, prompt_ids: list[str]) -> int:
        """Prompts a generator will not finish go back to the front of the queue; returns how many."""
        entry = self.leases.get(lease_id)
        if entry is None:
            return 0
        back = [pid for pid in prompt_ids if pid in entry.prompt_ids]
        self._requeue(entry, back)
        self._bump("prompts_returned", len(back))
        self._check()
        return len(back)

    def fail_prompts(self, lease_id: str, prompt_ids: list[str]) -> int:
        """Leased prompts the generator cannot take: their leased samples fail; returns how many prompts."""
        entry = self.leases.get(lease_id)
        if entry is None:
            return 0
        failed = [pid for pid in prompt_ids if pid in entry.prompt_ids]
        for pid in failed:
            g = self.groups[pid]
            self._move(g, S.LEASED, S.FAILED)
            g.lease_id = ""
            self.leases.release(lease_id, pid)
            if g.is_complete():  # else its generated samples still wait for scores
                self._complete(g)
            self._bump(_failure_event(g, "prompts_failed"), 1)
        self._check()
        return len(failed)

    def expire(self, now: float) -> int:
        """Leases past their deadline give their still-leased prompts back; returns how many prompts."""
        total = 0
        for entry in self.leases.overdue(now):
            prompt_ids = list(entry.prompt_ids)
            self._requeue(entry, prompt_ids)
            self.leases.close(entry.lease_id)
            self._bump("leases_expired", 1)
            total += len(prompt_ids)
        self._bump("prompts_expired", total)
        self._check()
        return total

    def score(self, results: list[ScoreResult]) -> Outcome:
        """Scores of generated samples; completes groups (READY, or failed when no sample is OK)."""
        out = Outcome()
        for r in results:
            g = self.groups.get(r.prompt_id)
            if g is None or not 0 <= r.sample_index < g.prompt.n or g.states[r.sample_index] is not S.GENERATED:
                out.rejected["not_generated"] += 1
                continue
            status, reason, finite = r.status, r.reason, _finite_reward(r)
            if status is ScoreStatus.OK and not finite:  # fails the sample, never reaches a loss
                status, reason = ScoreStatus.FAILED, f"non-finite reward {r.reward!r} or component"
                out.rejected["non_finite_reward"] += 1
            failed = status is ScoreStatus.FAILED
            self._set(g, r.sample_index, S.GENERATED, S.FAILED if failed else S.SCORED)
            sample = g.samples[r.sample_index]
            assert sample is not None
            scored = ScoredSample(sample=sample, reward=0.0 if failed else r.reward,
                                  components=r.components if finite else {}, status=status, reason=reason)
            g.scored[r.sample_index] = scored
            out.accepted.append((r.prompt_id, r.sample_index))
            out.scored.append(scored)
            if g.is_complete():
                self._complete(g)
        self._count_rejects("scores", out.rejected)
        self._check()
        return out

    def prune_stale(self, min_version: int) -> int:
        """Drop scored samples of ready groups whose oldest token version < `min_version`."""
        dropped = 0
        for pid in list(self.ready):
            g = self.groups[pid]
            if g.checked_min >= min_version:
                continue
            g.checked_min = min_version
            for i in g.indices(S.SCORED):
                if g.min_versions[i] < min_version:
                    self._set(g, i, S.SCORED, S.DROPPED)
                    g.scored[i] = None
                    dropped += 1
            if not g.count(S.SCORED):
                del self.ready[pid]
                self._forget(g, "groups_dropped_stale")
        self.pending_dropped += dropped
        self._bump("dropped_stale", dropped)
        self._check()
        return dropped

    def filter_uniform(self) -> int:
        """DAPO dynamic sampling with refill (`learner.filter_refill`): every ready group without signal
        (`GroupEntry.has_signal`, the learner's filter rule: zero advantage for each sample) leaves now, its
        samples FILTERED. Leaving frees its admission slot, so a new prompt is generated in its place and
        batches fill with groups that have signal. Returns how many groups left. It walks every ready group
        each time (a few hundred at most, bounded by admission)."""
        dropped = 0
        for pid in list(self.ready):
            g = self.groups[pid]
            if g.has_signal():
                continue
            for i in g.indices(S.SCORED):
                self._set(g, i, S.SCORED, S.FILTERED)
                g.scored[i] = None
            del self.ready[pid]
            self._forget(g, "groups_filtered")
            dropped += 1
        self._check()
        return dropped

    def form_batch(self, step: int, prompts_per_step: int) -> Batch:
        """The batch of `step` from the oldest `prompts_per_step` ready groups (caller checked both)."""
        assert step == self.book.next_step and len(self.ready) >= prompts_per_step
        pids = [pid for pid, _ in zip(self.ready, range(prompts_per_step))]
        groups = []
        for pid in pids:
            del self.ready[pid]
            g = self.groups[pid]
            groups.append(Group(prompt=g.prompt, samples=g.ok_samples()))
            g.phase = Phase.BATCHED
            self._move(g, S.SCORED, S.DELIVERED)
        batch = Batch(step=step, policy_version=self.version, groups=groups, dropped_stale=self.pending_dropped)
        self.pending_dropped = 0
        self.book.add(batch, pids)
        self._bump("groups_batched", len(pids))
        self._bump("batches_formed", 1)
        self._check()
        return batch

    def commit(self, step: int) -> int:
        """Batches of steps <= `step` were trained; returns how many were committed now."""
        if step > self.book.last_formed:
            raise ValueError(f"commit step {step}: only steps <= {self.book.last_formed} were delivered")
        done = self.book.pop_through(step)
        for _, pids in done:
            for pid in pids:
                self._move(self.groups.pop(pid), S.DELIVERED, S.TRAINED)
        self._bump("batches_committed", len(done))
        self._check()
        return len(done)

    def set_version(self, version: int) -> None:
        """The learner announced `version` (latest wins: a learner resumed from a checkpoint may go back)."""
        self.version = version
        self._bump("versions_announced", 1)

    # ------------------------------------------------------------------------------------- helpers

    def _sample_reject_reason(self, entry: LeaseEntry | None, s: PackedSample) -> str:
        if entry is None:
            return "expired_lease"
        g = self.groups.get(s.prompt_id)
        if g is None:
            return "unknown_prompt"
        if s.sample_index >= g.prompt.n:
            return "bad_index"
        if g.states[s.sample_index] is not S.LEASED:
            return "duplicate"
        if g.lease_id != entry.lease_id:
            return "not_in_lease"
        return ""

    def _requeue(self, entry: LeaseEntry, prompt_ids: list[str]) -> None:
        for pid in reversed(prompt_ids):  # appendleft in reverse keeps their order at the front
            g = self.groups[pid]
            self._move(g, S.LEASED, S.QUEUED)
            g.phase, g.lease_id = Phase.QUEUED, ""
            (self.eval_queue if g.evaluate else self.queue).appendleft(pid)
            self.leases.release(entry.lease_id, pid)
            self.admitted -= not g.evaluate

    def _complete(self, g: GroupEntry) -> None:
        if g.evaluate:  # its watcher has every sample: nothing is kept, nothing is batched
            self._forget(g, "eval_groups_done" if g.count(S.SCORED) else "eval_groups_failed")
        elif g.count(S.SCORED):
            g.phase = Phase.READY
            self.ready[g.prompt.prompt_id] = None
        else:
            self._forget(g, _failure_event(g, "groups_failed"))

    def _forget(self, g: GroupEntry, event: str) -> None:
        del self.groups[g.prompt.prompt_id]
        self.admitted -= not g.evaluate
        self._bump(event, 1)

    def _move(self, g: GroupEntry, src: SampleState, dst: SampleState) -> None:
        """Every sample of `g` in `src` to `dst`, counted at once."""
        moved = g.indices(src)
        for i in moved:
            g.states[i] = dst
        if moved:
            (self.eval_counts if g.evaluate else self.counts).move(src, dst, len(moved), client=g.client)

    def _set(self, g: GroupEntry, i: int, src: SampleState, dst: SampleState) -> None:
        assert g.states[i] is src, f"{g.prompt.prompt_id}[{i}] is {g.states[i]}, not {src}"
        g.states[i] = dst
        (self.eval_counts if g.evaluate else self.counts).move(src, dst, client=g.client)

    def _count_rejects(self, what: str, rejected: Counter[str]) -> None:
        for reason, n in rejected.items():
            self._bump(f"rejected_{what}_{reason}", n)
            self._bump(f"rejected_{what}", n)

    def _bump(self, event: str, n: int) -> None:
        if n:  # no zero entries: a mutation that changed nothing leaves no trace (it is not logged)
            self.events[event] += n

    def _check(self) -> None:
        self.counts.check()
        self.eval_counts.check()
        assert self.admitted >= 0, f"admitted={self.admitted} < 0"


def _failure_event(g: GroupEntry, event: str) -> str:
    """The event a failure of `g` counts under: the client's own for client prompts, evaluation's for those."""
    return f"eval_{event}" if g.evaluate else f"client_{event}" if g.client else event


def _oldest_version(s: PackedSample) -> int:
    """Oldest policy version among a sample's tokens (NEVER_STALE for an empty response)."""
    return NEVER_STALE if s.min_version is None else s.min_version


def _is_empty(p: Prompt) -> bool:
    return len(p.token_ids) == 0 if p.token_ids is not None else not p.text


def _finite_reward(r: ScoreResult) -> bool:
    return math.isfinite(r.reward) and (not r.components or all(math.isfinite(v) for v in r.components.values()))


def _first_duplicate(ids: list[str]) -> str | None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    return None
