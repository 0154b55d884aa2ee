"""Multi-turn episodes with slow tools: does the engine keep decoding while episodes wait on their tools?

The generator worker drives the torch engine with the MultiTurn rollout over a simulated tool: every model turn
(fixed length, EOS ignored) is answered after `tool_ms` by `--obs-tokens` random tokens, for `--turns` turns.
`--episodes` are in flight at once (generator.rollout.max_episodes) over `--episodes / --oversubscribe` engine
rows (max_running): while some wait on their tool, the others fill the rows. `--waves W` runs W x `--episodes`
episodes through those slots, a new one leased as one ends, as a training run's generator does: with one wave
every episode starts together and the run ends on a tail of last turns (few live episodes, each waiting on its
tool), which weighs less the more waves run. Each tool latency runs with the engine's prefix cache off and on
(`--prefix-cache`), one JSON line each:

    python -m bench.agentic                                     # 0.5B shape, 256 episodes on 128 rows, 4 turns, 0/50/200 ms
    python -m bench.agentic --waves 4 --prefix-cache 1          # 1,024 episodes through the same 256 slots
    python -m bench.agentic --shape tiny --device cpu --episodes 16 --turns 2 --turn-tokens 8 --tool-ms 0,20

    tokens_per_s             model tokens over the run's wall time (the engine's output rate)
    vs_no_tool               tokens_per_s / the first latency's figure (0 ms by default), same prefix-cache setting
    engine_idle_frac         wall time the engine had no work (every live episode waiting on its tool)
    history_tokens_per_turn  mean context of the turns 2.. (what the engine prefills without a prefix cache)
    prefill_tokens_per_turn  mean tokens it prefilled for them (with the cache: the last model token, the
                             environment's tokens and the partial page before them)
    prefill_frac             their ratio; prefix_cache_hit_tokens: tokens the cache served (the whole run)
    vs_no_cache              with the cache: {prefill_tokens, tokens_per_s} / the same latency's figures without it
    turns, episodes_per_s, env_time_s (means per episode)

Turns are `--turn-tokens` long, all of them, unless `--turn-spread s` gives each prompt's turns a length drawn
uniformly from turn_tokens x [1 - s, 1 + s] (the same draw at every latency): with fixed turns the episodes started
together call their tools together, a burst a real task's ragged turns do not make.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from asyncrl import records as R
from asyncrl.generator.local_hub import LocalHub
from asyncrl.generator.worker import GeneratorWorker
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.environment import Observation, Step
from asyncrl.rollout.multi_turn import MultiTurn
from bench import provenance
from bench.generation import SHAPES, VOCAB, build_hf, make_engine


class SlowTool:
    """Answers each turn after `ms` with `k` random token ids; `turns` turns."""

    def __init__(self, ms: float, k: int, turns: int, seed: int) -> None:
        self.ms, self.k, self.turns = ms, k, turns
        self.rng = np.random.default_rng(seed)

    async def reset(self, task):
        return None

    async def step(self, action):
        if self.ms:
            await asyncio.sleep(self.ms / 1000)
        if action.turn >= self.turns:
            return Step(reward=1.0, done=True, tool_calls=1)
        return Step(observation=Observation(token_ids=self.rng.integers(0, VOCAB, self.k).tolist()), tool_calls=1)


class Metered:
    """The engine, with its busy time, output tokens and request prompt lengths counted."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.busy_s, self.tokens, self.prompts = engine, 0.0, 0, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def add(self, request: Any) -> None:
        self.prompts.append((request.request_id, len(request.prompt_token_ids)))
        self.engine.add(request)

    def step(self) -> list:
        t = time.perf_counter()
        out = self.engine.step()
        self.busy_s += time.perf_counter() - t
        self.tokens += sum(len(o.token_ids) for o in out)
        return out


class IdTokenizer:
    eos_token_id = None
    chat_template = None

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return ""


def run_case(args: argparse.Namespace, hf: Any, tool_ms: float, prompt_len: int, prefix_cache: bool,
             prefill_overlap: bool = True) -> dict[str, Any]:
    max_len = context_len(args, prompt_len)
    rows = max(1, int(args.episodes / args.oversubscribe))  # the engine's max_running; the rest wait their turn
    kv_sequences = args.kv_episodes or args.episodes  # room for every episode's KV while it waits on its tool
    engine = Metered(make_engine(hf, rows, max_len, kv_sequences=kv_sequences, prefix_cache=prefix_cache))
    engine.engine.overlap_prefill = engine.engine.overlap and prefill_overlap
    rng = np.random.default_rng(0)
    groups = args.episodes * args.waves // args.group
    lengths = turn_lengths(args.turn_tokens, args.turn_spread, groups)
    prompts = [R.Prompt(prompt_id=f"p{i}", n=args.group, token_ids=rng.integers(0, VOCAB, prompt_len).astype(np.int32),
                        sampling=R.SamplingParams(max_new_tokens=int(lengths[i]), ignore_eos=True, temperature=1.0))
               for i in range(groups)]
    hub = LocalHub(prompts)
    cfg = RolloutConfig(environment="bench:SlowTool", max_turns=args.turns, step_timeout_s=60.0,
                        max_total_tokens=context_len(args, 0))  # room for every turn
    rollout = MultiTurn(cfg, lambda: SlowTool(tool_ms, args.obs_tokens, args.turns, seed=1), IdTokenizer(), VOCAB)
    worker = GeneratorWorker(name="bench", engine=engine, hub=hub, tokenizer=IdTokenizer(), max_running=args.episodes,
                             group_size=args.group, rollout=rollout)
    start = time.perf_counter()
    while len(hub.samples) < groups * args.group:
        worker.run_once()
    wall = time.perf_counter() - start
    rollout.close()
    return {"tool_ms": tool_ms, "prefix_cache": prefix_cache, "prefill_overlap": engine.engine.overlap_prefill,
            "prefills_overlapped": engine.engine.counters["prefills_overlapped"],
            **decode_figures(engine.engine.counters),
            "episodes": len(hub.samples), "waves": args.waves,
            "engine_rows": rows,
            "kv_tokens": kv_sequences * max_len,
            "turns": float(np.mean([s.rollout["turns"] for s in hub.samples])), "wall_s": round(wall, 3),
            "tokens_per_s": round(engine.tokens / wall, 1), "engine_idle_frac": round(1 - engine.busy_s / wall, 3),
            **prefill_figures(engine), "episodes_per_s": round(len(hub.samples) / wall, 2),
            "env_time_s": round(float(np.mean([s.rollout["env_time_s"] for s in hub.samples])), 3)}


def context_len(args: argparse.Namespace, prompt_len: int) -> int:
    """An episode's longest context: the prompt, then every turn at its longest with the tool's answer."""
    return prompt_len + args.turns * (longest_turn(args.turn_tokens, args.turn_spread) + args.obs_tokens)


def longest_turn(turn_tokens: int, spread: float) -> int:
    return round(turn_tokens * (1 + spread))


def turn_lengths(turn_tokens: int, spread: float, groups: int) -> np.ndarray:
    """Each group's turn length, uniform in turn_tokens x [1 - spread, 1 + spread] (the same draw for every tool
    latency: seeded), so the mean stays turn_tokens. 0: every turn the same length, so episodes started together
    end their turns together and call their tools in one burst; a real task's turns are ragged."""
    if not spread:
        return np.full(groups, turn_tokens)
    rng = np.random.default_rng(12345)
    low, high = round(turn_tokens * (1 - spread)), longest_turn(turn_tokens, spread)
    return rng.integers(low, high + 1, groups)


def decode_figures(counters: dict[str, int]) -> dict[str, Any]:
    """How full the engine's decode steps ran: prefill batches (admissions), decode steps (synchronous and run
    ahead) and the sampled tokens a step, against the engine's rows."""
    steps = counters["decode_steps"]  # every launch or synchronous step (decode_ahead counts a subset)
    return {"prefill_batches": counters["prefill_batches"], "decode_steps": steps,
            "rows_per_decode": round(counters["tokens_generated"] / steps, 1) if steps else None}


def prefill_figures(engine: Metered) -> dict[str, Any]:
    """What turns 2.. prefilled against their contexts: the engine's prefill tokens minus the first turns' (each
    first turn's n samples share one prefill of the prompt, which no cache hit shortens: random prompts)."""
    stats, preempted = engine.stats(), engine.scheduler.num_preemptions
    continued = [length for rid, length in engine.prompts if "#t1" not in rid]
    first = sum(length for rid, length in engine.prompts if "#t1" in rid)
    prefilled = (stats.prefill_tokens - first) / len(continued) if continued else 0.0
    history = float(np.mean(continued)) if continued else 0.0
    return {"history_tokens_per_turn": round(history, 1), "prefill_tokens_per_turn": round(prefilled, 1),
            "prefill_frac": round(prefilled / history, 3) if history else None, "prefill_tokens": stats.prefill_tokens,
            "prefix_cache_hit_tokens": stats.prefix_cache_hit_tokens, "preemptions": preempted}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.agentic")
    p.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--waves", type=int, default=1,
                   help="episodes through the run, in multiples of --episodes (kept in flight, refilled as they end)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--turn-tokens", type=int, default=128)
    p.add_argument("--turn-spread", type=float, default=0.0,
                   help="ragged turns: each prompt's turn length uniform in --turn-tokens x [1 - s, 1 + s] (0: fixed)")
    p.add_argument("--obs-tokens", type=int, default=32)
    p.add_argument("--tool-ms", default="0,50,200")
    p.add_argument("--oversubscribe", type=float, default=2.0,
                   help="episodes in flight per engine row (generator.rollout.max_episodes / max_running)")
    p.add_argument("--kv-episodes", type=int, default=0,
                   help="KV room in episodes of the longest length (0: every episode); fewer makes the cache evict "
                        "the KV of episodes waiting on their tool")
    p.add_argument("--prefix-cache", default="0,1", help="engine prefix cache settings to run, in turn (0 off, 1 on)")
    p.add_argument("--prefill-overlap", default="1",
                   help="comma list of 0/1: the engine's overlapped prefill (TorchEngine.overlap_prefill) off / on, "
                        "run in turn inside each prefix-cache setting (vs_no_overlap: on against off)")
    args = p.parse_args(argv)
    if args.episodes % args.group:
        p.error(f"--episodes {args.episodes} must be a multiple of --group {args.group}")
    if args.waves < 1:
        p.error(f"--waves {args.waves}: must be >= 1")
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    if not 0 <= args.turn_spread < 1:
        p.error(f"--turn-spread {args.turn_spread}: must be in [0, 1)")
    hf = build_hf(args.shape, context_len(args, args.prompt_len), dtype=dtype, device=args.device)
    commit = provenance.commit()
    latencies = [float(x) for x in args.tool_ms.split(",")]
    caches = [bool(int(x)) for x in args.prefix_cache.split(",")]
    overlaps = [bool(int(x)) for x in args.prefill_overlap.split(",")]
    for cache in caches:  # warm-up of each engine path (kernels, autotuning, allocator), not reported: the cached
        run_case(args, hf, latencies[0], args.prompt_len, cache)  # one's masked prefill is not the uncached one's
    rows: dict[tuple[float, bool, bool], dict[str, Any]] = {}  # (tool ms, prefix cache, prefill overlap) -> row
    for ms in latencies:
        for cache in caches:
            for overlap in overlaps:
                row = rows[ms, cache, overlap] = run_case(args, hf, ms, args.prompt_len, cache, overlap)
                no_tool = rows[latencies[0], cache, overlap]
                row.update(vs_no_tool=round(row["tokens_per_s"] / no_tool["tokens_per_s"], 3),
                           shape=args.shape, device=args.device, prompt_len=args.prompt_len,
                           turn_tokens=args.turn_tokens, turn_spread=args.turn_spread, obs_tokens=args.obs_tokens,
                           commit=commit)
                if cache and (ms, False, overlap) in rows:
                    off = rows[ms, False, overlap]
                    row["vs_no_cache"] = {k: round(row[k] / off[k], 3) for k in ("prefill_tokens", "tokens_per_s")}
                if row["prefill_overlap"] and (ms, cache, False) in rows:  # False on CPU: no overlap there
                    row["vs_no_overlap"] = round(row["tokens_per_s"] / rows[ms, cache, False]["tokens_per_s"], 3)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
