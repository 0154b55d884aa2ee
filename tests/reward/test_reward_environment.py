"""Multi-turn samples at the reward worker: a failed environment fails the sample before any reward function
runs, and the `environment` kind scores the environment's own episode reward."""

import asyncio
import dataclasses

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl import wire
from asyncrl.records import FinishReason, RewardSpec, ScoreStatus
from asyncrl.reward.config import KINDS, RewardComponentConfig
from asyncrl.reward.environment import EnvironmentReward
from asyncrl.reward.protocol import Episode, EpisodeRewardFn, RewardFn
from asyncrl.reward.scorer import Scorer, episode_of
from reward_helpers import config, fn, item, run_worker


@dataclasses.dataclass(kw_only=True, slots=True)
class EpisodeItem:
    """A ToScoreItem with what the sample's rollout reported (the fields the hub adds from PackedSample's
    finish_reason / env_reward / env_error; see test_to_score_items_carry_the_episode below)."""

    prompt_id: str = "p0"
    sample_index: int = 0
    response_text: str = ""
    reward: RewardSpec = dataclasses.field(default_factory=RewardSpec)
    finish_reason: FinishReason = FinishReason.STOP
    env_reward: float | None = None
    env_error: str = ""


def score(cfg, it):
    async def go():
        scorer = Scorer(cfg)
        try:
            return await scorer.score(it)
        finally:
            await scorer.close()
    return asyncio.run(go())


def test_environment_is_a_kind_and_implements_the_episode_protocol():
    assert "environment" in KINDS
    impl = EnvironmentReward({})
    assert isinstance(impl, EpisodeRewardFn) and not isinstance(impl, RewardFn)
    with pytest.raises(ValueError, match="environment reward takes no options"):
        Scorer(config({"kind": "environment", "options": {"scale": 2}}))
    assert RewardComponentConfig(kind="environment").name == "environment"


def test_env_error_fails_the_sample_without_calling_any_reward_function():
    cfg = config({"kind": "task"}, {"kind": "python", "name": "never", "options": {"function": fn("raises")}},
                 {"kind": "environment"})
    out = score(cfg, EpisodeItem(response_text="85", reward=RewardSpec(target="85"), finish_reason=FinishReason.ENV_ERROR,
                                 env_error="raised: step raised TimeoutError: tool took 30 s"))
    assert out.status is ScoreStatus.FAILED and out.reward == 0.0 and out.components == {}
    assert out.reason == "environment: raised: step raised TimeoutError: tool took 30 s"
    assert (out.prompt_id, out.sample_index) == ("p0", 0)
    blank = score(cfg, EpisodeItem(finish_reason=FinishReason.ENV_ERROR))
    assert blank.status is ScoreStatus.FAILED and blank.reason == "environment: no reason given"


@pytest.mark.parametrize("env_reward", [1.5, 0.0, -2.0])
def test_environment_kind_scores_the_episode_reward_weighted_with_text_kinds(env_reward):
    cfg = config({"kind": "environment", "weight": 2.0}, {"kind": "task", "weight": 0.5})
    out = score(cfg, EpisodeItem(response_text="85", reward=RewardSpec(target="85"), env_reward=env_reward))
    assert out.status is ScoreStatus.OK and out.components == {"environment": env_reward, "task": 1.0}
    assert out.reward == pytest.approx(2.0 * env_reward + 0.5)


def test_environment_kind_fails_a_sample_without_env_reward_with_the_reason():
    cfg = config({"kind": "environment"}, {"kind": "task"})
    for it in (EpisodeItem(response_text="85", reward=RewardSpec(target="85")), item("85", RewardSpec(target="85"))):
        out = score(cfg, it)
        assert out.status is ScoreStatus.FAILED and out.reward == 0.0 and out.components == {"task": 1.0}
        assert out.reason.startswith("environment: the sample has no env_reward: it did not come from an environment")


def test_text_kinds_score_as_before_whatever_the_episode():
    cfg = config({"kind": "task"})
    for it in (item("85", RewardSpec(target="85")), EpisodeItem(response_text="85", reward=RewardSpec(target="85"),
                                                               finish_reason=FinishReason.LENGTH, env_reward=9.0)):
        out = score(cfg, it)
        assert out.status is ScoreStatus.OK and out.reward == 1.0 and out.components == {"task": 1.0}
    assert episode_of(item("x")) == Episode()  # a ToScoreItem without the episode fields: single-turn


class OnePeer:
    """Hands out `items` once, takes the scores, then asks for shutdown."""

    def __init__(self, items):
        self.items, self.scored = list(items), []

    def request(self, msg):
        if isinstance(msg, R.ScoreRequest):
            take, self.items = self.items[: msg.max_samples], self.items[msg.max_samples:]
            return R.ToScore(items=take)
        if isinstance(msg, R.ScoredIds):
            self.scored.extend(msg.scores)
            return R.Ack()
        return R.Ack(info={"shutdown": not self.items and len(self.scored) == 3, "policy_version": 0})


def test_the_worker_sends_env_errors_back_failed_and_counts_them():
    cfg = config({"kind": "environment"}, heartbeat_s=0.05)
    peer = OnePeer([EpisodeItem(sample_index=0, env_reward=1.0),
                    EpisodeItem(sample_index=1, finish_reason=FinishReason.ENV_ERROR, env_error="invalid: bad observation"),
                    EpisodeItem(sample_index=2)])

    worker = run_worker(cfg, peer)
    got = {s.sample_index: s for s in peer.scored}
    assert got[0].status is ScoreStatus.OK and got[0].reward == 1.0
    assert got[1].status is ScoreStatus.FAILED and got[1].reason == "environment: invalid: bad observation"
    assert got[2].status is ScoreStatus.FAILED and "no env_reward" in got[2].reason
    assert worker.scored == 3 and worker.failed == 2


def test_to_score_items_carry_the_episode():
    from asyncrl.replay.scoring import ScoreDispatch
    from asyncrl.replay.state import HubState

    s = R.Sample(prompt_id="a", sample_index=0, prompt_token_ids=np.arange(2, dtype=np.int32),
                 response_token_ids=np.arange(3, dtype=np.int32), logprobs=np.zeros(3, np.float32),
                 versions=np.zeros(3, np.int32), finish_reason=FinishReason.ENV_ERROR, env_error="raised: x",
                 loss_mask=np.array([1, 0, 1], np.int32))
    state = HubState()
    state.submit([R.Prompt(prompt_id="a", n=1, text="q")])
    entry, _ = state.grant("g", 1, now=0.0, ttl_s=60.0)
    state.add_samples(entry.lease_id, wire.decode_packed(wire.encode(R.SampleBatch(lease_id="", samples=[s]))).samples)
    dispatch = ScoreDispatch(ttl_s=60.0)
    dispatch.add([("a", 0)])
    (it,) = dispatch.take(state, 1, now=0.0)
    assert (it.finish_reason, it.env_reward, it.env_error) == (FinishReason.ENV_ERROR, None, "raised: x")
    assert wire.decode(wire.encode(R.ToScore(items=[it]))).items[0] == it
    assert episode_of(it) == Episode(finish_reason=FinishReason.ENV_ERROR, env_error="raised: x")
