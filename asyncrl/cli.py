"""Command line client of a running asyncrl system.

    python -m asyncrl.cli submit prompts.jsonl --run-dir RUN_DIR [--n 4] [--timeout 600]
    python -m asyncrl.cli stats --endpoint tcp://127.0.0.1:5555

`submit` reads one prompt per JSONL line (a JSON string, a list of token ids, or an object with
"text"/"prompt" or "token_ids", and optional "n", "target", "sampling", "metadata", "prompt_id") and prints
one JSON line per scored sample as it arrives. `stats` prints the hub's counters as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from asyncrl import records as R
from asyncrl.client import Client


def completion_json(s: R.ScoredSample) -> dict[str, Any]:
    smp = s.sample
    return {
        "prompt_id": smp.prompt_id, "sample_index": smp.sample_index, "reward": s.reward,
        "status": s.status.value, "reason": s.reason, "components": s.components,
        "response_text": smp.response_text, "response_token_ids": smp.response_token_ids.tolist(),
        "finish_reason": smp.finish_reason.value, "min_version": int(smp.versions.min()) if len(smp.versions) else None,
    }


def read_jsonl(path: str) -> list[Any]:
    lines = Path(path).read_text().splitlines()
    try:
        return [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not JSON lines ({e})") from None


def connect(args: argparse.Namespace) -> Client:
    if (args.endpoint is None) == (args.run_dir is None):
        raise SystemExit("give exactly one of --endpoint or --run-dir")
    return Client(args.endpoint, run_dir=args.run_dir) if args.endpoint else Client(run_dir=args.run_dir)


def cmd_submit(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.submit(read_jsonl(args.file), n=args.n)
        for scored in client.completions(timeout_s=args.timeout):
            print(json.dumps(completion_json(scored)), flush=True)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with connect(args) as client:
        print(json.dumps(client.stats(), default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="asyncrl.cli", description="Client of a running asyncrl system")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("submit", "stats"):
        p = sub.add_parser(name)
        p.add_argument("--run-dir", default=None)
        p.add_argument("--endpoint", default=None)
        if name == "submit":
            p.add_argument("file", help="JSONL file of prompts")
            p.add_argument("--n", type=int, default=1, help="samples per prompt (unless a line says)")
            p.add_argument("--timeout", type=float, default=None, help="seconds to wait for all results")
    args = ap.parse_args(argv)
    return cmd_submit(args) if args.cmd == "submit" else cmd_stats(args)


if __name__ == "__main__":
    sys.exit(main())
