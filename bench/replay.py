"""Replay hub throughput: samples/s through a live hub process, end to end, over loopback.

    python -m bench.replay [--steps 96] [--prompts-per-step 32] [--n 8] [--tokens 1024] [--log]
    python -m bench.replay --both-logs --repeat 5 --baseline /tmp/base   # before/after, log on/off
    python -m bench.replay --shards 4 --producers 4                      # a hub of 4 shards, 4 generators

`--baseline DIR` runs the same bench with the hub and the peers importing asyncrl from the source tree
DIR instead (e.g. `git worktree add /tmp/base HEAD`; its services must take `--run-dir DIR --name NAME`), interleaved with this tree's runs, so a change is
measured against its parent in one invocation under the same machine load. `--repeat N` runs each
configuration N times and prints its median run (with every run's samples_per_s). One JSON line per
configuration.

Peers reach the hub as a local run's do: through a Unix socket in the run directory (`--transport tcp`: TCP
on loopback, as peers on other hosts would). The hub (services.replay) runs in its own process pinned to one core (`--shards N`: N hub processes,
`replay-0..N-1`, pinned to cores hub_core..hub_core+N-1, which the peers reach through ShardedPeer as a run's
do). The peer processes, pinned to the other cores, drive it like a run does:

    producer (generator-like): LeaseRequest → SampleBatch of n samples per prompt, 1k response tokens
        with logprobs and per-token versions; `--producers P` such processes share the prompts (the first one
        also submits them all, as the feeder)
    scorer (reward-like): ScoreRequest → ScoredIds (reward 1.0, by sample id as `asyncrl.reward` does;
        the hub keeps its own copy of each sample)
    learner: BatchRequest(step) → WeightVersion(step) → CommitStep(step)

Prints one JSON line: samples_per_s (trained samples / wall time from first lease to last commit),
hub_samples_per_cpu_s (trained samples / CPU seconds the hub process used after start-up, its ZeroMQ
I/O thread included: its one-core capacity; with shards, their CPU seconds summed), peer_cpu_s (CPU seconds of each peer process after its
imports: they share the other cores, so they bound samples_per_s too),
p50/p99 latency of SampleBatch round trips (one message per lease, the producer's encoding included), of
LeaseRequest round trips and of a sample from send to its batch, and context. `--hub-profile PATH` runs
the hub under cProfile (its loop thread only; the journal's and ZeroMQ's threads are not in it).
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
from statistics import median

import numpy as np

from asyncrl import records as R
from asyncrl.net.hub_shards import HubShard, shard_name, shard_of
from asyncrl.net.peer import HubPeer
from asyncrl.net.sharded_peer import hub_peer
from asyncrl.replay.segments import Segments
from asyncrl.run.rundir import write_run_json
from bench import provenance
from bench.process_cpu import cpu_seconds, sum_threads


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


def connect(endpoint: str, name: str, role: str, args: argparse.Namespace) -> HubPeer:
    """A peer proving `role` with the run's secret, as the launcher's children do (the hub refuses strangers
    and checks what each role may send). `endpoint`: one hub's, or every shard's joined by commas."""
    from asyncrl.net.credentials import Credentials

    creds = Credentials.from_run_dir(args.run_dir, role)
    return hub_peer(endpoint.split(","), name, timeout_s=60, credentials=creds)  # type: ignore[return-value]


def producer(endpoint: str, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.index)
    total = args.steps * args.prompts_per_step
    if args.index == 0:  # prompts come from a client or the launcher: the first producer submits them all
        feeder = connect(endpoint, "bench-feeder", "client", args)
        ids = prompt_ids(total, args.shards)
        for start in range(0, total, 1024):
            feeder.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=pid, n=args.n, text="q")
                                                  for pid in ids[start:start + 1024]]))
        feeder.close()
    name = f"bench-gen-{args.index}"
    peer = connect(endpoint, name, "generator", args)
    quota = producer_quota(total, args.producers, args.index)
    template = [make_sample("", i, args.tokens, rng) for i in range(args.n)]
    rtts, lease_rtts, leased, t_first = [], [], 0, 0.0
    while leased < quota:
        t0 = time.perf_counter()
        want = min(args.lease_prompts, quota - leased)
        lease = peer.request(R.LeaseRequest(generator=name, max_prompts=want, wait_s=1.0))
        lease_rtts.append(time.perf_counter() - t0)
        t_first = t_first or time.time()
        samples = []
        for p in lease.prompts:
            for t in template:
                s = R.Sample(**{f: getattr(t, f) for f in t.__slots__})
                s.prompt_id, s.timings, s.generator = p.prompt_id, {"sent": time.time()}, name
                s.versions = np.full(args.tokens, lease.policy_version, np.int32)
                samples.append(s)
        if samples:  # one message per lease: lease_prompts x n samples
            t0 = time.perf_counter()
            peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=samples))
            rtts.append(time.perf_counter() - t0)
        leased += len(lease.prompts)
    peer.close()
    return {"t_first": t_first, "rtts": rtts, "lease_rtts": lease_rtts}


def prompt_ids(total: int, shards: int) -> list[str]:
    """`total` prompt ids, an equal number held by each shard (every shard must form its share of every step;
    ids that hashed unevenly would leave one shard short of prompts at the last steps)."""
    if shards == 1:
        return [f"b{k}" for k in range(total)]
    left, ids, k = [total // shards] * shards, [], 0
    while len(ids) < total:
        pid, k = f"b{k}", k + 1
        if left[shard := shard_of(pid, shards)] > 0:
            left[shard] -= 1
            ids.append(pid)
    return ids


def producer_quota(total: int, producers: int, index: int) -> int:
    """Prompts producer `index` of `producers` leases: an equal share, the first ones taking the remainder."""
    return total // producers + (1 if index < total % producers else 0)


def scorer(endpoint: str, args: argparse.Namespace) -> dict:
    peer = connect(endpoint, "bench-reward", "reward", args)
    scored = 0
    while scored < args.steps * args.prompts_per_step * args.n:
        todo = peer.request(R.ScoreRequest(worker="bench-reward", max_samples=512, wait_s=0.5))
        ids = [_item_id(it) for it in todo.items]
        if ids:
            peer.request(_scores_message(ids))
        scored += len(ids)
    peer.close()
    return {"scored": scored}


def _item_id(it: object) -> tuple[str, int]:
    """(prompt_id, sample_index) of a ToScoreItem; where the tree under test predates the slim item, its sample's."""
    s = getattr(it, "sample", it)
    return s.prompt_id, s.sample_index


def _scores_message(ids: list[tuple[str, int]]) -> object:
    """Reward 1.0 for each id: ScoredIds, or a slim ScoredBatch (empty arrays) where the tree under test
    predates ScoredIds."""
    if hasattr(R, "ScoredIds"):
        return R.ScoredIds(scores=[R.ScoreResult(prompt_id=p, sample_index=i, reward=1.0) for p, i in ids])
    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    return R.ScoredBatch(scored=[R.ScoredSample(sample=R.Sample(
        prompt_id=p, sample_index=i, prompt_token_ids=empty_i, response_token_ids=empty_i, logprobs=empty_f,
        versions=empty_i, finish_reason=R.FinishReason.STOP), reward=1.0) for p, i in ids])


def learner(endpoint: str, args: argparse.Namespace) -> dict:
    peer = connect(endpoint, "bench-learner", "learner", args)
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


def start_hubs(run_dir: str, args: argparse.Namespace, src: str) -> list[tuple[subprocess.Popen, str]]:
    """The hub's `args.shards` processes, each pinned to its own core, with the endpoints they bound."""
    sets = [f"batch.prompts_per_step={args.prompts_per_step}", f"batch.samples_per_prompt={args.n}",
            f"generator.max_running={max(64, args.n)}", f"hub.max_staleness={args.max_staleness}",
            f"hub.log={'true' if args.log else 'false'}", "hub.fsync=batch"]
    if args.shards > 1:
        sets.append(f"hub.shards={args.shards}")
    save_tree_config(run_dir, sets, src)  # the run directory as the launcher leaves it
    from asyncrl.net.endpoints import unix_endpoint  # here: peers run this file against a --baseline tree's asyncrl

    # as a local run's launcher does (launch.unix_sockets): a Unix socket in the run directory; tcp port 0: any free one
    names = [shard_name(k, args.shards) for k in range(args.shards)]
    shards = [unix_endpoint(run_dir, name) if args.transport == "ipc" else None for name in names]
    shards = [e or "tcp://127.0.0.1:0" for e in shards]
    endpoints: dict = {"replay": shards[0]}
    if args.shards > 1:
        endpoints["replay_shards"] = shards
    write_run_json(run_dir, {"endpoints": endpoints, "pids": {}})
    hubs = []
    for k in range(args.shards):
        name = shard_name(k, args.shards)
        profile = ["-m", "cProfile", "-o", f"{Path(args.hub_profile).resolve()}{'' if k == 0 else f'.{k}'}"] \
            if args.hub_profile else []
        cmd = [sys.executable, *profile, "-m", "services.replay", "--run-dir", run_dir, "--name", name]
        core = args.hub_cores[k]
        hub = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=src,
                               env=_env(src), preexec_fn=lambda core=core: pin([core]))
        hubs.append((hub, json.loads(hub.stdout.readline())["endpoint"]))  # type: ignore[union-attr]
    return hubs


def save_tree_config(run_dir: str, sets: list[str], src: str) -> None:
    """RUN_DIR/config.json written by the tree `src`'s own config code (a --baseline tree refuses keys it does
    not know, such as ones this tree added)."""
    code = ("import sys; from pathlib import Path; from asyncrl.config.run import load_run_config; "
            "from asyncrl.run.rundir import save_config; save_config(Path(sys.argv[1]), load_run_config(None, sys.argv[2:]))")
    subprocess.run([sys.executable, "-c", code, run_dir, *sets], check=True, cwd=src, env=_env(src))


def journal_bytes(run_dir: str, shards: int) -> int:
    """Bytes of every shard's journal (RUN_DIR/replay.log, or RUN_DIR/replay-K/replay.log per shard)."""
    return sum(Segments(HubShard(k, shards, Path(run_dir)).journal_dir() / "replay.log").bytes_on_disk()
               for k in range(shards))


ROLES = {"producer": producer, "scorer": scorer, "learner": learner}


def start_peer(role: str, endpoint: str, run_dir: str, args: argparse.Namespace, src: str,
               index: int = 0) -> subprocess.Popen:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--endpoint", endpoint, "--run-dir", run_dir,
           f"--index={index}", *_run_argv(args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=src, env=_env(src),
                            preexec_fn=lambda: pin(args.peer_cores))


def _env(src: str) -> dict[str, str]:
    """Environment whose `import asyncrl` (and `services`) resolves in the source tree `src`."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def _run_argv(args: argparse.Namespace) -> list[str]:
    """The options of one run, for its peer processes."""
    return [f"--steps={args.steps}", f"--prompts-per-step={args.prompts_per_step}", f"--n={args.n}",
            f"--tokens={args.tokens}", f"--lease-prompts={args.lease_prompts}", f"--max-staleness={args.max_staleness}",
            f"--producers={args.producers}", f"--shards={args.shards}"]


def run(args: argparse.Namespace, src: str) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        hubs = start_hubs(run_dir, args, src)
        try:
            cpu_at_start = sum(cpu_seconds(h.pid) for h, _ in hubs)  # imports and binding are not per-sample cost
            threads_at_start = sum_threads(hubs)
            endpoint = ",".join(e for _, e in hubs)
            peers = {f"producer-{i}": start_peer("producer", endpoint, run_dir, args, src, i)
                     for i in range(args.producers)}
            peers.update({role: start_peer(role, endpoint, run_dir, args, src) for role in ("scorer", "learner")})
            results = {role: json.loads(p.communicate(timeout=600)[0]) for role, p in peers.items()}
            log_bytes = journal_bytes(run_dir, args.shards) if args.log else 0  # + snapshots
            hub_cpu_s = sum(cpu_seconds(h.pid) for h, _ in hubs) - cpu_at_start
            threads = sum_threads(hubs, minus=threads_at_start)
            threads["exited"] = round(max(0.0, hub_cpu_s - sum(threads.values())), 3)
        finally:
            for hub, _ in hubs:
                hub.terminate()
            for hub, _ in hubs:
                hub.wait(10)
    producers = [results[f"producer-{i}"] for i in range(args.producers)]
    rtts = [x for r in producers for x in r["rtts"]]
    lease_rtts = [x for r in producers for x in r.get("lease_rtts", [])]
    t_first = min(r["t_first"] for r in producers if r["t_first"])
    trained, t_end, lat = (results["learner"][k] for k in ("trained", "t_end", "latency"))
    elapsed = t_end - t_first
    return {
        "bench": "replay", "samples_per_s": round(trained / elapsed, 1), "samples": trained,
        "elapsed_s": round(elapsed, 3),
        "hub_cpu_s": round(hub_cpu_s, 3),
        "hub_samples_per_cpu_s": round(trained / hub_cpu_s, 1) if hub_cpu_s else None,
        "hub_thread_cpu_s": threads,
        "peer_cpu_s": {role: round(r.get("cpu_s", 0.0), 3) for role, r in results.items()},
        "sample_batch_rtt_ms": {"p50": _ms(rtts, 50), "p99": _ms(rtts, 99)},
        "lease_rtt_ms": {"p50": _ms(lease_rtts, 50), "p99": _ms(lease_rtts, 99)},
        "sample_to_batch_ms": {"p50": _ms(lat, 50), "p99": _ms(lat, 99)},
        "context": {"response_tokens": args.tokens, "prompt_tokens": 128, "samples_per_prompt": args.n,
                    "prompts_per_step": args.prompts_per_step, "steps": args.steps,
                    "samples_per_message": args.n * args.lease_prompts, "max_staleness": args.max_staleness, "log": args.log,
                    "log_mb": round(log_bytes / 1e6, 1), "shards": args.shards, "producers": args.producers,
                    "hub_cores": args.hub_cores, "peer_cores": args.peer_cores, "transport": args.transport,
                    "cpu": _cpu(), "cpus": os.cpu_count(), "commit": provenance.commit(src), "src": src,
                    "date": time.strftime("%Y-%m-%d")},
    }


def compare(args: argparse.Namespace) -> list[dict]:
    """Every configuration (source tree x log on/off) `args.repeat` times, interleaved; median runs."""
    trees = ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else []) + [("this", provenance.HERE)]
    logs = [False, True] if args.both_logs else [args.log]
    runs: dict[tuple[str, bool], list[dict]] = {(t, log): [] for t, _ in trees for log in logs}
    for _ in range(args.repeat):
        for tree, src in trees:
            for log in logs:
                runs[(tree, log)].append(run(argparse.Namespace(**{**vars(args), "log": log}), src))
    out = []
    for (tree, _), rs in runs.items():
        best = sorted(rs, key=lambda r: r["samples_per_s"])[len(rs) // 2]
        out.append({**best, "tree": tree, "runs_samples_per_s": [r["samples_per_s"] for r in rs],
                    "median_hub_samples_per_cpu_s": median(r["hub_samples_per_cpu_s"] or 0.0 for r in rs)})
    return out


def _ms(xs: list[float], q: int) -> float:
    return round(float(np.percentile(xs, q)) * 1000, 3) if xs else 0.0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
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
    ap.add_argument("--both-logs", action="store_true", help="run each configuration with and without the log")
    ap.add_argument("--repeat", type=int, default=1, help="runs per configuration; the median run is printed")
    ap.add_argument("--baseline", default=None, metavar="DIR", help="also run from the source tree DIR, interleaved")
    ap.add_argument("--hub-core", type=int, default=0, help="the (first) hub's core; shard K takes the K-th core after it")
    ap.add_argument("--shards", type=int, default=1, help="hub processes (hub.shards), one core each")
    ap.add_argument("--producers", type=int, default=1, help="generator-like peer processes")
    ap.add_argument("--transport", choices=("ipc", "tcp"), default="ipc",
                    help="how peers reach the hub: ipc (a Unix socket in the run directory, as a local run's launcher "
                         "sets it up) or tcp (loopback, as across hosts)")
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--hub-profile", default=None, metavar="PATH",
                    help="run the hub under cProfile, stats to PATH (read with python -m pstats PATH)")
    ap.add_argument("--role", choices=sorted(ROLES), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.role is not None:  # a peer process started by run()
        cpu_at_start = time.process_time()  # imports are not per-sample cost
        print(json.dumps({**ROLES[args.role](args.endpoint, args), "cpu_s": time.process_time() - cpu_at_start}))
        return
    if args.shards < 1 or args.producers < 1 or args.prompts_per_step % args.shards:
        ap.error(f"--shards {args.shards} / --producers {args.producers}: both >= 1, and --prompts-per-step "
                 f"({args.prompts_per_step}) a multiple of --shards (each shard forms its share of a step)")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    at = cores.index(args.hub_core) if args.hub_core in cores else 0
    args.hub_cores = [cores[(at + k) % len(cores)] for k in range(args.shards)]
    args.peer_cores = [c for c in cores if c not in args.hub_cores] or cores
    for line in compare(args):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
