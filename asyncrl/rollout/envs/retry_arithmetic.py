"""`RetryArithmetic`: the embedded arithmetic task with retries, the multi-turn environment that learns on CPU.

    "<bos>37+48="  model: "84<eos>"  env: " 37+48="  model: "85<eos>"  -> reward discount ** 1

A right answer ends the episode with reward `discount ** (turn - 1)`; a wrong one gets the problem again
(text level: the model's own tokenizer encodes it) until generator.rollout.max_turns. The answer is the
turn's text up to the first space, as the embedded task's verifier reads it.
"""

from __future__ import annotations

from asyncrl.rollout.environment import Action, Observation, Step, Task


class RetryArithmetic:
    def __init__(self, discount: float = 0.5) -> None:
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"generator.rollout.options.discount={discount}: must be in (0, 1]")
        self.discount = discount
        self.problem = self.target = ""

    def reset(self, task: Task) -> None:
        if not task.text or task.target is None:
            raise ValueError("RetryArithmetic needs text prompts with a target (task.name = arithmetic)")
        self.problem, self.target = task.text, task.target.strip()
        return None

    def step(self, action: Action) -> Step:
        answer = action.text.strip().split(" ")[0] if action.text.strip() else ""
        if answer == self.target:
            return Step(reward=self.discount ** (action.turn - 1), done=True)
        return Step(observation=Observation(text=" " + self.problem))
