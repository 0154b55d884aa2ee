"""MultiTurn through the GeneratorWorker with a scripted engine: token-exact episodes, masks, versions,
limits, and environments that raise, hang or return garbage failing only their own episode."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl import wire
from asyncrl.engine.protocol import EngineLimits, EngineStats, GenerationOutput
from asyncrl.generator.worker import GeneratorWorker
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.environment import Observation, Step
from asyncrl.rollout.multi_turn import MultiTurn
from tests.doubles.worker_fakes import FakeHub

EOS = 1


class CharTokenizer:
    """One token per character (ord); id 1 is the stop token and decodes to "" when skipped."""

    eos_token_id = EOS
    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if (skip_special_tokens and i == EOS) else chr(i) for i in ids)


class ScriptedEngine:
    """Each request's samples answer "a<k>" + stop, k = how many requests came before; every output and
    every request's context is kept, so a test can rebuild what the engine saw and sampled."""

    def __init__(self) -> None:
        self.weight_version = 0
        self.pending: list[tuple] = []
        self.requests: list = []
        self.outputs: list[GenerationOutput] = []

    def add(self, request):
        self.requests.append(request)
        self.pending += [(request, i) for i in range(request.n)]

    def has_work(self):
        return bool(self.pending)

    def limits(self):
        return EngineLimits(vocab_size=256, max_model_len=None)

    def step(self):
        out = []
        for request, i in self.pending:
            toks = [ord("a"), ord("0") + len(self.requests) % 10, EOS][: request.sampling.max_new_tokens]
            out.append(GenerationOutput(
                request_id=request.request_id, sample_index=i, token_ids=np.asarray(toks, np.int32),
                logprobs=np.full(len(toks), -0.25, np.float32), versions=np.full(len(toks), self.weight_version, np.int32),
                finish_reason=R.FinishReason.STOP if toks[-1] == EOS else R.FinishReason.LENGTH))
        self.pending = []
        self.outputs += out
        self.weight_version += 1  # a weight update between every two steps: versions move mid-episode
        return out

    def abort(self, ids=None):
        self.pending = [p for p in self.pending if ids is not None and p[0].request_id not in set(ids)]
        return []

    def stats(self):
        return EngineStats(running=len(self.pending), waiting=0, tokens_generated=0, weight_version=self.weight_version)


class Twice:
    """Asks "?" after the first turn, ends after the second with reward 1."""

    def reset(self, task):
        return None

    def step(self, action):
        if action.turn == 1:
            return Step(observation=Observation(text="?x"), reward=0.25)
        return Step(reward=1.0, done=True)


class Versions(Twice):
    """Twice, keeping the weight version each action says sampled its turn."""

    seen: list[tuple[int, int]] = []  # (turn, action.version)

    def step(self, action):
        Versions.seen.append((action.turn, action.version))
        return super().step(action)


class Never:
    def reset(self, task):
        return None

    def step(self, action):
        return Step(observation=Observation(token_ids=[50, 51]))


def run(env, n=2, prompts=1, **cfg) -> tuple[list[R.Sample], ScriptedEngine, GeneratorWorker]:
    engine = ScriptedEngine()
    hub = FakeHub([R.Prompt(prompt_id=f"p{k}", n=n, token_ids=np.arange(10, 14, dtype=np.int32),
                            sampling=R.SamplingParams(max_new_tokens=3)) for k in range(prompts)])
    rollout = MultiTurn(RolloutConfig(environment="x:y", step_timeout_s=cfg.pop("timeout", 5.0), **cfg),
                        env, CharTokenizer(), 256)
    worker = GeneratorWorker(name="g", engine=engine, hub=hub, tokenizer=CharTokenizer(), max_running=64,
                             rollout=rollout)
    deadline = time.monotonic() + 10
    while sum(len(b.samples) for b in hub.sent) < n * prompts and time.monotonic() < deadline:
        worker.run_once()
    rollout.close()
    return [s for b in hub.sent for s in b.samples], engine, worker


def test_episode_tokens_are_exactly_what_the_engine_sampled_and_the_environment_appended():
    samples, engine, _ = run(Twice, n=2)
    assert len(samples) == 2
    first = engine.requests[0]
    assert first.n == 2  # no reset observation: the first turn shares one prefill
    for s in samples:
        turns = [o for o in engine.outputs if o.request_id == first.request_id and o.sample_index == s.sample_index]
        turns += [o for o in engine.outputs if o.request_id.endswith(f"s{s.sample_index}")]
        env = np.asarray([ord("?"), ord("x")], np.int32)
        expect = np.concatenate([turns[0].token_ids, env, turns[1].token_ids])
        assert np.array_equal(s.response_token_ids, expect)
        assert np.array_equal(s.loss_mask, np.r_[np.ones(3), np.zeros(2), np.ones(3)].astype(np.int32))
        # the second turn continued from the exact ids: prompt + turn 1 + the environment's tokens
        second = next(r for r in engine.requests if r.request_id == turns[1].request_id)
        assert np.array_equal(second.prompt_token_ids, np.concatenate([s.prompt_token_ids, expect[:5]]))
        assert np.array_equal(s.logprobs[s.loss_mask == 1], np.full(6, -0.25, np.float32))
        assert not s.logprobs[s.loss_mask == 0].any()
        # per-token versions: each model token its own step's version; environment tokens the version then
        assert s.versions[0] == turns[0].versions[0] and s.versions[5] == turns[1].versions[0] > s.versions[0]
        assert s.env_reward == 1.25 and list(s.turn_rewards) == [0.25, 1.0] and s.rollout["turns"] == 2
        assert s.finish_reason == R.FinishReason.STOP and s.env_error == ""


def test_max_turns_ends_the_episode_with_length():
    samples, _, _ = run(Never, n=1, max_turns=3, max_total_tokens=20)
    (s,) = samples
    assert s.rollout["turns"] == 3 and s.finish_reason == R.FinishReason.LENGTH
    assert int(s.loss_mask.sum()) == 9 and len(s.response_token_ids) == 9 + 2 * 2


def test_max_total_tokens_caps_the_episode():
    samples, _, _ = run(Never, n=1, max_turns=10, max_total_tokens=12)
    (s,) = samples
    assert len(s.response_token_ids) <= 12 and s.finish_reason == R.FinishReason.LENGTH


class Raises(Twice):
    def step(self, action):
        raise RuntimeError("tool crashed")


class HangsAsync(Twice):
    async def step(self, action):
        await asyncio.sleep(30)


class HangsSync(Twice):
    def step(self, action):
        time.sleep(2)


class Garbage(Twice):
    def step(self, action):
        return 42


class BadObservation(Twice):
    def step(self, action):
        return Step(observation=Observation(token_ids=[999]))


class EmptyObservation(Twice):
    """Would merge two model turns into one run of the mask, leaving more turn rewards than turns."""

    def step(self, action):
        return Step(observation=Observation(token_ids=[]), reward=0.5)


@pytest.mark.parametrize("env, reason", [(Raises, "raised"), (HangsAsync, "timeout"), (HangsSync, "timeout"),
                                         (Garbage, "invalid"), (BadObservation, "invalid"),
                                         (EmptyObservation, "invalid")])
def test_a_failing_environment_fails_only_its_episode(env, reason):
    samples, _, worker = run(env, n=2, timeout=0.3)
    wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=samples)))  # a failed episode still travels
    assert len(samples) == 2 and all(s.finish_reason == R.FinishReason.ENV_ERROR for s in samples)
    assert all(s.env_error.startswith(reason + ":") and s.env_reward is None for s in samples)
    assert worker.rollout.stats()[f"episode_failed_{reason}"] == 2


class FailsOne(Twice):
    def __init__(self):
        self.calls = 0

    def reset(self, task):
        if task.sample_index == 1:
            raise ValueError("no sandbox")
        return None


def test_one_broken_episode_leaves_its_group_mates_alone():
    samples, engine, _ = run(FailsOne, n=3)
    by_index = {s.sample_index: s for s in samples}
    assert by_index[1].finish_reason == R.FinishReason.ENV_ERROR and "no sandbox" in by_index[1].env_error
    assert all(by_index[i].env_reward == 1.25 for i in (0, 2))
    assert all(r.n == 1 for r in engine.requests)  # a failed reset: each live episode gets its own request


class Builds:
    def __init__(self, bad: int):
        raise TypeError("unexpected option")

    reset = step = Twice.step


def test_an_environment_that_cannot_be_built_fails_its_episodes():
    samples, _, _ = run(Builds, n=2)
    assert all("building the environment raised TypeError" in s.env_error for s in samples)


def test_the_learner_trains_on_exactly_the_sampled_and_appended_ids():
    """Worker -> the wire (as the hub forwards it, spliced bytes) -> the learner's packed micro-batch."""
    from asyncrl.learner.batch_tensors import build_micro_batch, flatten_batch

    samples, engine, _ = run(Twice, n=2)
    packed = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=samples))).samples
    prompt = R.Prompt(prompt_id="p0", n=2, token_ids=samples[0].prompt_token_ids)
    batch = R.Batch(step=1, policy_version=1, groups=[R.Group(prompt=prompt, samples=[
        R.ScoredSample(sample=p.unpack(), reward=1.0) for p in packed])])
    batch = wire.decode(wire.encode(batch))
    seqs, skipped = flatten_batch(batch)
    mb = build_micro_batch(seqs)
    assert skipped == 0
    for s, seq in zip(samples, seqs):
        assert np.array_equal(seq.response, s.response_token_ids) and np.array_equal(seq.prompt, s.prompt_token_ids)
    want = np.concatenate([x for s in samples for x in (s.prompt_token_ids, s.response_token_ids[:-1])])
    assert np.array_equal(mb.input_ids[0].numpy(), want)  # bit for bit what the engine saw and sampled
    assert np.array_equal(mb.targets.numpy(), np.concatenate([s.response_token_ids for s in samples]))
    assert np.array_equal(mb.mask.numpy(), np.concatenate([s.loss_mask for s in samples]).astype(np.float32))
    sampled = np.concatenate([o.token_ids for o in engine.outputs])
    assert sorted(mb.targets.numpy()[mb.mask.numpy() == 1].tolist()) == sorted(sampled.tolist())


def test_episodes_default_to_two_a_row_with_an_environment():
    assert RolloutConfig().episodes(64) == 64  # single-turn: one sample a row
    assert RolloutConfig(environment="m:C").episodes(64) == 128  # episodes waiting on tools leave rows to others
    assert RolloutConfig(environment="m:C", max_episodes=80).episodes(64) == 80


def test_an_action_carries_the_weight_version_that_sampled_its_turn():
    Versions.seen = []
    samples, engine, _ = run(Versions, n=1)
    assert len(samples) == 1
    first, second = (o for o in engine.outputs)
    assert Versions.seen == [(1, int(first.versions[0])), (2, int(second.versions[0]))]
    assert Versions.seen[1][1] > Versions.seen[0][1]  # an update landed between the turns
