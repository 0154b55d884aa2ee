"""Reference answers of submitted prompts: which reward kinds need one, and filling it in where the run's
reward can compute it itself (the arithmetic task's verifier knows the answer of its own problems).

`Client.submit` calls `complete_reference` on every prompt before it reaches the hub, so a prompt that
cannot be scored is refused there with one line saying what to pass, instead of failing every sample in
the reward worker later.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from asyncrl.records import Prompt
from asyncrl.task.arithmetic import solve

# Kinds that read RewardSpec.target (regex, python, http and classifier score without one).
NEEDS_TARGET = frozenset({"exact_match", "math", "task"})


@dataclasses.dataclass(frozen=True, slots=True)
class RewardComponentRef:
    name: str
    kind: str


def run_reward_components(run_dir: str | Path) -> list[RewardComponentRef] | None:
    """The reward components of a run, from RUN_DIR/config.json; None when the file is not there."""
    path = Path(run_dir) / "config.json"
    if not path.exists():
        return None
    comps = json.loads(path.read_text()).get("reward", {}).get("components", [])
    return [RewardComponentRef(name=str(c.get("name") or c["kind"]), kind=str(c["kind"])) for c in comps]


def complete_reference(prompt: Prompt, components: list[RewardComponentRef] | None, index: int) -> Prompt:
    """`prompt` with a reference answer filled in when it has none and the task can compute it.

    components None (unknown run): derive what can be derived and let the rest through.
    Raises ValueError (one line) when a component needs a target nobody can give."""
    if prompt.reward.target is not None:
        return prompt
    answer = solve(prompt.text) if prompt.text is not None else None
    uses_task = components is None or any(c.kind == "task" for c in components)
    if answer is not None and uses_task:
        return dataclasses.replace(prompt, reward=dataclasses.replace(prompt.reward, target=answer))
    needy = next((c for c in components or [] if c.kind in NEEDS_TARGET), None)
    if needy is None:
        return prompt
    shown = prompt.text if prompt.text is not None else f"{len(prompt.token_ids)} token ids"  # type: ignore[arg-type]
    raise ValueError(f"submit: prompt {index} ({shown!r:.60}) has no reference answer and reward component "
                     f"{needy.name!r} ({needy.kind}) needs one: pass target=\"...\" to submit, or \"target\" in the prompt's dict")
