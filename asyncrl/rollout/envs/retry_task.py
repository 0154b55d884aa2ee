"""`RetryTask`: any task with a checkable answer (reasoning-gym, arithmetic) with feedback and retries.

A turn's answer is scored by the strict check of asyncrl.reward.strict against the task's answer; right
ends the episode with reward `discount ** (turn - 1)`, wrong gets `feedback` back as a user message and
another try, until generator.rollout.max_turns (then reward 0).
"""

from __future__ import annotations

from asyncrl.records import RewardSpec
from asyncrl.reward.strict import strict_score
from asyncrl.rollout.environment import Action, Observation, Step, Task


class RetryTask:
    def __init__(self, discount: float = 0.5, feedback: str = "That is not correct. Try again.") -> None:
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"generator.rollout.options.discount={discount}: must be in (0, 1]")
        self.discount, self.feedback = discount, feedback
        self.spec = RewardSpec()

    def reset(self, task: Task) -> None:
        if task.target is None:
            raise ValueError("RetryTask needs prompts with a target answer (reward spec)")
        self.spec = RewardSpec(target=task.target, params=dict(task.params))
        return None

    def step(self, action: Action) -> Step:
        if strict_score(action.text, self.spec) >= 1.0:
            return Step(reward=self.discount ** (action.turn - 1), done=True)
        return Step(observation=Observation(message={"role": "user", "content": self.feedback}))
