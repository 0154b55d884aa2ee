"""One prompt as a JSON object: the single format of task JSONL files, `asyncrl.cli submit` lines and the
dicts given to `Client.submit`.

    {"text": "12+34=" | "token_ids": [1, 5, 6],   exactly one of the two
     "target": "46",                              reference answer for the reward (optional)
     "n": 4,                                      samples of this prompt (optional)
     "params": {...},                             per-prompt reward parameters (RewardSpec.params)
     "sampling": {"temperature": 0.7, ...},       per-prompt overrides of the sampling parameters
     "metadata": {...},                           carried along untouched
     "prompt_id": "..."}                          client submissions only; task files number their lines

Older spellings are converted, with one deprecation warning per spelling: "prompt" -> "text",
"reward": {"target", "params"} -> "target" / "params". Any other key is refused with its name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from asyncrl.records import Prompt, RewardSpec, SamplingParams

log = logging.getLogger(__name__)

KEYS = ("text", "token_ids", "target", "n", "params", "sampling", "metadata", "prompt_id")
_SAMPLING_KEYS = {f.name for f in fields(SamplingParams)}
_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class PromptRow:
    text: str | None
    token_ids: tuple[int, ...] | None
    target: str | None
    n: int | None
    params: dict[str, Any]
    sampling: dict[str, Any]
    metadata: dict[str, Any]
    prompt_id: str | None = None

    def to_prompt(self, prompt_id: str, n: int, sampling: SamplingParams, metadata: dict[str, Any] | None = None) -> Prompt:
        """A Prompt with `n` samples unless the row names its own; the row's sampling overrides `sampling`."""
        base = {f.name: getattr(sampling, f.name) for f in fields(SamplingParams)}
        return Prompt(
            prompt_id=prompt_id, n=self.n or n, text=self.text,
            token_ids=None if self.token_ids is None else np.asarray(self.token_ids, dtype=np.int32),
            sampling=SamplingParams(**{**base, **self.sampling}),
            reward=RewardSpec(target=self.target, params=dict(self.params)),
            metadata={**self.metadata, **(metadata or {})},
        )


def parse_row(obj: Any, where: str) -> PromptRow:
    """Check one prompt object; every error is one ValueError that starts with `where`."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    obj = _upgrade(dict(obj), where)
    unknown = sorted(set(obj) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)} (put other data under \"metadata\")")
    text, ids = _prompt(obj, where)
    return PromptRow(text=text, token_ids=ids, target=_target(obj, where), n=_n(obj, where),
                     params=_object(obj, "params", where), sampling=_sampling(obj, where),
                     metadata=_object(obj, "metadata", where),
                     prompt_id=None if obj.get("prompt_id") is None else str(obj["prompt_id"]))


def _upgrade(obj: dict[str, Any], where: str) -> dict[str, Any]:
    if "prompt" in obj and "text" not in obj:
        _deprecated('"prompt"', '"text"')
        obj["text"] = obj.pop("prompt")
    if isinstance(obj.get("reward"), dict) and not set(obj["reward"]) - {"target", "params"}:
        _deprecated('"reward": {"target", "params"}', 'top-level "target" and "params"')
        reward = obj.pop("reward")
        for key in set(reward) & {"target", "params"}:
            if key in obj:
                raise ValueError(f'{where}: "{key}" given both at the top level and under "reward"; keep the top-level one')
            obj[key] = reward[key]
    return obj


def _deprecated(old: str, new: str) -> None:
    if old not in _warned:
        _warned.add(old)
        log.warning("prompt format: %s is deprecated, write %s (converted for now)", old, new)


def _prompt(obj: dict[str, Any], where: str) -> tuple[str | None, tuple[int, ...] | None]:
    text, ids = obj.get("text"), obj.get("token_ids")
    if (text is None) == (ids is None):
        raise ValueError(f'{where}: give exactly one of "text" or "token_ids"')
    if text is not None and not isinstance(text, str):
        raise ValueError(f'{where}: "text" must be a string')
    if ids is not None:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else ids
        if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise ValueError(f'{where}: "token_ids" must be a non-empty list of non-negative integers')
        ids = tuple(int(t) for t in ids)
    return text, ids


def _target(obj: dict[str, Any], where: str) -> str | None:
    target = obj.get("target")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (str, int, float))):
        raise ValueError(f'{where}: "target" must be a string or a number')
    return None if target is None else str(target)


def _n(obj: dict[str, Any], where: str) -> int | None:
    n = obj.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f'{where}: "n" must be an integer >= 1, got {n!r}')
    return n


def _object(obj: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = obj.get(key) or {}
    if not isinstance(value, dict):
        raise ValueError(f'{where}: "{key}" must be an object')
    return dict(value)


def _sampling(obj: dict[str, Any], where: str) -> dict[str, Any]:
    value = obj.get("sampling") or {}
    if isinstance(value, SamplingParams):
        return {f.name: getattr(value, f.name) for f in fields(SamplingParams)}
    value = _object({"sampling": value}, "sampling", where)
    unknown = sorted(set(value) - _SAMPLING_KEYS)
    if unknown:
        raise ValueError(f'{where}: "sampling" has unknown key {unknown[0]!r}; allowed: {", ".join(sorted(_SAMPLING_KEYS))}')
    return value
