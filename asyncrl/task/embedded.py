"""The embedded default model: a tiny Qwen2 warm-started on the arithmetic task.

`embedded_model_path()` returns a Hugging Face folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json, asyncrl_build.json) that
`AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load. The folder ships in
asyncrl/task/assets/embedded/; when it is missing it is built on first use (about half a minute on a
2-core CPU) and written atomically, so processes that race to build it all end up with one folder.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

from asyncrl.task.arithmetic import make_problem
from asyncrl.task.tokenizer import BOS, EOS, PAD, VOCAB, save_tokenizer
from asyncrl.task.warmstart import WarmStartConfig, accuracy, train

log = logging.getLogger(__name__)

ASSET_DIR = Path(__file__).parent / "assets" / "embedded"
_EVAL_PROBLEMS = 1000
_EVAL_SEED = 12345  # disjoint from the warm-start stream (seed 0) in practice


def model_config() -> Qwen2Config:
    """Qwen2 with GQA (4 query heads, 2 KV heads, head dim 32), tied embeddings: ~0.4 M parameters."""
    return Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=VOCAB[BOS],
        eos_token_id=VOCAB[EOS],
        pad_token_id=VOCAB[PAD],
    )


def embedded_model_path() -> Path:
    """The embedded model's folder; built (and logged) on first use when missing."""
    for folder in (ASSET_DIR, _cache_dir()):
        if (folder / "model.safetensors").exists():
            return folder
    target = ASSET_DIR if os.access(ASSET_DIR.parent, os.W_OK) else _cache_dir()
    log.info("embedded model not found: building it into %s (warm start, about 30 s on CPU)", target)
    info = build(target)
    log.info("embedded model ready: %s", json.dumps(info))
    return target


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "asyncrl" / "embedded"


def build(target: Path, cfg: WarmStartConfig | None = None) -> dict[str, Any]:
    """Build deterministically (fixed seeds and thread count) into `target`; return the build facts."""
    cfg = cfg or WarmStartConfig()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # float reductions depend on the thread count
    try:
        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_config(model_config(), dtype=torch.float32)
        t0 = time.monotonic()
        loss = train(model, cfg)
        seconds = time.monotonic() - t0
        rng = random.Random(_EVAL_SEED)
        problems = [make_problem(rng, cfg.digits, cfg.ops) for _ in range(_EVAL_PROBLEMS)]
        info = {
            "params": sum(p.numel() for p in model.parameters()),
            "warm_start_steps": cfg.steps,
            "warm_start_s": round(seconds, 1),
            "final_loss": round(loss, 4),
            "digits": cfg.digits,
            "ops": cfg.ops,
            "greedy_accuracy": accuracy(model, problems, temperature=0.0),
            "sampled_accuracy_t1": accuracy(model, problems, temperature=1.0, seed=cfg.seed),
            "eval_problems": _EVAL_PROBLEMS,
        }
    finally:
        torch.set_num_threads(threads)
    _save_atomically(model, target, info)
    return info


def _save_atomically(model: torch.nn.Module, target: Path, info: dict[str, Any]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".embedded-", dir=target.parent))
    try:
        model.generation_config = GenerationConfig(
            bos_token_id=VOCAB[BOS], eos_token_id=VOCAB[EOS], pad_token_id=VOCAB[PAD], do_sample=True, temperature=1.0
        )
        model.save_pretrained(tmp)
        save_tokenizer(tmp)
        facts = {k: v for k, v in info.items() if k != "warm_start_s"}  # keep the folder byte-reproducible
        (tmp / "asyncrl_build.json").write_text(json.dumps(facts, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    except OSError:
        if not (target / "model.safetensors").exists():  # another process did not win the race: real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
