"""Which generated samples are out with reward workers (`ScoreDispatch`). Soft state, never logged.

    add_samples ──► fresh ──take──► out (deadline) ──score──► (gone)
                      ▲                  │
                      └── deadline passed, still unscored (dead reward worker)

A sample stays `generated` in `HubState` while a worker scores it; if no score arrives within
`ttl_s` it is offered again. After a hub restart every generated sample is fresh again; a late score
of a sample that is no longer `generated` is rejected by `HubState.score`, so nothing is scored twice.
"""

from __future__ import annotations

from collections import deque

from asyncrl.records import ToScoreItem
from asyncrl.replay.state import HubState

Key = tuple[str, int]  # (prompt_id, sample_index)


class ScoreDispatch:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.fresh: deque[Key] = deque()
        self.out: deque[tuple[float, Key]] = deque()  # (deadline, key), deadlines non-decreasing

    def add(self, keys: list[Key]) -> None:
        self.fresh.extend(keys)

    def take(self, state: HubState, max_samples: int, now: float) -> list[ToScoreItem]:
        """Up to `max_samples` items: each sample's id and response text (its arrays stay in the hub)."""
        self._recycle(state, now)
        items: list[ToScoreItem] = []
        while self.fresh and len(items) < max_samples:
            key = self.fresh.popleft()
            g = state.sample(*key)
            if g is None:  # scored meanwhile (late worker) or no longer live
                continue
            sample = g.samples[key[1]]
            assert sample is not None, f"{key} is generated without its sample"
            text, finish, env_reward, env_error = sample.take_scoring()
            items.append(ToScoreItem(prompt_id=key[0], sample_index=key[1], response_text=text,
                                     reward=g.prompt.reward, finish_reason=finish,
                                     env_reward=env_reward, env_error=env_error))
            self.out.append((now + self.ttl_s, key))
        return items

    def _recycle(self, state: HubState, now: float) -> None:
        overdue: list[Key] = []
        while self.out and self.out[0][0] <= now:
            key = self.out.popleft()[1]
            if state.sample(*key) is not None:
                overdue.append(key)
        self.fresh.extendleft(reversed(overdue))

    def __len__(self) -> int:
        return len(self.fresh) + len(self.out)
