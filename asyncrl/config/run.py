"""The run config: one section per component, composed from the components' own dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.config.launch import LaunchConfig
from asyncrl.config.loader import load
from asyncrl.evaluation.config import EvalConfig
from asyncrl.generator.config import GeneratorConfig
from asyncrl.learner.config import LearnerConfig, rollout_correction_default
from asyncrl.models.config import ModelConfig
from asyncrl.replay.config import BatchConfig, HubConfig, shard_batch
from asyncrl.reward.config import RewardConfig
from asyncrl.task.config import TaskConfig


@dataclass(kw_only=True, slots=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.generator.max_running < self.batch.samples_per_prompt:
            raise ValueError(
                f"generator.max_running={self.generator.max_running} < batch.samples_per_prompt="
                f"{self.batch.samples_per_prompt}: a generator must fit at least one whole group"
            )
        if self.learner.resolved_filter_groups != "off" and self.batch.samples_per_prompt < 2:
            raise ValueError(
                f"learner.filter_groups={self.learner.filter_groups!r} (resolved "
                f"{self.learner.resolved_filter_groups!r}) with batch.samples_per_prompt=1: every group of one sample "
                "has a single reward, so every group would be dropped; set samples_per_prompt >= 2 or "
                "filter_groups = \"off\""
            )
        if self.model.residual_fp32 and self.generator.engine != "torch":
            raise ValueError(
                f"model.residual_fp32=true needs generator.engine='torch' (now {self.generator.engine!r}): an "
                "SGLang server rounds its residual stream to the compute dtype, and the learner must compute what "
                "the generator does; set model.residual_fp32 = false"
            )
        # Commits trail a background write by up to 2 intervals; a run no longer than one interval only ever
        # writes its final checkpoint, so it holds at most all its steps uncommitted.
        need = min(2 * self.learner.checkpoint_every + 1, self.learner.steps + 1)
        if self.hub.max_uncommitted_steps < need:
            raise ValueError(
                f"learner.checkpoint_every={self.learner.checkpoint_every} needs hub.max_uncommitted_steps >= {need} "
                f"(now {self.hub.max_uncommitted_steps}): the learner commits a step once its checkpoint is written, "
                "up to two checkpoint intervals later; raise hub.max_uncommitted_steps or checkpoint more often"
            )

        self._check_shards()
        self._check_lora_apply()
        self._check_share_base()
        self._resolve_rollout_precision()

    def _check_shards(self) -> None:
        if self.hub.shards == 1:
            return
        shard_batch(self.batch, self.hub.shards)  # raises unless prompts_per_step is a multiple
        if self.launch.placement != "local":
            raise ValueError(f"hub.shards={self.hub.shards} with launch.placement={self.launch.placement!r}: sharded "
                             "hubs run on the launching host only (for now); set launch.placement = \"local\" or "
                             "hub.shards = 1")

    def _check_lora_apply(self) -> None:
        """generator.lora_apply = "unmerged" is the torch engine's, and its numbers are not the rescorer's."""
        gen = self.generator
        if gen.lora_apply != "unmerged":
            return
        if gen.engine != "torch":
            raise ValueError(f"generator.lora_apply=\"unmerged\" with generator.engine={gen.engine!r}: the setting is "
                             "the torch engine's (an SGLang server applies adapters in its own LoRA serving); set "
                             "generator.lora_apply = \"merge\"")
        if gen.weights_dtype != "model":
            raise ValueError(f"generator.lora_apply=\"unmerged\" with generator.weights_dtype={gen.weights_dtype!r}: "
                             "the fp8 projections take quantized inputs the adapters cannot share; set "
                             "generator.lora_apply = \"merge\"")
        if self.learner.lora_rank and self.learner.lora_push == "merged":
            raise ValueError("generator.lora_apply=\"unmerged\" with learner.lora_push=\"merged\": merged pushes carry "
                             "no adapters to keep apart; set learner.lora_push = \"adapter\" (or \"auto\"), or "
                             "generator.lora_apply = \"merge\"")
        if gen.deterministic and self.learner.lora_rank:
            raise ValueError("generator.lora_apply=\"unmerged\" with generator.deterministic=true: the learner "
                             "re-scores with merged weights, which do not give the unmerged engine's bits; set "
                             "generator.lora_apply = \"merge\"")

    def _check_share_base(self) -> None:
        """generator.share_base: an image nobody writes, on the one device of one learner rank (the launcher checks
        the devices)."""
        if not self.generator.share_base:
            return
        why = ("learner.lora_rank = 0 (full fine-tuning writes the base)" if not self.learner.lora_rank else
               f"generator.engine = {self.generator.engine!r} (the torch engine's)" if self.generator.engine != "torch"
               else f"generator.lora_apply = {self.generator.lora_apply!r} (a merge writes the base's weights)"
               if self.generator.lora_apply != "unmerged" else
               f"learner.ranks = {self.learner.ranks} (the image is one device's)" if self.learner.ranks != 1 else
               f"launch.placement = {self.launch.placement!r} (one host's processes map it)"
               if self.launch.placement != "local" else "")
        if why:
            raise ValueError(f"generator.share_base = true with {why}: it needs LoRA (learner.lora_rank > 0) kept "
                             "unmerged by the torch engine (generator.lora_apply = \"unmerged\"), one learner rank and "
                             "local placement; set those or generator.share_base = false")

    def _resolve_rollout_precision(self) -> None:
        """FP8 rollouts need a bf16 model, and `learner.off_policy = "auto"` becomes their correction (tis)."""
        if self.generator.weights_dtype != "fp8":
            return
        if self.model.dtype not in ("auto", "bfloat16"):  # auto: bfloat16 on a GPU (the engine checks the rest)
            raise ValueError(f"generator.weights_dtype=\"fp8\" needs model.dtype=\"bfloat16\" (now "
                             f"{self.model.dtype!r}): the fp8 matmuls write bfloat16; set model.dtype = \"bfloat16\"")
        if self.learner.off_policy == "auto":
            self.learner.off_policy = rollout_correction_default("fp8").off_policy

    @property
    def resolved_lora_push(self) -> str:
        """What each weight push carries: "full" (no LoRA), "adapter" or "merged" (`learner.lora_push`). With
        SGLang, "auto" and "adapter" ask the server (/server_info, waiting up to sglang.startup_wait_s): "adapter"
        when it runs with --enable-lora and the adapters fit its --max-lora-rank / --lora-target-modules (else a
        ValueError naming the key and the flag), "merged" for "auto" on a server without LoRA serving or with
        learner.lora_trainable set (SGLang's LoRA serving takes adapters only, not trained norms)."""
        if not self.learner.lora_rank:
            return "full"
        ln = self.learner
        if self.generator.engine == "torch" or ln.lora_push == "merged":
            return "adapter" if ln.lora_push == "auto" else ln.lora_push
        from asyncrl.engine.sglang.lora import resolve_push

        return resolve_push(self.generator.sglang, ln.lora_push, ln.lora_rank, ln.lora_targets, ln.lora_trainable)


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    return load(RunConfig, path, overrides)
