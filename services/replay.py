"""Replay hub service: read the run directory → build the hub → serve until SIGTERM/SIGINT → close.

    python -m services.replay --run-dir RUN_DIR --name replay        # replay-K: shard K of hub.shards

Binds run.json's endpoints["replay"] (the launcher picked it; port 0: any free port; shard K:
endpoints["replay_shards"][K], its journal in RUN_DIR/replay-K/) and serves Prometheus metrics at
run.json's metrics_endpoints["hub"] (shard K > 0: "hub-K") when there is one. Prints {"endpoint": ...}
as one JSON line once bound (readiness, for scripts that start it by hand). Every peer must
authenticate with the run's secret (RUN_DIR/secret, created here if the launcher did not).
A damaged journal (LogCorrupt) ends it with one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from asyncrl.net.credentials import RunSecret
from asyncrl.net.hub_shards import HubShard
from asyncrl.run.lifecycle import start_service
from asyncrl.observe.prometheus import url_port
from asyncrl.replay.config import shard_batch
from asyncrl.replay.hub import Hub, settle_gc
from asyncrl.replay.log import LogCorrupt

EXIT_LOG_CORRUPT = EXIT_CANNOT_START = 2  # a damaged journal, a name that is no shard: a restart cannot help


def main(argv: list[str] | None = None) -> int:
    started = start_service("asyncrl replay hub", None, argv=argv)  # the hub holds the secret itself
    stop, cfg, run = started.stop, started.cfg, started.run
    run_dir = Path(started.args.run_dir)
    try:
        shard = HubShard.of(started.args.name, cfg.hub.shards, run_dir)
    except ValueError as e:  # a name that is no shard of this run
        print(f"replay: {e}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_START
    try:
        hub = Hub(cfg.hub, shard_batch(cfg.batch, cfg.hub.shards), shard.journal_dir(), shard.endpoint(run),
                  secret=RunSecret.ensure(run_dir), metrics_port=url_port(shard.metrics_endpoint(run)),
                  filter_uniform=cfg.learner.resolved_filter_refill)
    except LogCorrupt as e:  # damaged history: one line naming file, offset and what to do; no traceback
        print(f"replay: cannot resume: {e}", file=sys.stderr, flush=True)
        return EXIT_LOG_CORRUPT
    try:
        stop.on_set(hub.stop)  # the loop leaves within one tick
        print(json.dumps({"endpoint": hub.endpoint}), flush=True)
        settle_gc()  # this process is the hub's: its start-up heap frozen out of collections
        hub.serve()
    finally:
        hub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
