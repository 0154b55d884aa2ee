"""The hub's own work per sample, in process: `HubCore` fed bench.replay's messages, no sockets, no peers.

    python -m bench.hub_core [--steps 96] [--tokens 1024] [--log none|sync|background] [--repeat 5]
    python -m bench.hub_core --baseline /tmp/base --repeat 5    # before/after, interleaved

`bench.replay` measures the whole hub process (its loop, ZeroMQ's I/O thread, the journal's threads) on a
pinned core, which on a small shared VM moves by +-15 % from run to run. This bench times only what the
loop does with each request, in one process, so a change of a microsecond per sample shows. Per step, as
bench.replay's peers send them: two LeaseRequests of half a step's prompts, each answered by a SampleBatch of
their n samples each (128 prompt and `--tokens` response tokens, logprobs and versions), a ScoreRequest and the
ScoredIds of what it returned, a BatchRequest, a WeightVersion and a CommitStep. Every prompt is submitted
first, as bench.replay's feeder does. Each request is timed from its frame to its replies' frames:
`HubCore.handle`, `pump`, the journal's `sync` and the replies' encoding (`hub._frame`), as a loop turn does.

`--log`: none (no journal), sync (the journal written and flushed on the caller's thread, fsync never: its
encoding and writes, no disk wait) or background (records handed to the journal's threads, as the hub does;
their work is not timed here, only the hand-over).

Prints one JSON line per tree: us_per_sample (total) and by request kind, and the decode split of a
SampleBatch of 16 x n samples (`wire.decode_packed`, which takes msgspec's path where it can; its msgpack path,
and that path's msgpack walk and sample checks), each the median of `--repeat` runs.
`--baseline DIR` runs the same bench with `asyncrl` imported from the source tree DIR (e.g. `git worktree add
/tmp/base HEAD`), interleaved with this tree's runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from statistics import median

import numpy as np

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.core import HubCore
from asyncrl.replay.hub import _frame
from asyncrl.replay.journal import Journal
from bench import provenance
from bench.replay import _env, make_sample

LEASES_PER_STEP = 2
SUBMIT_CHUNK = 1024


class Driver:
    """A HubCore and the clock of each request kind."""

    def __init__(self, journal: Journal, prompts_per_step: int, n: int) -> None:
        self.journal = journal
        self.core = HubCore(HubConfig(max_staleness=4), BatchConfig(prompts_per_step=prompts_per_step,
                                                                    samples_per_prompt=n), journal)
        self.seconds: dict[str, float] = defaultdict(float)

    def send(self, peer: bytes, msg: object, kind: str) -> list:
        """One request as a loop turn handles it; its replies, decoded (untimed, as a peer would)."""
        frame = wire.encode(msg)
        t0 = time.perf_counter()
        self.core.handle([peer], frame, time.time())
        self.core.pump(time.time())
        self.journal.sync()
        out, self.core.outbox = self.core.outbox, []
        frames = [_frame(m) for _, m in out]
        self.seconds[kind] += time.perf_counter() - t0
        return [wire.decode(f) for f in frames]


def template(tokens: int) -> R.Sample:
    """The sample every generated one copies its arrays from: bench.replay's producer's."""
    return make_sample("", 0, tokens, np.random.default_rng(0))


def samples_for(lease: R.Lease, n: int, t: R.Sample) -> list[R.Sample]:
    versions = np.full(len(t.versions), lease.policy_version, np.int32)
    return [R.Sample(prompt_id=p.prompt_id, sample_index=i, prompt_token_ids=t.prompt_token_ids,
                     response_token_ids=t.response_token_ids, logprobs=t.logprobs, versions=versions,
                     finish_reason=t.finish_reason, response_text=t.response_text, generator=t.generator,
                     timings={"sent": 1.0}) for p in lease.prompts for i in range(n)]


def run_steps(d: Driver, args: argparse.Namespace) -> None:
    total, t = args.steps * args.prompts_per_step, template(args.tokens)
    for start in range(0, total, SUBMIT_CHUNK):
        d.send(b"feeder", R.SubmitPrompts(prompts=[R.Prompt(prompt_id=f"b{k}", n=args.n, text="q")
                                                    for k in range(start, min(total, start + SUBMIT_CHUNK))]), "submit")
    per_lease = args.prompts_per_step // LEASES_PER_STEP
    for step in range(1, args.steps + 1):
        for _ in range(LEASES_PER_STEP):
            lease = d.send(b"gen", R.LeaseRequest(generator="bench-gen", max_prompts=per_lease, wait_s=0.0), "lease")[0]
            if not isinstance(lease, R.Lease):
                raise RuntimeError(f"step {step}: no lease ({lease})")
            d.send(b"gen", R.SampleBatch(lease_id=lease.lease_id, samples=samples_for(lease, args.n, t)), "samples")
        todo = d.send(b"reward", R.ScoreRequest(worker="bench-reward", max_samples=1 << 16, wait_s=0.0), "score_request")[0]
        d.send(b"reward", R.ScoredIds(scores=[R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index,
                                                             reward=1.0) for it in todo.items]), "scored_ids")
        batch = d.send(b"learner", R.BatchRequest(learner="bench-learner", step=step, wait_s=0.0), "batch")[0]
        if not isinstance(batch, R.Batch):
            raise RuntimeError(f"step {step}: no batch ({batch})")
        d.send(b"learner", R.WeightVersion(version=step), "version")
        d.send(b"learner", R.CommitStep(step=step, policy_version=step), "commit")


def decode_split(args: argparse.Namespace, repeat: int = 50) -> dict[str, float]:
    """Microseconds per sample of decoding one SampleBatch of 16 x n samples, and of its two parts."""
    import inspect

    from asyncrl.wire import decode as wire_decode
    from asyncrl.wire.frames import unpack_with_spans as unpack
    from asyncrl.wire.sample import pack_samples

    def unpack_with_spans(frame: memoryview):  # a --baseline tree's may still take the frame size limit
        return unpack(frame) if len(inspect.signature(unpack).parameters) == 1 else unpack(frame, len(frame))

    t = template(args.tokens)
    lease = R.Lease(lease_id="L", prompts=[R.Prompt(prompt_id=f"p{k}", n=args.n, text="q") for k in range(16)],
                    policy_version=0, expires_in_s=60.0)
    frame = memoryview(wire.encode(R.SampleBatch(lease_id="L", samples=samples_for(lease, args.n, t))))
    count = 16 * args.n
    top, view, spans = unpack_with_spans(frame)
    values = top["b"]["samples"]

    def us(f) -> float:
        f()
        t0 = time.perf_counter()
        for _ in range(repeat):
            f()
        return round((time.perf_counter() - t0) / repeat / count * 1e6, 2)

    msgpack_path = getattr(wire_decode, "msgpack_packed", None)  # absent from a --baseline tree before it
    return {"decode_packed": us(lambda: wire.decode_packed(frame)),
            **({"msgpack_path": us(lambda: msgpack_path(frame))} if msgpack_path else {}),
            "msgpack_walk": us(lambda: unpack_with_spans(frame)),
            "sample_checks": us(lambda: pack_samples(values, [view[a:b] for a, b in spans], ("SampleBatch", "samples")))}


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = None if args.log == "none" else str(Path(tmp) / "replay.log")
        journal = Journal.open(path, "never", background=args.log == "background")
        try:
            d = Driver(journal, args.prompts_per_step, args.n)
            run_steps(d, args)
        finally:
            journal.close()
    samples = args.steps * args.prompts_per_step * args.n
    by_kind = {k: round(v / samples * 1e6, 2) for k, v in sorted(d.seconds.items(), key=lambda kv: -kv[1])}
    return {"us_per_sample": round(sum(d.seconds.values()) / samples * 1e6, 2), "by_kind": by_kind,
            "decode_us_per_sample": decode_split(args)}


def compare(args: argparse.Namespace) -> list[dict]:
    trees = ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else []) + [("this", provenance.HERE)]
    runs: dict[str, list[dict]] = {tree: [] for tree, _ in trees}
    for _ in range(args.repeat):
        for tree, src in trees:
            runs[tree].append(_run_in(src, args))
    out = []
    for tree, src in trees:
        rs = runs[tree]
        med = sorted(rs, key=lambda r: r["us_per_sample"])[len(rs) // 2]
        kinds = {k: median(r["by_kind"].get(k, 0.0) for r in rs) for k in med["by_kind"]}
        decode = {k: median(r["decode_us_per_sample"][k] for r in rs) for k in med["decode_us_per_sample"]}
        out.append({"bench": "hub_core", "tree": tree, "us_per_sample": med["us_per_sample"],
                    "runs_us_per_sample": [r["us_per_sample"] for r in rs], "by_kind": kinds,
                    "decode_us_per_sample": decode,
                    "context": {"steps": args.steps, "prompts_per_step": args.prompts_per_step, "n": args.n,
                                "response_tokens": args.tokens, "prompt_tokens": 128, "log": args.log,
                                "samples_per_message": args.prompts_per_step // LEASES_PER_STEP * args.n,
                                "commit": provenance.commit(src), "src": src, "cpus": os.cpu_count(),
                                "date": time.strftime("%Y-%m-%d")}})
    return out


def _run_in(src: str, args: argparse.Namespace) -> dict:
    """One measurement in a fresh process whose `asyncrl` comes from the source tree `src`."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", f"--steps={args.steps}",
           f"--prompts-per-step={args.prompts_per_step}", f"--n={args.n}", f"--tokens={args.tokens}", f"--log={args.log}"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=src, env=_env(src)).stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024, help="response tokens per sample")
    ap.add_argument("--log", choices=("none", "sync", "background"), default="none")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default=None, metavar="DIR", help="also run with asyncrl from source tree DIR")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one measurement, raw JSON
    args = ap.parse_args(argv)
    if args.prompts_per_step % LEASES_PER_STEP:
        ap.error(f"--prompts-per-step {args.prompts_per_step}: a step is leased in {LEASES_PER_STEP} halves; "
                 "use an even number")
    if args.one:
        print(json.dumps(measure(args)))
        return
    for line in compare(args):
        print(json.dumps(line))


if __name__ == "__main__":
    main()
