"""Reward worker process: score generated samples pulled from the hub, send them back.

python -m services.reward --run-dir DIR --name reward-0
"""

from __future__ import annotations

import asyncio

from asyncrl.net.heartbeat import fatal_to_hub
from asyncrl.run.lifecycle import StopFlag, start_service
from asyncrl.net.hub_shards import hub_endpoints
from asyncrl.net.sharded_peer import hub_peer
from asyncrl.reward.scorer import Scorer
from asyncrl.reward.worker import RewardWorker


async def serve(worker: RewardWorker, scorer: Scorer, stop: StopFlag) -> None:
    try:
        await worker.run(stop)
    finally:
        await scorer.close()  # on this loop: it owns the http connections


def main() -> None:
    started = start_service("asyncrl reward worker", "reward")
    args, log, stop, cfg = started.args, started.log, started.stop, started.cfg
    endpoints = hub_endpoints(started.run["endpoints"])
    peer = hub_peer(endpoints, args.name, timeout_s=10.0)  # loopback: a healthy hub answers in ms
    peer.give_up = stop.is_set
    scorer = Scorer(cfg.reward)
    worker = RewardWorker(peer, scorer, cfg.reward, args.name)
    log.info("reward worker %s serving %s with %s", args.name, ", ".join(endpoints), [c.name for c in cfg.reward.components])
    try:
        with fatal_to_hub(peer, "reward", args.name):
            asyncio.run(serve(worker, scorer, stop))
    finally:
        worker.close()
        peer.close()
        log.info("reward worker %s stopped: %d scored, %d failed", args.name, worker.scored, worker.failed)


if __name__ == "__main__":
    main()
