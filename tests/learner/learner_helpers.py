"""Shared by the learner tests (and their spawned ranks): a tiny random Qwen2 and synthetic batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from asyncrl import records

VOCAB = 32


def make_tiny_model(path: Path, tie: bool = True) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tie)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    (path / "tokenizer_config.json").write_text("{}")
    return path


def make_batch(seed: int = 0, groups: int = 3, n: int = 4, temperature: float = 1.0, step: int = 1,
               versions: int = 0, behav_noise: float = 0.05, max_new_tokens: int = 8) -> records.Batch:
    """Random prompts/responses; reward 1 for odd sample indices (mixed groups) except the last group,
    which is all-equal (for DAPO's filter) when there are 3+ groups. Behaviour logprobs are plausible
    negatives with noise (exact values come from the test model where that matters)."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        prompt_len = int(rng.integers(2, 6))
        prompt = records.Prompt(
            prompt_id=f"p{seed}-{g}", n=n, token_ids=rng.integers(0, VOCAB, prompt_len).astype(np.int32),
            sampling=records.SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens))
        samples = []
        for i in range(n):
            r = int(rng.integers(1, max_new_tokens + 1))
            sample = records.Sample(
                prompt_id=prompt.prompt_id, sample_index=i, prompt_token_ids=prompt.token_ids,
                response_token_ids=rng.integers(0, VOCAB, r).astype(np.int32),
                logprobs=(-np.log(VOCAB) + behav_noise * rng.standard_normal(r)).astype(np.float32),
                versions=np.full(r, versions, np.int32), finish_reason=records.FinishReason.STOP)
            reward = 1.0 if (g == groups - 1 and groups >= 3) else float(i % 2)
            samples.append(records.ScoredSample(sample=sample, reward=reward))
        out.append(records.Group(prompt=prompt, samples=samples))
    return records.Batch(step=step, policy_version=versions, groups=out)


def params_snapshot(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().float().cpu() for k, v in trainer.named_full_tensors()}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fsdp_worker(rank: int, world: int, port: int | str, model_path: str, out_dir: str, cfg_kwargs: dict) -> None:
    """One FSDP2 rank (gloo, CPU): step 1, checkpoint, step 2; then a fresh trainer loads the checkpoint
    and repeats step 2. Rank 0 writes what it saw to out_dir/rank0.pt."""
    import torch.distributed as dist

    from asyncrl.learner.config import LearnerConfig
    from asyncrl.learner.trainer import Trainer

    torch.set_num_threads(1)
    init = port if isinstance(port, str) else f"tcp://127.0.0.1:{port}"  # a file:// store needs no free port
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        cfg = LearnerConfig(**cfg_kwargs)
        trainer = Trainer(cfg, model_path, device="cpu")
        m1 = trainer.train_step(make_batch(seed=5, groups=3, n=4))
        params = params_snapshot(trainer)
        path = trainer.save_checkpoint(Path(out_dir) / "run", extra={"hub_step": 1})
        m2 = trainer.train_step(make_batch(seed=6, groups=3, n=4, step=2))
        fresh = Trainer(cfg, model_path, device="cpu")
        extra = fresh.load_checkpoint(path)
        m2b = fresh.train_step(make_batch(seed=6, groups=3, n=4, step=2))
        if rank == 0:
            torch.save({"m1": m1, "params": params, "m2": m2, "m2b": m2b, "extra": extra, "ckpt": str(path)},
                       Path(out_dir) / "rank0.pt")
    finally:
        dist.destroy_process_group()


def gpu_worker(rank: int, world: int, port: int, model_path: str, out_dir: str) -> None:
    """FSDP2 over NCCL with bf16 compute / fp32 reduce: steps, full tensors, checkpoint round trip."""
    import torch.distributed as dist

    from asyncrl.learner.config import LearnerConfig
    from asyncrl.learner.trainer import Trainer

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        cfg = LearnerConfig(algorithm="ppo", lr=1e-3, kl_coef=0.01, micro_batch_tokens=32)
        t = Trainer(cfg, model_path)
        ms = [t.train_step(make_batch(seed=0, step=i + 1)) for i in range(2)]
        full = dict(t.named_full_tensors())
        path = t.save_checkpoint(Path(out_dir) / "run", extra={"x": 1})
        m3 = t.train_step(make_batch(seed=1, step=3))
        fresh = Trainer(cfg, model_path)
        fresh.load_checkpoint(path)
        m3b = fresh.train_step(make_batch(seed=1, step=3))
        if rank == 0:
            torch.save({"ms": ms, "m3": m3, "m3b": m3b, "dtypes": {k: str(v.dtype) for k, v in full.items()},
                        "devices": {str(v.device.type) for v in full.values()}}, Path(out_dir) / "gpu.pt")
    finally:
        dist.destroy_process_group()
