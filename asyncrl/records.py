r"""Typed records: every message that crosses a process boundary.

Only `asyncrl.wire` turns these into bytes and back. Arrays are numpy arrays with fixed dtypes
(token ids int32, logprobs float32, versions int32); shapes are noted per field.

Sample life cycle (owned by the replay hub, `asyncrl.replay.state`):

    queued -> leased -> generated -> scored -> delivered -> trained
                 \           \          \          \-> dropped (stale when the batch is formed)
                 \           \          \          \-> filtered (its group had no signal: refill)
                  \-> queued  \-> failed \-> failed
                 (lease expired / aborted)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SCHEMA_VERSION = 1
# A group whose rewards spread by no more than this has no signal: every advantage is zero (the learner's group
# filter and the hub's refill both use it).
SIGNAL_SPREAD = 1e-8


class SampleState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    GENERATED = "generated"
    SCORED = "scored"
    DELIVERED = "delivered"
    TRAINED = "trained"
    DROPPED = "dropped"
    FILTERED = "filtered"  # its group had no signal (the samples' rewards did not differ) and was not trained
    FAILED = "failed"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS or a stop token (the token is in the response)
    LENGTH = "length"  # max_new_tokens reached
    ABORT = "abort"  # aborted (weight update in abort mode, shutdown); partial output
    ENV_ERROR = "env_error"  # a multi-turn episode whose environment failed (Sample.env_error says why)


class ScoreStatus(enum.StrEnum):
    OK = "ok"
    FAILED = "failed"  # reward function raised, timed out or returned a non-finite value


@dataclass(kw_only=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: whole vocabulary
    max_new_tokens: int = 64
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None  # per-request seed; sample i of a prompt uses seed + i

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"sampling.temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p={self.top_p}: must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"sampling.top_k={self.top_k}: must be -1 (off) or >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens={self.max_new_tokens}: must be >= 1")


@dataclass(kw_only=True, slots=True)
class RewardSpec:
    """What the reward service should check this prompt's completions against."""

    target: str | None = None  # reference answer (exact match, math, task verifiers)
    params: dict[str, Any] = field(default_factory=dict)  # per-prompt extras for reward functions


@dataclass(kw_only=True, slots=True)
class Prompt:
    prompt_id: str
    n: int  # samples per prompt (the group size)
    token_ids: np.ndarray | None = None  # [prompt_len] int32; or give text
    text: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    reward: RewardSpec = field(default_factory=RewardSpec)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.token_ids is None) == (self.text is None):
            raise ValueError(f"prompt {self.prompt_id!r}: give exactly one of token_ids or text")
        if self.n < 1:
            raise ValueError(f"prompt {self.prompt_id!r}: n={self.n} must be >= 1")


@dataclass(kw_only=True, slots=True)
class Sample:
    """One completion of a prompt, as the generator produced it."""

    prompt_id: str
    sample_index: int  # 0 .. n-1 within its prompt's group
    prompt_token_ids: np.ndarray  # [prompt_len] int32, exactly what the engine saw
    response_token_ids: np.ndarray  # [resp_len] int32, includes the stop token if one ended it
    logprobs: np.ndarray  # [resp_len] float32, log_softmax(logits / T) of each sampled token
    versions: np.ndarray  # [resp_len] int32, policy version that produced each token
    finish_reason: FinishReason
    response_text: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # seconds: queue, prefill, decode, ...
    generator: str = ""  # which generator made it
    # Multi-turn episodes (asyncrl.rollout): the response holds every token after the prompt in order, the
    # model's turns and the environment's tokens between them, exactly as the engine saw them.
    loss_mask: np.ndarray | None = None  # [resp_len] int32: 1 sampled by the policy (trained), 0 appended by
    #                                      the environment (logprob 0, never trained); None: all 1
    turn_rewards: np.ndarray | None = None  # [turns] float32: the environment's reward after each model turn
    env_reward: float | None = None  # the environment's episode reward (discounted); None: no environment
    env_error: str = ""  # why the environment failed this episode (finish_reason ENV_ERROR); "" if it did not
    rollout: dict[str, float] = field(default_factory=dict)  # episode stats: turns, env_time_s, tool_calls, ...


@dataclass(kw_only=True, slots=True)
class ScoredSample:
    sample: Sample
    reward: float  # weighted sum of components (0.0 when failed)
    components: dict[str, float] = field(default_factory=dict)
    status: ScoreStatus = ScoreStatus.OK
    reason: str = ""  # why it failed


@dataclass(kw_only=True, slots=True)
class Group:
    """All n scored samples of one prompt: the learner's unit of advantage normalisation."""

    prompt: Prompt
    samples: list[ScoredSample]


@dataclass(kw_only=True, slots=True)
class Batch:
    step: int  # the learner step this batch is for (1-based)
    policy_version: int  # learner version when the batch was formed
    groups: list[Group]
    dropped_stale: int = 0  # samples dropped by the staleness rule while forming it


# ---------------------------------------------------------------- control and service messages


@dataclass(kw_only=True, slots=True)
class Heartbeat:
    service: str  # "generator", "reward", "learner", ...
    name: str  # unique per process, e.g. "generator-0"
    stats: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)  # e.g. {"endpoint": ..., "weight_version": ...}


@dataclass(kw_only=True, slots=True)
class FatalError:
    service: str
    name: str
    reason: str


@dataclass(kw_only=True, slots=True)
class WeightVersion:
    """The learner announces a new policy version (after the weight push finished)."""

    version: int


@dataclass(kw_only=True, slots=True)
class Stats:
    counters: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class ErrorReply:
    """Answer to a request the hub could not serve (bad frame, bad request)."""

    reason: str
    request_type: str = ""


@dataclass(kw_only=True, slots=True)
class Ack:
    ok: bool = True
    info: dict[str, Any] = field(default_factory=dict)


# -- requests to the hub (credit-based: each names how much work the peer can take)


@dataclass(kw_only=True, slots=True)
class SubmitPrompts:
    prompts: list[Prompt]
    watch: bool = False  # stream this client's scored samples back to it
    # Held-out evaluation (needs watch): generated and scored like any prompt, pushed to the watcher, then
    # forgotten; never batched or trained, outside the run's accounting and admission (asyncrl.evaluation).
    evaluate: bool = False


@dataclass(kw_only=True, slots=True)
class LeaseRequest:
    """A generator asks for up to `max_prompts` prompts (its free capacity)."""

    generator: str
    max_prompts: int
    wait_s: float = 1.0  # hub holds the request up to this long when nothing can be leased


@dataclass(kw_only=True, slots=True)
class Lease:
    lease_id: str
    prompts: list[Prompt]
    policy_version: int  # newest version the hub knows; a generator behind it must sync first
    expires_in_s: float


@dataclass(kw_only=True, slots=True)
class SampleBatch:
    """Finished samples from a generator (any prompts, any order)."""

    lease_id: str
    samples: list[Sample]


@dataclass(kw_only=True, slots=True)
class ReturnPrompts:
    """A generator gives back prompts it will not finish (abort on weight update, shutdown)."""

    lease_id: str
    prompt_ids: list[str]
    reason: str = ""  # non-empty: the generator cannot take them (empty, out of vocab, too long): failed, not re-queued


@dataclass(kw_only=True, slots=True)
class ScoreRequest:
    """A reward worker asks for up to `max_samples` generated samples to score."""

    worker: str
    max_samples: int
    wait_s: float = 1.0


@dataclass(kw_only=True, slots=True)
class ToScore:
    items: list[ToScoreItem]


@dataclass(kw_only=True, slots=True)
class ToScoreItem:
    """One generated sample to score: only what reward functions read. The hub keeps the sample itself
    (token ids, logprobs, versions); the score comes back by id as a `ScoreResult`."""

    prompt_id: str
    sample_index: int
    response_text: str
    reward: RewardSpec
    finish_reason: FinishReason = FinishReason.STOP
    env_reward: float | None = None  # Sample.env_reward: the environment's episode reward (the environment kind)
    env_error: str = ""  # Sample.env_error: with finish_reason env_error, scored FAILED without a reward function


@dataclass(kw_only=True, slots=True)
class ScoreResult:
    """The score of one sample, named by id: the hub keeps its own copy of the sample."""

    prompt_id: str
    sample_index: int
    reward: float  # weighted sum of components (0.0 when failed)
    components: dict[str, float] = field(default_factory=dict)
    status: ScoreStatus = ScoreStatus.OK
    reason: str = ""  # why it failed


@dataclass(kw_only=True, slots=True)
class ScoredIds:
    """Scores sent back by id: what reward workers send (the hub joins each to its stored sample)."""

    scores: list[ScoreResult]


@dataclass(kw_only=True, slots=True)
class BatchRequest:
    """The learner asks for the batch of `step` (blocks until it can be formed)."""

    learner: str
    step: int
    wait_s: float = 1.0  # on timeout the hub answers Ack(ok=False, info={"reason": "timeout"})


@dataclass(kw_only=True, slots=True)
class CommitStep:
    """The learner checkpointed `step`: its batch becomes trained and is never re-delivered."""

    step: int
    policy_version: int


@dataclass(kw_only=True, slots=True)
class StatsRequest:
    pass


@dataclass(kw_only=True, slots=True)
class Completion:
    """A scored sample streamed back to the client that submitted its prompt."""

    scored: ScoredSample


@dataclass(kw_only=True, slots=True)
class Shutdown:
    reason: str = ""


@dataclass(kw_only=True, slots=True)
class PeerDown:
    """The launcher saw process `name` die: the hub gives its leases back to the queue at once."""

    service: str  # "generator", ...
    name: str  # e.g. "generator-0"
    reason: str = ""


# ---------------------------------------------------------------- weight push (learner <-> generator)
# One protocol for every engine, shaped like SGLang's (docs/sglang.md, "Endpoints, in order"); see asyncrl.weights.


@dataclass(kw_only=True, slots=True)
class WeightJoin:
    """A generator asks the learner for weights (on start, restart, or after missing an update)."""

    generator: str
    weight_version: int  # version it holds now
    device: str  # "cpu", "cuda:0", ...
    host: str = "127.0.0.1"
    gpu_uuid: str = ""  # same uuid as the learner's => CUDA IPC instead of a broadcast
    receiving_ranks: int = 1  # ranks that join the group (an SGLang engine with TP=t: t)


@dataclass(kw_only=True, slots=True)
class WeightGroupInit:
    """Join a dedicated process group by TCP rendezvous (learner is rank 0, hosts the store)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str  # "nccl" | "gloo" | "ipc"


@dataclass(kw_only=True, slots=True)
class WeightBegin:
    version: int
    pause_mode: str  # "abort" | "continue"


@dataclass(kw_only=True, slots=True)
class WeightBucket:
    """Metadata of one flat bucket; the bytes follow by broadcast on the group (or by CUDA IPC)."""

    version: int
    names: list[str]  # Hugging Face parameter names
    dtypes: list[str]  # torch dtype names without "torch." ("bfloat16", ...)
    shapes: list[list[int]]
    offsets: list[int]  # byte offset of each tensor in the flat buffer
    nbytes: int
    ipc_handle: dict[str, Any] | None = None  # CUDA IPC: fields of the shared storage handle


@dataclass(kw_only=True, slots=True)
class WeightEnd:
    version: int
