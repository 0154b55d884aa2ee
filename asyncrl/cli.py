"""Command line client of a running asyncrl system.

    python -m asyncrl.cli submit prompts.jsonl --run-dir RUN_DIR [--n 4] [--timeout 600]
    python -m asyncrl.cli stats --endpoint tcp://127.0.0.1:5555

`submit` reads one prompt per JSONL line (a JSON string, a list of token ids, or an object with
"text"/"prompt" or "token_ids", and optional "n", "target", "sampling", "metadata", "prompt_id") and prints
one JSON line per scored sample as it arrives. `stats` prints the hub's counters as one JSON line (of a
finished run: the final counters from its summary.json, with "finished": true). A run directory that
does not exist, or whose run has finished, is one line on stderr and exit code 2, at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from asyncrl import records as R
from asyncrl.client import Client
from asyncrl.task.jsonl import json_lines


def completion_json(s: R.ScoredSample) -> dict[str, Any]:
    smp = s.sample
    return {
        "prompt_id": smp.prompt_id, "sample_index": smp.sample_index, "reward": s.reward,
        "status": s.status.value, "reason": s.reason, "components": s.components,
        "response_text": smp.response_text, "response_token_ids": smp.response_token_ids.tolist(),
        "finish_reason": smp.finish_reason.value, "min_version": int(smp.versions.min()) if len(smp.versions) else None,
    }


def read_jsonl(path: str) -> list[Any]:
    if not Path(path).is_file():
        raise UsageError(f"{path}: no such prompt file; give a JSONL file, one prompt per line")
    try:
        return [obj for _, obj in json_lines(path)]
    except ValueError as e:  # the line that is not JSON
        raise UsageError(str(e)) from None


class UsageError(ValueError):
    """A mistake in the command line; the message is the one line printed (exit 2)."""


def check_run_dir(run_dir: str) -> None:
    """A run directory of a run that is up: it exists, has run.json and no summary.json (written at the end)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UsageError(f"--run-dir {run_dir}: no such directory; give the directory `python -m launch` printed")
    if (path / "summary.json").exists():
        raise UsageError(f"--run-dir {run_dir}: this run has finished (summary.json is there; nothing serves it); "
                         f"start it again with `python -m launch --resume {run_dir} --set learner.steps=N`")
    if not (path / "run.json").exists():
        raise UsageError(f"--run-dir {run_dir}: no run.json there; is it a run directory, and has the run started?")


def connect(args: argparse.Namespace) -> Client:
    if (args.endpoint is None) == (args.run_dir is None):
        raise UsageError("give exactly one of --endpoint or --run-dir")
    if args.run_dir is not None:
        check_run_dir(args.run_dir)
    return Client(args.endpoint, run_dir=args.run_dir) if args.endpoint else Client(run_dir=args.run_dir)


def cmd_submit(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.submit(read_jsonl(args.file), n=args.n)
        for scored in client.completions(timeout_s=args.timeout):
            print(json.dumps(completion_json(scored)), flush=True)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    summary = Path(args.run_dir or "", "summary.json")
    if args.run_dir and Path(args.run_dir).is_dir() and summary.exists():
        final = json.loads(summary.read_text())  # a finished run: its final counters, no hub to ask
        print(json.dumps({**final.get("hub", {}), "accounting": final.get("accounting"), "finished": True}, default=str))
        return 0
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
    try:
        return cmd_submit(args) if args.cmd == "submit" else cmd_stats(args)
    except UsageError as e:
        print(f"asyncrl.cli: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
