"""Replay hub journal: disk and resume time after N learner steps, compaction off vs on, side by side.

    python -m bench.journal [--steps 1000] [--prompts-per-step 4] [--n 8] [--tokens 256] [--compact-mb 64]

Drives `Journal` (the hub's state + log, no sockets) through a synthetic run shaped like a real one
(`synthetic_run`): per step, prompts submitted and leased, samples logged as the SampleBatch frames a
generator sends, scores (one failed sample per step), every 4th step a prompt returned and leased again,
every 5th step samples three versions old (dropped stale), then batch, version and commit. The same run
is written twice, once with compaction off and once on, and each journal is reopened (the resume).

Prints one JSON line: journal MiB on disk and resume seconds for both after the run, the files left, and
whether the resumed accounting matches (lost, per-state counts, transitions, events).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.journal import Journal
from asyncrl.replay.segments import Segments
from bench import provenance

OFF = 1 << 62  # compact_bytes that never triggers


def synthetic_run(j: Journal, steps: int, prompts_per_step: int = 4, n: int = 4, tokens: int = 16) -> None:
    """`steps` learner steps through `j`, leaving some prompts in flight at the end (see module doc)."""
    template = _template(tokens)
    for step in range(1, steps + 1):
        now = 1000.0 + step
        msg = R.SubmitPrompts(prompts=[R.Prompt(prompt_id=f"s{step}-{i}", n=n, text="q") for i in range(prompts_per_step)])
        j.submit(wire.encode(msg), msg)
        leases = [j.grant("gen-0", prompts_per_step, now, 600.0)]
        if step % 4 == 0:  # a prompt handed back and leased again
            entry, ps = leases[0]  # type: ignore[misc]
            j.return_prompts(entry.lease_id, [ps[-1].prompt_id])
            leases = [(entry, ps[:-1]), j.grant("gen-0", 1, now, 600.0)]
        version = max(0, j.state.version - (3 if step % 5 == 0 else 0))
        for entry, ps in leases:  # type: ignore[misc]
            _generate(j, entry.lease_id, ps, template, version)
        j.score([R.ScoreResult(prompt_id=f"s{step}-{i}", sample_index=k, reward=float(k % 2),
                               status=R.ScoreStatus.FAILED if (i, k) == (0, 0) else R.ScoreStatus.OK,
                               reason="boom" if (i, k) == (0, 0) else "")
                 for i in range(prompts_per_step) for k in range(n)])
        _learn(j, prompts_per_step, now)
    msg = R.SubmitPrompts(prompts=[R.Prompt(prompt_id="tail", n=n, text="q")])
    j.submit(wire.encode(msg), msg)
    j.grant("gen-0", 1, 1000.0 + steps, 600.0)  # in flight at the end


def _template(tokens: int) -> R.Sample:
    rng = np.random.default_rng(0)
    return R.Sample(prompt_id="", sample_index=0, prompt_token_ids=rng.integers(0, 32000, 64, dtype=np.int32),
                    response_token_ids=rng.integers(0, 32000, tokens, dtype=np.int32),
                    logprobs=-rng.random(tokens, dtype=np.float32), versions=np.zeros(tokens, np.int32),
                    finish_reason=R.FinishReason.STOP, response_text="x" * 32, generator="gen-0")


def _generate(j: Journal, lease_id: str, prompts: list[R.Prompt], t: R.Sample, version: int) -> None:
    versions = np.full(len(t.versions), version, np.int32)
    samples = [R.Sample(prompt_id=p.prompt_id, sample_index=k, prompt_token_ids=t.prompt_token_ids,
                        response_token_ids=t.response_token_ids, logprobs=t.logprobs, versions=versions,
                        finish_reason=t.finish_reason, response_text=t.response_text, generator=t.generator)
               for p in prompts for k in range(p.n)]
    frame = wire.encode(R.SampleBatch(lease_id=lease_id, samples=samples))
    j.add_samples(frame, wire.decode_packed(frame))


def _learn(j: Journal, prompts_per_step: int, now: float) -> None:
    """Prune stale, then batch + version + commit while enough groups are ready (as the hub does)."""
    j.prune_stale(j.state.version - 1)
    while len(j.state.ready) >= prompts_per_step:
        step = j.state.book.next_step
        j.form_batch(step, prompts_per_step)
        j.set_version(step)
        j.commit(step)
    j.sync()


def accounting(j: Journal) -> dict[str, Any]:
    """What must come out identical whichever way the state was rebuilt."""
    st = j.state
    return {"lost": st.counts.lost, "states": st.counts.snapshot(), "transitions": dict(st.counts.transitions),
            "events": dict(st.events), "committed": st.book.committed, "version": st.version,
            "queue": list(st.queue), "ready": list(st.ready),
            "leased": sorted((e.generator, tuple(e.prompt_ids)) for e in st.leases.leases.values())}


def measure(run_dir: Path, compact_bytes: int, args: argparse.Namespace) -> dict[str, Any]:
    path = run_dir / "replay.log"
    t0 = time.perf_counter()
    j = Journal.open(path, compact_bytes=compact_bytes)
    synthetic_run(j, args.steps, args.prompts_per_step, args.n, args.tokens)
    live, snapshots = accounting(j), j.snapshots_written
    j.close()
    write_s = time.perf_counter() - t0
    files = Segments(path)
    disk = files.bytes_on_disk()
    t0 = time.perf_counter()
    again = Journal.open(path)
    resume_s = time.perf_counter() - t0
    same = accounting(again) == live
    again.close()
    return {"disk_mb": round(disk / 2**20, 2), "resume_s": round(resume_s, 3),
            "write_s": round(write_s, 2), "snapshots_written": snapshots,
            "files": len(files.segments()) + len(files.snapshots()), "resumed_accounting_matches": same,
            "accounting": live}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--compact-mb", type=float, default=None, help="compact_bytes in MiB (default: the journal's)")
    args = ap.parse_args()
    compact = int(args.compact_mb * 2**20) if args.compact_mb is not None else Journal.open(None).compact_bytes
    with tempfile.TemporaryDirectory() as off_dir, tempfile.TemporaryDirectory() as on_dir:
        off = measure(Path(off_dir), OFF, args)
        on = measure(Path(on_dir), compact, args)
    same = off.pop("accounting") == on.pop("accounting")
    print(json.dumps({"bench": "journal", "steps": args.steps, "prompts_per_step": args.prompts_per_step,
                      "n": args.n, "tokens": args.tokens, "compact_bytes": compact, "off": off, "on": on,
                      "accounting_off_equals_on": same, "device": "cpu", "commit": provenance.commit()}))


if __name__ == "__main__":
    main()
