"""Neural reward: a Hugging Face sequence-classification model (a reward model) scores responses in
batches, on CPU or GPU.

    score() calls ──► pending [(text, future)] ──► one flush task: up to batch_size texts a batch
                                                    └──► model forward on one dedicated thread ──► futures

Every concurrent call of the reward worker (up to reward.max_inflight) lands in `pending` before the
flush task takes a batch, so a full worker scores batch_size samples per forward. The forward runs on
its own thread, so the event loop keeps talking to the hub meanwhile. A call the scorer times out is
cancelled; its text is still scored with its batch, the result is dropped.

The text scored is the response; when the prompt's reward params carry "prompt" (a string), the pair
(prompt, response) is scored, as reward models trained on conversations expect.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from asyncrl.precision import dtypes
from asyncrl.records import RewardSpec

_OPTIONS = {"model", "batch_size", "device", "max_length", "label", "dtype"}


class SequenceClassifier:
    """options: model (folder), batch_size (16), device ("cpu" | "cuda[:N]"), max_length (1024),
    label (the class whose probability is the score; default: the raw logit of a one-label model, else
    label 1), dtype ("float32" | "bfloat16" | "float16")."""

    def __init__(self, options: dict[str, Any]) -> None:
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"classifier options: unknown {sorted(unknown)}; allowed: {', '.join(sorted(_OPTIONS))}")
        self.batch_size = int(options.get("batch_size", 16))
        self.max_length = int(options.get("max_length", 1024))
        if self.batch_size < 1 or self.max_length < 1:
            raise ValueError(f"classifier options: batch_size={self.batch_size} and max_length={self.max_length} must be >= 1")
        self.model, self.tokenizer, self.device = _load(options)
        self.label = _label(options.get("label"), self.model.config.num_labels)
        self.batches = 0  # forwards run (for stats and tests)
        self._pending: list[tuple[tuple[str, ...], asyncio.Future[float]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="classifier")

    async def __call__(self, response: str, spec: RewardSpec) -> float:
        prompt = spec.params.get("prompt")
        texts = (prompt, response) if isinstance(prompt, str) else (response,)
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pending.append((texts, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the calls started in the same loop iteration join the first batch
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size:]
            try:
                scores = await loop.run_in_executor(self._thread, self.score_batch, [t for t, _ in batch])
            except Exception as e:  # noqa: BLE001 - each waiting call fails with the model's error
                scores = [e] * len(batch)
            for (_, future), score in zip(batch, scores):
                if future.done():  # cancelled by the scorer's timeout
                    continue
                if isinstance(score, Exception):
                    future.set_exception(score)
                else:
                    future.set_result(score)

    @torch.inference_mode()
    def score_batch(self, texts: list[tuple[str, ...]]) -> list[float]:
        """Scores of a batch of (response,) or (prompt, response) texts, in order."""
        first = [t[0] for t in texts]
        second = [t[1] for t in texts] if all(len(t) == 2 for t in texts) else None
        if second is None and any(len(t) == 2 for t in texts):  # mixed: score each kind in its own batch
            return [self.score_batch([t])[0] for t in texts]
        enc = self.tokenizer(first, second, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits.float()  # [B, num_labels]
        self.batches += 1
        if self.label is None:
            return logits[:, 0].tolist()
        return torch.softmax(logits, dim=-1)[:, self.label].tolist()

    async def close(self) -> None:
        self._thread.shutdown(wait=False)


def _load(options: dict[str, Any]) -> tuple[Any, Any, torch.device]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = str(options["model"])
    if not (Path(path) / "config.json").exists():
        raise ValueError(f"classifier options.model={path!r}: not a model folder (no config.json); "
                         "give a local folder saved with save_pretrained")
    dtype = dtypes.DTYPES.get(str(options.get("dtype", "float32")))
    if dtype is None:
        raise ValueError(f"classifier options.dtype={options['dtype']!r}: allowed {', '.join(dtypes.DTYPES)}")
    device = torch.device(str(options.get("device", "cpu")))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"classifier options.device={device}: no CUDA device here; use device = \"cpu\"")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).to(device).eval()
    if tokenizer.pad_token is None:  # decoder reward models often ship without one
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, device


def _label(label: Any, num_labels: int) -> int | None:
    """None: use the single logit as it is; else the class whose softmax probability is the score."""
    if label is None:
        return None if num_labels == 1 else 1
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < num_labels:
        raise ValueError(f"classifier options.label={label!r}: must be a class index in 0..{num_labels - 1}")
    return label
