"""Reward worker process: score generated samples pulled from the hub, send them back.

python -m services.reward --run-dir DIR --name reward-0                  # as the launcher starts it
python -m services.reward --endpoint tcp://127.0.0.1:5555 --name reward-0 [--config run.toml] [--set reward.timeout_s=5]
"""

from __future__ import annotations

import argparse
import asyncio

from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.lifecycle import StopFlag, adopt_credentials, setup_logging
from asyncrl.peer import HubPeer
from asyncrl.records import FatalError
from asyncrl.reward.scorer import Scorer
from asyncrl.reward.worker import RewardWorker
from asyncrl.rundir import load_config, read_run_json


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="asyncrl reward worker")
    p.add_argument("--name", required=True, help="unique worker name, e.g. reward-0")
    p.add_argument("--run-dir", help="run directory: config.json and the hub endpoint in run.json")
    p.add_argument("--endpoint", help="hub endpoint (without --run-dir)")
    p.add_argument("--config", help="run config TOML (without --run-dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    args = p.parse_args()
    if not (args.run_dir or args.endpoint):
        p.error("give --run-dir, or --endpoint (with optional --config / --set)")
    return args


def resolve(args: argparse.Namespace) -> tuple[RunConfig, str]:
    if args.run_dir:
        return load_config(args.run_dir), args.endpoint or read_run_json(args.run_dir)["endpoints"]["replay"]
    return load_run_config(args.config, args.set), args.endpoint


async def serve(worker: RewardWorker, scorer: Scorer, stop: StopFlag) -> None:
    try:
        await worker.run(stop)
    finally:
        await scorer.close()  # on this loop: it owns the http connections


def main() -> None:
    args = parse_args()
    log = setup_logging(args.name)
    stop = StopFlag().install()
    cfg, endpoint = resolve(args)
    if args.run_dir:
        adopt_credentials(args.run_dir, "reward")
    peer = HubPeer(endpoint, args.name, timeout_s=10.0)  # loopback: a healthy hub answers in ms
    peer.give_up = stop.is_set
    scorer = Scorer(cfg.reward)
    worker = RewardWorker(peer, scorer, cfg.reward, args.name)
    log.info("reward worker %s serving %s with %s", args.name, endpoint, [c.name for c in cfg.reward.components])
    try:
        asyncio.run(serve(worker, scorer, stop))
    except Exception as e:
        peer.timeout_s = 5.0
        try:
            peer.request(FatalError(service="reward", name=args.name, reason=f"{type(e).__name__}: {e}"))
        except Exception:  # noqa: BLE001 - the hub may be the thing that is gone
            log.warning("could not report the fatal error to the hub")
        raise
    finally:
        worker.close()
        peer.close()
        log.info("reward worker %s stopped: %d scored, %d failed", args.name, worker.scored, worker.failed)


if __name__ == "__main__":
    main()
