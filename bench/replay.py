"""Replay hub throughput: samples/s through a live hub process, end to end, over loopback.

    python -m bench.replay [--steps 96] [--prompts-per-step 32] [--n 8] [--tokens 1024] [--log]

The hub (services.replay) runs in its own process pinned to one core. Three peer processes, pinned to
the other cores, drive it like a run does:

    producer (generator-like): LeaseRequest → SampleBatch of n samples per prompt, 1k response tokens
        with logprobs and per-token versions
    scorer (reward-like): ScoreRequest → ScoredBatch (reward 1.0; sends the sample back by id, without
        its arrays — the hub keeps its own copy)
    learner: BatchRequest(step) → WeightVersion(step) → CommitStep(step)

Prints one JSON line: samples_per_s (trained samples / wall time from first lease to last commit),
hub_samples_per_cpu_s (trained samples / CPU seconds the hub process used: its one-core capacity),
p50/p99 latency of SampleBatch round trips (one message per lease) and of a sample from send to its batch, and context.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from asyncrl import records as R
from asyncrl.peer import HubPeer


def pin(cores: list[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def make_sample(pid: str, i: int, tokens: int, rng: np.random.Generator) -> R.Sample:
    return R.Sample(
        prompt_id=pid, sample_index=i, prompt_token_ids=rng.integers(0, 32000, 128, dtype=np.int32),
        response_token_ids=rng.integers(0, 32000, tokens, dtype=np.int32),
        logprobs=-rng.random(tokens, dtype=np.float32), versions=np.zeros(tokens, np.int32),
        finish_reason=R.FinishReason.STOP, response_text="x" * 64, generator="bench-gen",
    )


def producer(endpoint: str, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(0)
    peer = HubPeer(endpoint, "bench-gen", timeout_s=60)
    total = args.steps * args.prompts_per_step
    for start in range(0, total, 1024):
        peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=f"b{k}", n=args.n, text="q")
                                              for k in range(start, min(total, start + 1024))]))
    template = [make_sample("", i, args.tokens, rng) for i in range(args.n)]
    rtts, leased, t_first = [], 0, 0.0
    while leased < total:
        lease = peer.request(R.LeaseRequest(generator="bench-gen", max_prompts=args.lease_prompts, wait_s=1.0))
        t_first = t_first or time.time()
        samples = []
        for p in lease.prompts:
            for t in template:
                s = R.Sample(**{f: getattr(t, f) for f in t.__slots__})
                s.prompt_id, s.timings = p.prompt_id, {"sent": time.time()}
                s.versions = np.full(args.tokens, lease.policy_version, np.int32)
                samples.append(s)
        if samples:  # one message per lease: lease_prompts x n samples
            t0 = time.perf_counter()
            peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=samples))
            rtts.append(time.perf_counter() - t0)
        leased += len(lease.prompts)
    peer.close()
    return {"t_first": t_first, "rtts": rtts}


def scorer(endpoint: str, args: argparse.Namespace) -> dict:
    peer = HubPeer(endpoint, "bench-reward", timeout_s=60)
    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    scored = 0
    while scored < args.steps * args.prompts_per_step * args.n:
        todo = peer.request(R.ScoreRequest(worker="bench-reward", max_samples=512, wait_s=0.5))
        slim = [R.ScoredSample(sample=R.Sample(prompt_id=it.sample.prompt_id, sample_index=it.sample.sample_index,
                                               prompt_token_ids=empty_i, response_token_ids=empty_i, logprobs=empty_f,
                                               versions=empty_i, finish_reason=it.sample.finish_reason), reward=1.0)
                for it in todo.items]
        if slim:
            peer.request(R.ScoredBatch(scored=slim))
        scored += len(slim)
    peer.close()
    return {"scored": scored}


def learner(endpoint: str, args: argparse.Namespace) -> dict:
    peer = HubPeer(endpoint, "bench-learner", timeout_s=60)
    lat, trained, t_first = [], 0, None
    for step in range(1, args.steps + 1):
        while not isinstance(batch := peer.request(R.BatchRequest(learner="bench-learner", step=step, wait_s=1.0)), R.Batch):
            pass
        now = time.time()
        t_first = t_first or now
        lat.extend(now - s.sample.timings["sent"] for g in batch.groups for s in g.samples)
        trained += sum(len(g.samples) for g in batch.groups)
        peer.request(R.WeightVersion(version=step))
        peer.request(R.CommitStep(step=step, policy_version=step))
    peer.close()
    return {"trained": trained, "t_end": time.time(), "latency": lat}


def start_hub(run_dir: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    sets = [f"batch.prompts_per_step={args.prompts_per_step}", f"batch.samples_per_prompt={args.n}",
            f"generator.max_running={max(64, args.n)}", f"hub.max_staleness={args.max_staleness}",
            f"hub.log={'true' if args.log else 'false'}", "hub.fsync=batch"]
    cmd = [sys.executable, "-m", "services.replay", "--run-dir", run_dir, "--endpoint", "tcp://127.0.0.1:0"]
    for s in sets:
        cmd += ["--set", s]
    hub = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           preexec_fn=lambda: pin([args.hub_core]))
    line = hub.stdout.readline()  # type: ignore[union-attr]
    return hub, json.loads(line)["endpoint"]


ROLES = {"producer": producer, "scorer": scorer, "learner": learner}


def start_peer(role: str, endpoint: str, argv: list[str], cores: list[int]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.replay", "--role", role, "--endpoint", endpoint, *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: pin(cores))


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        hub, endpoint = start_hub(run_dir, args)
        try:
            peers = {role: start_peer(role, endpoint, argv, args.peer_cores) for role in ROLES}
            results = {role: json.loads(p.communicate(timeout=600)[0]) for role, p in peers.items()}
            log_bytes = (Path(run_dir) / "replay.log").stat().st_size if args.log else 0
            hub_cpu_s = _cpu_seconds(hub.pid)
        finally:
            hub.terminate()
            hub.wait(10)
    trained, t_end, lat = (results["learner"][k] for k in ("trained", "t_end", "latency"))
    t_first, rtts = results["producer"]["t_first"], results["producer"]["rtts"]
    elapsed = t_end - t_first
    return {
        "bench": "replay", "samples_per_s": round(trained / elapsed, 1), "samples": trained,
        "elapsed_s": round(elapsed, 3),
        "hub_cpu_s": round(hub_cpu_s, 3),
        "hub_samples_per_cpu_s": round(trained / hub_cpu_s, 1) if hub_cpu_s else None,
        "sample_batch_rtt_ms": {"p50": _ms(rtts, 50), "p99": _ms(rtts, 99)},
        "sample_to_batch_ms": {"p50": _ms(lat, 50), "p99": _ms(lat, 99)},
        "context": {"response_tokens": args.tokens, "prompt_tokens": 128, "samples_per_prompt": args.n,
                    "prompts_per_step": args.prompts_per_step, "steps": args.steps,
                    "samples_per_message": args.n * args.lease_prompts, "max_staleness": args.max_staleness, "log": args.log,
                    "log_mb": round(log_bytes / 1e6, 1), "hub_core": args.hub_core, "peer_cores": args.peer_cores,
                    "cpu": _cpu(), "cpus": os.cpu_count(), "commit": _commit(), "date": time.strftime("%Y-%m-%d")},
    }


def _ms(xs: list[float], q: int) -> float:
    return round(float(np.percentile(xs, q)) * 1000, 3) if xs else 0.0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (Linux), 0.0 where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench.replay", description="replay hub throughput")
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--tokens", type=int, default=1024, help="response tokens per sample")
    ap.add_argument("--lease-prompts", type=int, default=16)
    ap.add_argument("--max-staleness", type=int, default=4)
    ap.add_argument("--log", action=argparse.BooleanOptionalAction, default=True, help="hub writes its log")
    ap.add_argument("--hub-core", type=int, default=0)
    ap.add_argument("--role", choices=sorted(ROLES), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.role is not None:  # a peer process started by run()
        print(json.dumps(ROLES[args.role](args.endpoint, args)))
        return
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    args.peer_cores = [c for c in cores if c != args.hub_core] or cores
    print(json.dumps(run(args, argv)))


if __name__ == "__main__":
    main()
