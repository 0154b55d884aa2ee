"""The classifier reward kind: a tiny random Hugging Face sequence-classification model saved in tmp,
scored in batches behind the RewardFn Protocol, alone and through the Scorer."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

from asyncrl.records import ScoreStatus
from asyncrl.reward.classifier import SequenceClassifier
from asyncrl.reward.protocol import RewardFn
from asyncrl.reward.scorer import Scorer
from asyncrl.task.embedded import embedded_model_path
from reward_helpers import config, item, spec

TEXTS = ["46<eos>", "1", "-12<eos>", "7+8=15", "99", "3 4", "0<eos>", "12", "5-5=0<eos>", "8"]


def tiny_classifier(folder, num_labels: int) -> str:
    """A random 1-layer Qwen2 classifier with the embedded model's tokenizer (digits, + - = and space)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=17, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, num_labels=num_labels, pad_token_id=0)
    Qwen2ForSequenceClassification(cfg).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded_model_path() / name, folder / name)
    return str(folder)


@pytest.fixture(scope="module")
def two_labels(tmp_path_factory):
    return tiny_classifier(tmp_path_factory.mktemp("rm2"), 2)


def alone(path: str, text: str, label: int | None) -> float:
    """The score of one text by a plain unpadded forward: what batching must reproduce."""
    model = Qwen2ForSequenceClassification.from_pretrained(path).eval()
    ids = AutoTokenizer.from_pretrained(path)(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    return float(logits[0]) if label is None else float(torch.softmax(logits, -1)[label])


def score_all(fn: SequenceClassifier, texts: list[str]) -> list[float]:
    async def go():
        try:
            return await asyncio.gather(*(fn(t, spec()) for t in texts))
        finally:
            await fn.close()
    return asyncio.run(go())


def test_concurrent_calls_are_scored_in_batches_with_the_unbatched_scores(two_labels):
    fn = SequenceClassifier({"model": two_labels, "batch_size": 4})
    assert isinstance(fn, RewardFn)
    got = score_all(fn, TEXTS)
    assert fn.batches == 3  # 10 concurrent calls, 4 per forward
    assert got == pytest.approx([alone(two_labels, t, 1) for t in TEXTS], abs=1e-5)
    assert all(0.0 < g < 1.0 for g in got) and len(set(got)) > 1


def test_one_label_model_gives_its_raw_logit(tmp_path):
    path = tiny_classifier(tmp_path, 1)
    got = score_all(SequenceClassifier({"model": path, "label": None}), TEXTS[:3])
    assert got == pytest.approx([alone(path, t, None) for t in TEXTS[:3]], abs=1e-5)


def test_through_the_scorer_with_weight_and_a_prompt_pair(two_labels):
    cfg = config({"kind": "classifier", "name": "rm", "weight": 2.0, "options": {"model": two_labels, "label": 0}})

    async def go():
        scorer = Scorer(cfg)
        try:
            return await asyncio.gather(scorer.score(item("46<eos>", spec())),
                                        scorer.score(item("46<eos>", spec(prompt="12+34="))))
        finally:
            await scorer.close()
    plain, paired = asyncio.run(go())
    assert plain.status is ScoreStatus.OK and plain.components["rm"] == pytest.approx(alone(two_labels, "46<eos>", 0), abs=1e-5)
    assert plain.reward == pytest.approx(2.0 * plain.components["rm"])
    assert paired.status is ScoreStatus.OK and paired.components["rm"] != pytest.approx(plain.components["rm"], abs=1e-7)


@pytest.mark.parametrize("options,msg", [
    ({"model": "/nonexistent"}, "options.model='/nonexistent': not a model folder"),
    ({"label": 2}, r"options.label=2: must be a class index in 0..1"),
    ({"temperature": 1}, r"unknown \['temperature'\]"),
    ({"batch_size": 0}, "batch_size=0 and max_length=1024 must be >= 1"),
    ({"dtype": "int8"}, "options.dtype='int8': allowed float32"),
])
def test_mistakes_name_the_option(two_labels, options, msg):
    with pytest.raises(ValueError, match=msg):
        SequenceClassifier({"model": two_labels, **options})


def test_config_requires_a_model():
    with pytest.raises(ValueError, match="kind='classifier' needs options.model"):
        config({"kind": "classifier"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_on_a_cpu_machine_says_so(two_labels):
    with pytest.raises(ValueError, match='options.device=cuda: no CUDA device here; use device = "cpu"'):
        SequenceClassifier({"model": two_labels, "device": "cuda"})
