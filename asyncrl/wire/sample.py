"""The Sample record on the wire: its straight-line check and `PackedSample`, a Sample kept as its bytes.

`Sample` carries the volume, so it is checked field by field without the per-field dispatch of
`asyncrl.wire.schema`, to the same rules. The hub never needs a sample's arrays: it decodes with
`decode_packed` and keeps each sample as a `PackedSample`, its exact msgpack bytes plus the few fields
the hub reads, validated as fully as `decode` does. `asyncrl.wire.encode` splices those bytes into
the frames that carry them (Batch, Completion): never decoded or encoded again. Reward workers get only
what scoring reads (`PackedSample.take_scoring`: response_text, finish_reason, env_reward, env_error, kept from
the arrival's decoding until they are handed out, then read from the bytes again if ever needed, without
building the arrays).

The multi-turn fields (`EPISODE_FIELDS`: loss_mask, turn_rewards, env_reward, env_error, rollout) travel
only when they differ from their defaults, so a single-turn Sample's bytes are what they were before
those fields existed, and a frame without them (an old journal) decodes to the defaults.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
import numpy as np

from asyncrl import records as R
from asyncrl.wire.arrays import (ARRAY_EXT, DTYPES, F4, I4, RUNS_EXT, VECTOR_HEADER, Runs, as_numpy, int_runs,
                                  int_vector, runs_min, runs_ok, vector)
from asyncrl.wire.checks import Where, WireError, dict_of, fail, path, scalar
from asyncrl.wire.frames import unpackb

_FIELDS = frozenset(f.name for f in dataclasses.fields(R.Sample))
_FINISH = {e.value: e for e in R.FinishReason}
_TIMINGS = dict_of(scalar(str), scalar(float))
_FLOAT = scalar(float)
# Multi-turn fields and the defaults they are left out at (records.Sample's defaults).
EPISODE_FIELDS: dict[str, Any] = {"loss_mask": None, "turn_rewards": None, "env_reward": None, "env_error": "",
                                  "rollout": {}}
_BASE_FIELDS = tuple(f.name for f in dataclasses.fields(R.Sample) if f.name not in EPISODE_FIELDS)
_BASE_KEYS = frozenset(_BASE_FIELDS)
_REQUIRED = frozenset(f.name for f in dataclasses.fields(R.Sample)
                      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
Scoring = tuple[str, R.FinishReason, float | None, str]  # response_text, finish_reason, env_reward, env_error
MAX_ENV_ERROR_CHARS = 2048  # longest env_error a peer may send (the generator clips its reasons below this)


@dataclasses.dataclass(slots=True)
class PackedSample:
    """A validated Sample kept as its exact msgpack bytes: what the hub stores, logs and forwards.

    `wire.encode` splices `raw` in wherever a Sample goes; `unpack()` builds the full record."""

    prompt_id: str
    sample_index: int
    min_version: int | None  # oldest policy version among its tokens; None for an empty response
    raw: bytes | memoryview  # the Sample's msgpack map, as it arrived
    finite: bool = True  # every logprob is finite (the hub fails a sample that is not)
    # What a reward worker reads, as decoded on arrival, kept only until `take_scoring` (None: read `raw`).
    scoring: Scoring | None = dataclasses.field(default=None, compare=False, repr=False)
    # Where `raw` starts in the frame `decode_packed` read it from (-1: not read from a frame).
    offset: int = dataclasses.field(default=-1, compare=False, repr=False)
    # Where the hub's journal holds `raw` on disk, set by `asyncrl.replay.journal` once it logged the frame:
    # (segment, byte offset of the log record, offset of `raw` in that record's payload). None: not logged.
    stored: tuple[int, int, int] | None = dataclasses.field(default=None, compare=False, repr=False)

    def unpack(self) -> R.Sample:
        return check_sample(unpackb(self.raw), "Sample")

    def take_scoring(self) -> Scoring:
        """(response_text, finish_reason, env_reward, env_error): the decoder's copy, released here (a sample
        offered again reads them from `raw`), else read from `raw` in one pass."""
        got, self.scoring = self.scoring, None
        if got is not None:
            return got
        values = self._scalars(("response_text", "finish_reason", "env_reward", "env_error"))
        env_reward = values.get("env_reward")
        return (values.get("response_text", ""), _FINISH[values.get("finish_reason", "")],
                None if env_reward is None else float(env_reward), values.get("env_error", ""))

    @property
    def response_text(self) -> str:
        """The sample's response text, read from `raw` (validated on arrival) skipping every other value."""
        return self._scalar("response_text", "")

    @property
    def finish_reason(self) -> R.FinishReason:
        return _FINISH[self._scalar("finish_reason", "")]

    @property
    def env_reward(self) -> float | None:
        """The environment's episode reward (None: no environment, or it gave none)."""
        value = self._scalar("env_reward", None)
        return None if value is None else float(value)

    @property
    def env_error(self) -> str:
        """Why the environment failed the episode ("": it did not)."""
        return self._scalar("env_error", "")

    def _scalar(self, name: str, default: Any) -> Any:
        """The value of key `name` in `raw`, skipping every other value unbuilt; `default` when absent."""
        return self._scalars((name,)).get(name, default)

    def _scalars(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The values of the keys `names` present in `raw`, in one pass, every other value skipped unbuilt."""
        u = msgpack.Unpacker(raw=False)
        u.feed(self.raw)
        out: dict[str, Any] = {}
        for _ in range(u.read_map_header()):
            key = u.unpack()
            if key in names:
                out[key] = u.unpack()
                if len(out) == len(names):
                    break
            else:
                u.skip()
        return out


def sample_body(s: R.Sample) -> dict[str, Any]:
    """A Sample -> the map that encodes it: every base field (versions as runs where smaller: `int_runs`), the
    multi-turn fields only when set."""
    body = {n: getattr(s, n) for n in _BASE_FIELDS}
    versions = s.versions
    if type(versions) is np.ndarray and versions.dtype == DTYPES[I4] and versions.ndim == 1:
        body["versions"] = int_runs(versions) or versions
    for name, default in EPISODE_FIELDS.items():
        value = getattr(s, name)
        if value is not None and (default is None or value != default):
            body[name] = value
    return body


def check_sample(v: Any, where: Where) -> R.Sample:
    """One unpacked Sample map -> the record (arrays are views of the frame)."""
    plain = _plain_parts(v)
    pid, idx, finish, prompt, resp, logp, vers, text, timings, gen = plain or _parts(v, where)
    return R.Sample(prompt_id=pid, sample_index=idx, finish_reason=finish, prompt_token_ids=as_numpy(prompt, I4),
                    response_token_ids=as_numpy(resp, I4), logprobs=as_numpy(logp, F4),
                    versions=as_numpy(vers, I4), response_text=text, timings=timings, generator=gen,
                    **({} if plain else _episode(v, finish, resp[1], where)))


def pack_sample(v: Any, raw: memoryview, where: Where) -> PackedSample:
    """One unpacked Sample map and its bytes `raw` -> a PackedSample, checked as `check_sample` checks."""
    return pack_samples([v], [raw], where, lambda where, i: where)[0]


def pack_samples(values: list[Any], raws: list[memoryview], where: Where,
                 item: Any = lambda where, i: (where, i)) -> list[PackedSample]:
    """`pack_sample` of each (map, bytes) pair, checked in order; the per-token work (oldest version, finite
    logprobs) runs once over the whole list instead of four numpy calls per sample. A plain single-turn
    sample is checked by `_plain_parts` (straight-line); any other, or one it doubts, by `_parts` and
    `_episode`, which accept or word the error."""
    checked = []
    for i, v in enumerate(values):
        plain = _plain_parts(v)
        if plain is not None:
            pid, idx, finish, _, _, logp, vers, text, _, _ = plain
            checked.append((pid, idx, vers, logp, (text, finish, None, "")))
            continue
        at = item(where, i)
        pid, idx, finish, _, resp, logp, vers, text, _, _ = _parts(v, at)
        episode = _episode(v, finish, resp[1], at)
        checked.append((pid, idx, vers, logp, (text, finish, episode.get("env_reward"), episode["env_error"])))
    oldest, finite = _token_checks([c[2] for c in checked], [c[3] for c in checked])
    return [PackedSample(prompt_id=pid, sample_index=idx, min_version=old, raw=raw, finite=fin, scoring=scoring)
            for (pid, idx, _, _, scoring), raw, old, fin in zip(checked, raws, oldest, finite)]


def _plain_parts(v: Any) -> tuple[Any, ...] | None:
    """A single-turn Sample map (base fields only) that passes every check of `_parts` -> what `_parts`
    returns for it; None for anything else (a multi-turn sample, a bad one: `_parts` decides). The hot path
    of the hub and of every peer that decodes samples: one pass, no where-paths, no conversions."""
    if type(v) is not dict or not _REQUIRED <= v.keys() <= _BASE_KEYS:
        return None
    pid, idx, finish = v["prompt_id"], v["sample_index"], v["finish_reason"]
    if type(pid) is not str or type(idx) is not int or idx < 0 or type(finish) is not str:
        return None
    finish = _FINISH.get(finish)
    text, gen = v.get("response_text", ""), v.get("generator", "")
    timings = v["timings"] if "timings" in v else {}  # a new map: it becomes the record's
    if finish is None or type(text) is not str or type(gen) is not str or type(timings) is not dict:
        return None
    for k, x in timings.items():
        if type(k) is not str or type(x) is not float:
            return None  # an int is a float to `_TIMINGS`: `_parts` converts it
    prompt, resp, logp, vers = v["prompt_token_ids"], v["response_token_ids"], v["logprobs"], v["versions"]
    if not (type(prompt) is type(resp) is type(logp) is type(vers) is slice
            and prompt.start == resp.start == logp.start == ARRAY_EXT):
        return None
    p, r, lp, vs = prompt.stop, resp.stop, logp.stop, vers.stop
    if len(p) < VECTOR_HEADER or len(r) < VECTOR_HEADER or len(lp) != len(r):
        return None
    n = (len(r) - VECTOR_HEADER) >> 2  # headers: dtype code, ndim 1, u32 length; then exactly 4 x length bytes
    if (p[0] != I4 or p[1] != 1 or len(p) != VECTOR_HEADER + 4 * int.from_bytes(p[2:6], "little")
            or r[0] != I4 or r[1] != 1 or lp[0] != F4 or lp[1] != 1
            or len(r) != VECTOR_HEADER + 4 * n or int.from_bytes(r[2:6], "little") != n or r[2:6] != lp[2:6]):
        return None
    if vers.start == RUNS_EXT:  # the usual form: runs of one version
        if not (runs_ok(vs) and int.from_bytes(vs[:4], "little") == n):
            return None
        vs = Runs(vs)
    elif not (vers.start == ARRAY_EXT and len(vs) == len(r) and vs[0] == I4 and vs[1] == 1 and vs[2:6] == r[2:6]):
        return None
    return pid, idx, finish, (p, (len(p) - VECTOR_HEADER) >> 2), (r, n), (lp, n), (vs, n), text, timings, gen


def _token_checks(versions: list[tuple[bytes, int]], logprobs: list[tuple[bytes, int]]) -> tuple[list, list]:
    """Per sample: its oldest version (None for an empty response) and whether every logprob is finite, from
    the `vector`s of each; the arrays of all non-empty samples are joined and reduced at once."""
    lengths = [n for _, n in versions]  # == the logprob counts (`_parts` checked)
    full = [i for i, n in enumerate(lengths) if n]
    oldest: list[int | None] = [None] * len(lengths)
    finite = [True] * len(lengths)
    if not full:
        return oldest, finite
    starts = np.cumsum([0] + [lengths[i] for i in full[:-1]])
    plain = [i for i in full if type(versions[i][0]) is not Runs]  # runs: their smallest value, read directly
    for i in full:
        if type(versions[i][0]) is Runs:
            oldest[i] = runs_min(versions[i][0])
    if plain:
        vers = np.frombuffer(b"".join([memoryview(versions[i][0])[VECTOR_HEADER:] for i in plain]), DTYPES[I4])
        at = np.cumsum([0] + [lengths[i] for i in plain[:-1]])
        for i, m in zip(plain, np.minimum.reduceat(vers, at).tolist()):
            oldest[i] = m
    ok = np.isfinite(np.frombuffer(b"".join([memoryview(logprobs[i][0])[VECTOR_HEADER:] for i in full]), DTYPES[F4]))
    if not ok.all():
        for i, f in zip(full, np.logical_and.reduceat(ok, starts).tolist()):
            finite[i] = f
    return oldest, finite


def _parts(v: Any, where: Where) -> tuple[Any, ...]:
    """Validate one Sample map's base fields. Returns (prompt_id, sample_index, finish_reason,
    prompt_token_ids, response_token_ids, logprobs, versions, response_text, timings, generator), each
    array as (payload bytes, length)."""
    if type(v) is not dict:
        raise fail(where, "Sample", v)
    if not v.keys() <= _FIELDS:
        raise WireError(f"{path(where)}: unknown fields {sorted(map(str, v.keys() - _FIELDS))} for Sample")
    pid = _need(v, "prompt_id", where)
    if type(pid) is not str:
        raise fail((where, "prompt_id"), "str", pid)
    idx = _need(v, "sample_index", where)
    if type(idx) is not int:
        raise fail((where, "sample_index"), "int", idx)
    prompt = vector(_need(v, "prompt_token_ids", where), I4, (where, "prompt_token_ids"))
    resp = vector(_need(v, "response_token_ids", where), I4, (where, "response_token_ids"))
    logp = vector(_need(v, "logprobs", where), F4, (where, "logprobs"))
    vers = int_vector(_need(v, "versions", where), (where, "versions"))
    finish = _finish(_need(v, "finish_reason", where), where)
    if not resp[1] == logp[1] == vers[1]:
        raise WireError(f"{path(where)}: response has {resp[1]} tokens but {logp[1]} logprobs and {vers[1]} versions")
    text, gen = v.get("response_text", ""), v.get("generator", "")
    if type(text) is not str:
        raise fail((where, "response_text"), "str", text)
    if type(gen) is not str:
        raise fail((where, "generator"), "str", gen)
    timings = _TIMINGS(v["timings"], (where, "timings")) if "timings" in v else {}
    if idx < 0:
        raise WireError(f"{path(where)}: sample_index {idx} < 0")
    return pid, idx, finish, prompt, resp, logp, vers, text, timings, gen


def _episode(v: dict, finish: R.FinishReason, n: int, where: Where) -> dict[str, Any]:
    """The multi-turn fields present in Sample map `v` (n: response length), checked -> Sample kwargs."""
    out: dict[str, Any] = {}  # an explicit null is an absent optional field
    mask = None if v.get("loss_mask") is None else _loss_mask(v["loss_mask"], n, (where, "loss_mask"))
    if mask is not None:
        out["loss_mask"] = mask
    if v.get("turn_rewards") is not None:
        out["turn_rewards"] = _turn_rewards(v["turn_rewards"], _turns(mask, n), (where, "turn_rewards"))
    if v.get("env_reward") is not None:
        out["env_reward"] = _env_reward(v["env_reward"], (where, "env_reward"))
    error = v.get("env_error", "")
    _check_env_error(error, finish, (where, "env_error"))
    out["env_error"] = error
    if "rollout" in v:
        out["rollout"] = _TIMINGS(v["rollout"], (where, "rollout"))
    return out


def _loss_mask(x: Any, n: int, where: Where) -> np.ndarray:
    """[n] int32 of 0 (environment token) and 1 (the policy's)."""
    mask = as_numpy(vector(x, I4, where), I4)
    if len(mask) != n:
        raise WireError(f"{path(where)}: {len(mask)} entries for a response of {n} tokens")
    bad = np.flatnonzero((mask != 0) & (mask != 1))
    if len(bad):
        raise WireError(f"{path(where)}: values must be 0 or 1, got {int(mask[bad[0]])} at index {int(bad[0])}")
    return mask


def _turns(mask: np.ndarray | None, n: int) -> int:
    """Model turns of a response: maximal runs of loss_mask == 1 (no mask: the whole response, if any)."""
    if mask is None:
        return int(n > 0)
    return int(mask[0] == 1) + int(np.count_nonzero(np.diff(mask) == 1)) if n else 0


def _turn_rewards(x: Any, turns: int, where: Where) -> np.ndarray:
    """[k] finite float32, k <= turns (one reward after each model turn at most)."""
    rewards = as_numpy(vector(x, F4, where), F4)
    if len(rewards) > turns:
        raise WireError(f"{path(where)}: {len(rewards)} rewards but the response has {turns} model turns "
                        "(runs of loss_mask == 1)")
    if not np.isfinite(rewards).all():
        raise WireError(f"{path(where)}: non-finite reward at index {int(np.flatnonzero(~np.isfinite(rewards))[0])}")
    return rewards


def _env_reward(x: Any, where: Where) -> float:
    value = _FLOAT(x, where)
    if not math.isfinite(value):
        raise WireError(f"{path(where)}: {value} is not finite")
    return value


def _check_env_error(error: Any, finish: R.FinishReason, where: Where) -> None:
    """A str of at most MAX_ENV_ERROR_CHARS; a reason only on a failed episode (finish_reason env_error)."""
    if type(error) is not str:
        raise fail(where, "str", error)
    if len(error) > MAX_ENV_ERROR_CHARS:
        raise WireError(f"{path(where)}: {len(error)} characters, more than {MAX_ENV_ERROR_CHARS}")
    if error and finish is not R.FinishReason.ENV_ERROR:
        raise WireError(f"{path(where)}: {error[:40]!r} on a sample with finish_reason {finish.value!r}; an "
                        "environment's failure reason needs finish_reason 'env_error'")


def _need(v: dict, name: str, where: Where) -> Any:
    try:
        return v[name]
    except KeyError:
        raise WireError(f"{path(where)}: Sample needs field {name!r}") from None


def _finish(fr: Any, where: Where) -> R.FinishReason:
    finish = _FINISH.get(fr) if type(fr) is str else None
    if finish is None:
        raise WireError(f"{path((where, 'finish_reason'))}: {fr!r} is not one of {list(_FINISH)}")
    return finish
