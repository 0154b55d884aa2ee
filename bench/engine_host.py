"""Host time of the torch engine's per-decode-step bookkeeping, without a model: staging the rows
(`DecodeBuffers.stage`) and allocating KV slots (`Scheduler.schedule_decode`) for a full batch. On a GPU this
time sits on every decode step's critical path (a 0.5B decode step at batch 256 is ~2.6 ms of which the graph
replay is ~1.8 ms), so it bounds the engine's tokens/s. With the overlapped decode the same work runs while the
GPU runs the previous step (`Scheduler.schedule_ahead`, `DecodeBuffers.stage(..., src)`: the `*_ahead_ms` keys);
it then only needs to fit under the graph replay. Runs anywhere (CPU tensors); one JSON line.

    python -m bench.engine_host [--rows 256]
"""

from __future__ import annotations

import argparse
import json
import timeit

import torch

from asyncrl.engine.torch.block_manager import BlockManager
from asyncrl.engine.torch.decode_graphs import DecodeBuffers
from asyncrl.engine.torch.scheduler import Scheduler
from asyncrl.engine.torch.sequence import Sequence
from asyncrl.records import SamplingParams
from bench.provenance import commit


def running(rows: int, prompt: int, outputs: int, blocks: BlockManager) -> list[Sequence]:
    params = SamplingParams(max_new_tokens=4 * outputs, temperature=1.0)
    seqs = []
    for i in range(rows):
        seq = Sequence("r", i, list(range(1, prompt + 1)), params, 12345 + i, 0.0)
        for t in range(outputs):
            seq.append(t % 32, -1.0, 0, 0.0)
        seq.block_table = [blocks._take() for _ in range(-(-seq.num_tokens // blocks.block_size))]
        seqs.append(seq)
    return seqs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--outputs", type=int, default=128, help="tokens already generated per row")
    p.add_argument("--number", type=int, default=300)
    args = p.parse_args()
    blocks = BlockManager(args.rows * 64, 16)
    seqs = running(args.rows, args.prompt, args.outputs, blocks)
    scheduler = Scheduler(blocks, args.rows, 8192)
    scheduler.running = list(seqs)
    buffers = DecodeBuffers(args.rows, 64, 0, 16, torch.device("cpu"))
    buffers.stage(seqs, args.rows)

    def best(fn) -> float:
        return min(timeit.repeat(fn, number=args.number, repeat=7)) / args.number

    src = list(range(args.rows))
    stage_s = best(lambda: buffers.stage(seqs, args.rows))
    schedule_s = best(scheduler.schedule_decode)
    stage_ahead_s = best(lambda: buffers.stage(seqs, args.rows, src))
    schedule_ahead_s = best(lambda: scheduler.schedule_ahead(seqs))
    print(json.dumps({"bench": "engine_host", "rows": args.rows, "stage_ms": round(stage_s * 1e3, 4),
                      "schedule_decode_ms": round(schedule_s * 1e3, 4),
                      "stage_ahead_ms": round(stage_ahead_s * 1e3, 4),
                      "schedule_ahead_ms": round(schedule_ahead_s * 1e3, 4), "commit": commit()}))


if __name__ == "__main__":
    main()
