"""`LocalHub`: the part of the hub a generator talks to, in process, for running the generator's own loop
(`GeneratorWorker.run_once`) over a fixed list of prompts without a run: `python -m asyncrl.eval` and
`bench.agentic`. It leases the prompts once, keeps the samples that come back, and records the prompts the
generator could not take, with why. One thread; no weights, no staleness (policy version 0 throughout).
"""

from __future__ import annotations

from typing import Any

from asyncrl import records as R


class LocalHub:
    timeout_s = 30.0  # the worker lowers it at shutdown, as it does a real hub's

    def __init__(self, prompts: list[R.Prompt]) -> None:
        self.by_id = {p.prompt_id: p for p in prompts}
        self.expected = sum(p.n for p in prompts)  # samples the prompts ask for
        self.queue = list(prompts)
        self.samples: list[R.Sample] = []
        self.failed: dict[str, str] = {}  # prompt id -> the generator's reason

    def left(self) -> int:
        """Samples neither back nor given up on."""
        return self.expected - len(self.samples) - sum(self.by_id[pid].n for pid in self.failed)

    def request(self, msg: Any) -> Any:
        if isinstance(msg, R.LeaseRequest):
            take, self.queue = self.queue[: msg.max_prompts], self.queue[msg.max_prompts:]
            return R.Lease(lease_id="local", prompts=take, policy_version=0, expires_in_s=3600.0)
        if isinstance(msg, R.SampleBatch):
            self.samples += msg.samples
        elif isinstance(msg, R.ReturnPrompts):
            for pid in msg.prompt_ids:
                if msg.reason:
                    self.failed[pid] = msg.reason
                else:  # handed back unfinished: lease it again
                    self.queue.append(self.by_id[pid])
        return R.Ack(info={"policy_version": 0})
