"""`Journal`: the hub's state plus its log. Every mutation is applied, then logged with its arguments.

One log record per mutation, ``[kind, *args]`` as msgpack (`asyncrl.wire.encode_record`); requests that
carry records (SubmitPrompts, SampleBatch) are logged as the network frame they arrived in, written
from the received buffer as it is (`wire.log_record_parts`), so the hot path never re-encodes or
copies samples. `Journal.open(path)` replays the log through the same `HubState`
methods, which are deterministic in their arguments, so a restart rebuilds the same state. A mutation
that raised is not logged (it changed nothing).

Scores are logged by sample id only (the sample itself was logged when it arrived).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.leases import LeaseEntry
from asyncrl.replay.log import LogWriter, iter_records
from asyncrl.replay.state import HubState, Outcome


class Journal:
    def __init__(self, state: HubState, writer: LogWriter | None) -> None:
        self.state = state
        self.writer = writer

    @classmethod
    def open(cls, path: str | Path | None, fsync: str = "batch") -> Journal:
        """Rebuild the state from the log at `path` (if any) and keep appending to it. None: no log."""
        state = HubState()
        if path is not None:
            for payload in iter_records(path):
                apply(state, wire.decode_record(payload))
        return cls(state, LogWriter(path, fsync) if path is not None else None)

    def _log(self, *record: Any) -> None:
        if self.writer is not None:
            self.writer.append(wire.encode_record(list(record)))

    def _log_frame(self, kind: str, frame: bytes | memoryview) -> None:
        if self.writer is not None:
            self.writer.append(*wire.log_record_parts(kind, frame))

    def sync(self) -> None:
        if self.writer is not None:
            self.writer.sync()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    # -- logged mutations (same signatures as HubState, plus the raw frame where one exists)

    def submit(self, frame: bytes | memoryview, msg: R.SubmitPrompts) -> list[str]:
        ids = self.state.submit(msg.prompts)
        self._log_frame("submit", frame)
        return ids

    def grant(self, generator: str, count: int, now: float, ttl_s: float) -> tuple[LeaseEntry, list[R.Prompt]] | None:
        got = self.state.grant(generator, count, now, ttl_s)
        if got is not None:
            self._log("grant", generator, count, now, ttl_s, got[0].lease_id)
        return got

    def add_samples(self, frame: bytes | memoryview, msg: R.SampleBatch) -> Outcome:
        out = self.state.add_samples(msg.lease_id, msg.samples)
        self._log_frame("samples", frame)
        return out

    def return_prompts(self, lease_id: str, prompt_ids: list[str]) -> int:
        n = self.state.return_prompts(lease_id, prompt_ids)
        if n:
            self._log("return", lease_id, prompt_ids)
        return n

    def fail_prompts(self, lease_id: str, prompt_ids: list[str]) -> int:
        n = self.state.fail_prompts(lease_id, prompt_ids)
        if n:
            self._log("fail", lease_id, prompt_ids)
        return n

    def expire(self, now: float) -> int:
        if not self.state.leases.overdue(now):
            return 0
        n = self.state.expire(now)
        self._log("expire", now)
        return n

    def score(self, results: list[R.ScoreResult]) -> Outcome:
        out = self.state.score(results)
        self._log("score", [_pack_score(r) for r in results])
        return out

    def prune_stale(self, min_version: int) -> int:
        n = self.state.prune_stale(min_version)
        if n:
            self._log("prune", min_version)
        return n

    def form_batch(self, step: int, prompts_per_step: int) -> R.Batch:
        batch = self.state.form_batch(step, prompts_per_step)
        self._log("form", step, prompts_per_step)
        return batch

    def commit(self, step: int) -> int:
        n = self.state.commit(step)
        if n:
            self._log("commit", step)
        return n

    def set_version(self, version: int) -> None:
        self.state.set_version(version)
        self._log("version", version)


def _pack_score(r: R.ScoreResult) -> list[Any]:
    return [r.prompt_id, r.sample_index, r.reward, r.components, r.status.value, r.reason]


def _unpack_score(v: list[Any]) -> R.ScoreResult:
    pid, idx, reward, components, status, reason = v
    return R.ScoreResult(prompt_id=pid, sample_index=idx, reward=reward, components=components,
                       status=R.ScoreStatus(status), reason=reason)


def apply(state: HubState, record: list[Any]) -> None:
    """Re-apply one logged mutation to `state` (log replay)."""
    kind, *args = record
    if kind == "submit":
        state.submit(wire.decode(args[0]).prompts)
    elif kind == "grant":
        state.grant(*args)
    elif kind == "samples":
        msg = wire.decode_packed(args[0])
        state.add_samples(msg.lease_id, msg.samples)
    elif kind == "return":
        state.return_prompts(*args)
    elif kind == "fail":
        state.fail_prompts(*args)
    elif kind == "expire":
        state.expire(*args)
    elif kind == "score":
        state.score([_unpack_score(v) for v in args[0]])
    elif kind == "prune":
        state.prune_stale(*args)
    elif kind == "form":
        state.form_batch(*args)
    elif kind == "commit":
        state.commit(*args)
    elif kind == "version":
        state.set_version(*args)
    else:
        raise ValueError(f"unknown log record kind {kind!r}: the log was written by a newer asyncrl")
