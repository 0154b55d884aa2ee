"""The process pool: a hung or dying CPU-heavy function fails its sample without wedging the worker."""

import asyncio

import reward_fns
from asyncrl.records import ScoreStatus
from asyncrl.reward.offload import Offload
from asyncrl.reward.scorer import Scorer
from reward_helpers import config, fn, item, spec


def test_hung_task_is_killed_the_pool_recreated_and_victims_retried():
    async def go():
        offload = Offload(processes=2)
        try:
            await offload.run(reward_fns.sleep_then_one, 0.0, heavy=True)  # start the pool processes
            victim = asyncio.create_task(offload.run(reward_fns.sleep_then_one, 1.0, heavy=True))
            try:
                await asyncio.wait_for(offload.run(reward_fns.sleep_forever, heavy=True), 0.5)
                raise AssertionError("should have timed out")
            except TimeoutError:
                pass
            assert offload.pool_restarts == 1
            assert await victim == 1.0  # killed with the pool, retried on the new one
            assert await offload.run(reward_fns.sleep_then_one, 0.0, heavy=True) == 1.0
        finally:
            offload.close()
    asyncio.run(go())


def test_hung_function_through_the_scorer_fails_only_its_sample():
    async def go():
        cfg = config({"kind": "python", "name": "hang", "options": {"function": fn("hangs"), "cpu_heavy": True}},
                     {"kind": "task", "weight": 2.0}, timeout_s=1.0)
        scorer = Scorer(cfg)
        try:
            out = await scorer.score(item("85", spec("85")))
            assert out.status is ScoreStatus.FAILED and out.reason.startswith("hang: timed out")
            assert out.components == {"task": 1.0} and out.reward == 0.0
        finally:
            await scorer.close()
    asyncio.run(go())


def test_dying_process_fails_only_its_sample():
    async def go():
        scorer = Scorer(config({"kind": "python", "options": {"function": fn("dies"), "cpu_heavy": True}}, timeout_s=5.0))
        try:
            out = await scorer.score(item("x", spec()))
            assert out.status is ScoreStatus.FAILED and "process died" in out.reason
            assert scorer.offload.pool_restarts == 1
        finally:
            await scorer.close()
    asyncio.run(go())
