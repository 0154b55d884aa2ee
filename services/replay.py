"""Replay hub service: parse config → build the hub → serve until SIGTERM/SIGINT → close.

    python -m services.replay --run-dir RUN_DIR [--config run.toml] [--set hub.max_staleness=2] [--endpoint tcp://127.0.0.1:0]

Prints {"endpoint": ...} as one JSON line once bound and writes the same endpoint to RUN_DIR/replay.endpoint
(atomically: temp file + rename), where the launcher and `asyncrl.Client(run_dir=...)` read it.
Every peer must authenticate with the run's secret (RUN_DIR/secret, created here if the launcher did not).
A damaged journal (LogCorrupt) ends it with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from asyncrl.config.run import load_run_config
from asyncrl.credentials import RunSecret
from asyncrl.replay.hub import Hub, install_uvloop
from asyncrl.replay.log import LogCorrupt
from asyncrl.rundir import load_config, write_endpoint

EXIT_LOG_CORRUPT = 2  # the journal is damaged: restarting cannot help, a person must act


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="services.replay", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True, help="run directory (log and endpoint file live here)")
    ap.add_argument("--config", default=None, help="run config TOML (default: RUN_DIR/config.json if present)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--endpoint", default=None, help="bind here instead of hub.endpoint (port 0: any free port)")
    ap.add_argument("--metrics-port", type=int, default=None,
                    help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any free port; default: off)")
    return ap.parse_args(argv)


async def serve(hub: Hub) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, hub.stop)
    await hub.serve()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s replay %(levelname)s %(message)s")
    run_dir = Path(args.run_dir)
    launched = args.config is None and not args.set and (run_dir / "config.json").exists()
    cfg = load_config(run_dir) if launched else load_run_config(args.config, args.set)
    run_dir.mkdir(parents=True, exist_ok=True)
    install_uvloop()
    try:
        hub = Hub(cfg.hub, cfg.batch, run_dir, args.endpoint, secret=RunSecret.ensure(run_dir),
                  metrics_port=args.metrics_port)
    except LogCorrupt as e:  # damaged history: one line naming file, offset and what to do; no traceback
        print(f"replay: cannot resume: {e}", file=sys.stderr, flush=True)
        return EXIT_LOG_CORRUPT
    try:
        write_endpoint(run_dir, hub.endpoint)
        print(json.dumps({"endpoint": hub.endpoint}), flush=True)
        asyncio.run(serve(hub))
    finally:
        hub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
