"""Small fakes for multi-turn rollout tests: an environment that answers with the same token ids for a fixed
number of turns, and a tokenizer that decodes ids as their numbers."""

from __future__ import annotations

from asyncrl.rollout.environment import Observation, Step

TURNS, ENV_IDS = 3, [3, 4, 5]


class Again:
    """TURNS turns: each model turn but the last gets ENV_IDS back; the last ends the episode with reward 1."""

    def reset(self, task):
        return None

    def step(self, action):
        if action.turn < TURNS:
            return Step(observation=Observation(token_ids=ENV_IDS))
        return Step(reward=1.0, done=True)


class IdTokenizer:
    eos_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))
