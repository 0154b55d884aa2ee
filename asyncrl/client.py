"""`asyncrl.Client`: submit prompts to a running system and stream back completions with their scores.

    client = Client(run_dir="runs/x")                 # or Client("tcp://127.0.0.1:5555")
    handles = client.submit(["2+2=?", [1, 2, 3]], n=4, target="4")
    for scored in handles[0]:                          # ScoredSample, as each sample is scored
        print(scored.reward, scored.sample.response_text)
    all_four = handles[1].result(timeout_s=60)
    client.stats()                                     # the hub's counters

Scoring: a prompt without a reference answer gets one when the run's reward can compute it (the
arithmetic task's verifier answers its own problems: "12+34=" -> "46"); otherwise, if a reward component
of the run needs one (exact_match, math, task), `submit` refuses it with a ValueError naming what to pass.
With `run_dir` the client reads the run's components from config.json; with an endpoint only, pass
`reward_components` to get the same check.

The hub pushes a `Completion` for every scored (or failed) sample of prompts submitted here; the client
routes them to their `Handle`. `AsyncClient` offers the same calls as coroutines (one worker thread).

The hub trains on these prompts like on the run's own but counts their failures apart (``client_failed`` in
its stats' accounting and states, not the run's ``failed``): a user's bad prompt is not a failing run.

Bad input from the socket never raises into the user's program: frames that do not decode (bounded by
`asyncrl.wire`), have the wrong type, or are Completions for no prompt of this client or for a sample
already received are skipped and counted in `client.rejected` (by reason) with a logged reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl import records as R
from asyncrl.net.credentials import SECRET_FILE, Credentials
from asyncrl.net.hub_shards import hub_endpoints
from asyncrl.net.peer import HubError
from asyncrl.net.sharded_peer import hub_peer
from asyncrl.reward.reference import RewardComponentRef, complete_reference, run_reward_components
from asyncrl.task.prompt_row import parse_row

PromptLike = str | list[int] | dict[str, Any] | R.Prompt


def endpoints_from_run_dir(run_dir: str | Path) -> list[str]:
    """The hub's endpoints of a run (one per shard): run.json's "endpoints" (the launcher writes them before the
    hub starts)."""
    run_json = Path(run_dir) / "run.json"  # read here: the client sits below asyncrl.run, which writes it
    endpoints = json.loads(run_json.read_text()).get("endpoints", {}) if run_json.exists() else {}
    if not endpoints.get("replay"):
        raise FileNotFoundError(f"{run_dir}: no run.json with endpoints.replay; is the run up?")
    return hub_endpoints(endpoints)


@dataclass(slots=True)
class Handle:
    """One submitted prompt: its n samples arrive here as they are scored."""

    client: Client
    prompt_id: str
    n: int
    scored: list[R.ScoredSample] = field(default_factory=list)

    def done(self) -> bool:
        return len(self.scored) >= self.n

    def result(self, timeout_s: float | None = None) -> list[R.ScoredSample]:
        """All n scored samples, ordered by sample index. Raises TimeoutError."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done():
            self.client._pump_until(deadline)
        return sorted(self.scored, key=lambda s: s.sample.sample_index)

    def __iter__(self) -> Iterator[R.ScoredSample]:
        seen = 0
        while True:
            while seen < len(self.scored):
                seen += 1
                yield self.scored[seen - 1]
            if self.done():
                return
            self.client._pump_until(None)


def client_credentials(run_dir: str | Path | None) -> Credentials | None:
    """Role "client" from the run directory's secret (readable by its owner only); else the environment's
    (none: a hub without authentication, e.g. an in-process BackgroundHub). The run directory wins over the
    environment: credentials a process inherited belong to whatever run started it, not necessarily to this one."""
    if run_dir is None or not (Path(run_dir) / SECRET_FILE).exists():
        return None
    return Credentials.from_run_dir(run_dir, "client")


class Client:
    def __init__(self, endpoint: str | list[str] | None = None, *, run_dir: str | Path | None = None,
                 name: str = "", timeout_s: float = 30.0,
                 reward_components: list[RewardComponentRef] | None = None,
                 credentials: Credentials | None = None) -> None:
        """`credentials`: the role to prove (default: "client" from the run directory's secret, else the
        environment's); a service of the run that submits as a client (the evaluator) passes its own.
        `endpoint`: the hub's, or a list of its shards' (hub.shards)."""
        if (endpoint is None) == (run_dir is None):
            raise ValueError("Client: give exactly one of endpoint or run_dir")
        if endpoint is None:
            endpoints = endpoints_from_run_dir(run_dir)  # type: ignore[arg-type]
        else:
            endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        self.endpoint = ",".join(endpoints)
        self.name = name or f"client-{uuid.uuid4().hex[:8]}"
        self.peer = hub_peer(endpoints, self.name, timeout_s=timeout_s,
                             credentials=credentials or client_credentials(run_dir))
        self.handles: dict[str, Handle] = {}
        # The run's reward components (to check that submitted prompts can be scored); None: unknown.
        self.reward_components = reward_components if run_dir is None else run_reward_components(run_dir)
        self._lock = threading.Lock()

    def submit(self, prompts: PromptLike | list[PromptLike], *, n: int = 1,
               sampling: R.SamplingParams | dict[str, Any] | None = None,
               target: str | int | float | None = None,
               reward: R.RewardSpec | str | dict[str, Any] | None = None, evaluate: bool = False) -> list[Handle]:
        """Queue prompts (text, token ids, dicts in the `asyncrl.task.prompt_row` format, or Prompt records);
        returns one Handle per prompt. `target` is the reference answer of every prompt given here (a dict's
        own "target" wins); prompts without one are refused (ValueError) when the run's reward needs one it
        cannot compute itself. `evaluate`: held-out evaluation prompts, generated and scored at the current
        weights but never trained on nor counted in the run's accounting (asyncrl.evaluation)."""
        items = [prompts] if isinstance(prompts, (str, dict, R.Prompt)) else list(prompts)
        if items and isinstance(items[0], int):  # one prompt given as a list of token ids
            items = [items]
        spec = _reward_spec(target, reward)
        recs = [complete_reference(to_prompt(p, n=n, sampling=sampling, reward=spec, prefix=self.name, index=i),
                                   self.reward_components, i) for i, p in enumerate(items)]
        with self._lock:
            ack = self.peer.request(R.SubmitPrompts(prompts=recs, watch=True, evaluate=evaluate))
            ids = ack.info.get("prompt_ids")
            if not isinstance(ids, list) or len(ids) != len(recs) or not all(isinstance(i, str) for i in ids):
                self.peer.reject("bad_ack", f"SubmitPrompts answered without {len(recs)} prompt ids: {ack.info!r:.200}")
                raise HubError(f"the hub acknowledged {len(recs)} prompts without their ids", "SubmitPrompts")
            out = []
            for rec, pid in zip(recs, ids):
                out.append(self.handles.setdefault(pid, Handle(self, pid, rec.n)))
        return out

    def completions(self, timeout_s: float | None = None) -> Iterator[R.ScoredSample]:
        """Every scored sample of this client's prompts as it arrives, until all handles are done."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen = {pid: 0 for pid in self.handles}
        while True:
            for pid, h in list(self.handles.items()):
                while seen.get(pid, 0) < len(h.scored):
                    seen[pid] = seen.get(pid, 0) + 1
                    yield h.scored[seen[pid] - 1]
            if all(h.done() for h in self.handles.values()):
                return
            self._pump_until(deadline)

    @property
    def rejected(self) -> dict[str, int]:
        """Bad frames received and skipped, by reason (see the module doc)."""
        return dict(self.peer.rejected)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self.peer.request(R.StatsRequest()).counters

    def request(self, msg: Any) -> Any:
        """Any request of the hub contract (see asyncrl.net.peer)."""
        with self._lock:
            return self.peer.request(msg)

    def close(self) -> None:
        self.peer.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pump_until(self, deadline: float | None) -> None:
        """Wait for the next pushed Completion (at most until `deadline`) and route it."""
        left = 1.0 if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("completions did not arrive in time")
        with self._lock:
            msg = self.peer.receive(timeout_s=min(left, 1.0))
        if isinstance(msg, R.Completion):
            self._route(msg.scored)

    def _route(self, scored: R.ScoredSample) -> None:
        h = self.handles.get(scored.sample.prompt_id)
        idx = scored.sample.sample_index
        if h is None:
            self.peer.reject("unknown_prompt", f"a completion for {scored.sample.prompt_id!r:.80}, not submitted here")
        elif not 0 <= idx < h.n or any(s.sample.sample_index == idx for s in h.scored):
            self.peer.reject("bad_sample", f"{h.prompt_id}: sample {idx} out of range 0..{h.n - 1} or already received")
        else:
            h.scored.append(scored)


class AsyncClient:
    """`Client` for asyncio code: the same calls as coroutines, run on one worker thread."""

    def __init__(self, endpoint: str | list[str] | None = None, **kwargs: Any) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncrl-client")
        self.client = Client(endpoint, **kwargs)

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def submit(self, prompts: PromptLike | list[PromptLike], **kwargs: Any) -> list[Handle]:
        return await self._run(self.client.submit, prompts, **kwargs)

    async def result(self, handle: Handle, timeout_s: float | None = None) -> list[R.ScoredSample]:
        return await self._run(handle.result, timeout_s)

    async def stats(self) -> dict[str, Any]:
        return await self._run(self.client.stats)

    async def close(self) -> None:
        await self._run(self.client.close)
        self._pool.shutdown()


def to_prompt(p: PromptLike, *, n: int, sampling: Any, reward: R.RewardSpec, prefix: str, index: int = 0) -> R.Prompt:
    """str (text) | list[int] (token ids) | dict (prompt_row format) | Prompt -> Prompt with a fresh unique id."""
    if isinstance(p, R.Prompt):
        return p
    if isinstance(p, str):
        p = {"text": p}
    elif isinstance(p, (list, np.ndarray)):
        p = {"token_ids": p}
    if not isinstance(p, dict):
        raise TypeError(f"submit: prompt {index} is a {type(p).__name__}; give a str, a list of token ids, a dict or a Prompt")
    row = parse_row(p, f"submit: prompt {index}")
    if row.target is None and reward.target is not None:
        row = dataclasses.replace(row, target=reward.target)
    if not row.params and reward.params:
        row = dataclasses.replace(row, params=dict(reward.params))
    base = sampling if isinstance(sampling, R.SamplingParams) else R.SamplingParams(**(sampling or {}))
    return row.to_prompt(row.prompt_id or f"{prefix}-{uuid.uuid4().hex[:12]}", n, base)


def _reward_spec(target: Any, reward: Any) -> R.RewardSpec:
    """The RewardSpec shared by every prompt of one submit (target= is the plain spelling)."""
    if target is not None and reward is not None:
        raise ValueError("submit: give target= or reward=, not both (target=\"46\" is the same as reward=\"46\")")
    if target is not None:
        return R.RewardSpec(target=str(target))
    if reward is None:
        return R.RewardSpec()
    if isinstance(reward, R.RewardSpec):
        return reward
    if isinstance(reward, dict):
        unknown = set(reward) - {"target", "params"}
        if unknown:
            raise ValueError(f"submit: reward= has unknown key {sorted(unknown)[0]!r}; allowed: target, params")
        return R.RewardSpec(target=None if reward.get("target") is None else str(reward["target"]),
                            params=dict(reward.get("params") or {}))
    return R.RewardSpec(target=str(reward))
