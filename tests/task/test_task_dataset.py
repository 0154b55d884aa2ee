"""Prompt sources from local tables (parquet, JSONL, Hugging Face `datasets` folders) with named prompt
and answer columns, and the tokenizer's own chat template. Every file is written in tmp."""

from __future__ import annotations

import importlib.util
import json
from itertools import islice

import pytest

from asyncrl.task.config import TaskConfig
from asyncrl.task.embedded import embedded_model_path
from asyncrl.task.source import make_prompt_source

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIALS = ["<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
ROWS = [{"question": "1+1=", "solution": "2", "extra": 0}, {"question": "2+5=", "solution": 7, "extra": 1}]


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    """A character-level tokenizer with a chat template, saved like any model's tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + [chr(c) for c in range(32, 127)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens(SPECIALS)
    folder = tmp_path_factory.mktemp("chat-tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", chat_template=TEMPLATE).save_pretrained(folder)
    return str(folder)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def text(tok, prompt):
    """The prompt's token ids spelled back (the character-level tokenizer's decode puts spaces between)."""
    return "".join(tok.convert_ids_to_tokens(prompt.token_ids.tolist()))


def first(cfg, k=2, **kw):
    return list(islice(make_prompt_source(cfg, 4, **kw), k))


def test_jsonl_table_with_named_columns(tmp_path):
    cfg = TaskConfig(name="dataset", path=write_jsonl(tmp_path / "t.jsonl", ROWS), prompt_key="question",
                     answer_key="solution", shuffle=False)
    a, b = first(cfg)
    assert (a.text, a.reward.target, a.n, b.text, b.reward.target) == ("1+1=", "2", 4, "2+5=", "7")
    assert a.token_ids is None and a.metadata["row"] == 0


def test_parquet_table(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="parquet support needs pyarrow (an optional dependency)")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist([{"q": r["question"], "a": str(r["solution"])} for r in ROWS]), tmp_path / "t.parquet")
    cfg = TaskConfig(name="dataset", path=str(tmp_path / "t.parquet"), prompt_key="q", answer_key="a", shuffle=False)
    assert [(p.text, p.reward.target) for p in first(cfg, 3)] == [("1+1=", "2"), ("2+5=", "7"), ("1+1=", "2")]


def test_datasets_folder(tmp_path):
    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(ValueError, match=r"needs the datasets package \(pip install datasets\); or give a .parquet"):
            first(TaskConfig(name="dataset", path=str(tmp_path)))
        return
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "d"))
    cfg = TaskConfig(name="dataset", path=str(tmp_path / "d"), prompt_key="question", answer_key="solution", shuffle=False)
    assert [p.reward.target for p in first(cfg)] == ["2", "7"]
    with pytest.raises(ValueError, match="task.split='test': .* has splits train"):
        first(TaskConfig(name="dataset", path=str(tmp_path / "d"), split="test", prompt_key="question"))


def test_mistakes_name_the_key_and_the_fix(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    with pytest.raises(ValueError, match=r"task.prompt_key='prompt': no such column .* columns: extra, question, solution"):
        first(TaskConfig(name="dataset", path=path, answer_key=""))
    with pytest.raises(ValueError, match="task.answer_key='answer': no such column"):
        first(TaskConfig(name="dataset", path=path, prompt_key="question"))
    with pytest.raises(ValueError, match="task.path='nope.csv': not found"):
        first(TaskConfig(name="dataset", path="nope.csv"))
    chat = write_jsonl(tmp_path / "c.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(ValueError, match="holds chat messages; set task.chat_template = true"):
        first(TaskConfig(name="dataset", path=chat, answer_key=""))
    with pytest.raises(ValueError, match='task.name = "dataset" needs task.path'):
        TaskConfig(name="dataset")
    with pytest.raises(ValueError, match="task.chat_template = true needs a jsonl or dataset task"):
        TaskConfig(chat_template=True)


def test_chat_template_turns_text_and_messages_into_template_token_ids(tmp_path, chat_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_tokenizer)
    rows = [{"prompt": "1+1=", "answer": "2"},
            {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+5="}], "answer": "7"}]
    cfg = TaskConfig(name="dataset", path=write_jsonl(tmp_path / "t.jsonl", rows), chat_template=True, shuffle=False)
    a, b = first(cfg, tokenizer_path=chat_tokenizer)
    assert a.text is None and text(tok, a) == "<|user|>1+1=<|end|><|assistant|>"
    assert text(tok, b) == "<|system|>be brief<|end|><|user|>2+5=<|end|><|assistant|>"
    assert b.reward.target == "7"
    jsonl = TaskConfig(name="jsonl", path=write_jsonl(tmp_path / "p.jsonl", [{"text": "3+4=", "target": "7"}]),
                       chat_template=True)
    (p,) = first(jsonl, 1, tokenizer_path=chat_tokenizer)
    assert text(tok, p) == "<|user|>3+4=<|end|><|assistant|>" and p.reward.target == "7"


EXAMPLES = [{"role": "user", "content": "9+1="}, {"role": "assistant", "content": "<call>9+1</call>"},
            {"role": "tool", "content": "10"}, {"role": "assistant", "content": "10"}]


def test_example_messages_come_before_every_prompt_and_in_the_held_out_set_too(tmp_path, chat_tokenizer):
    from transformers import AutoTokenizer

    from asyncrl.task.heldout import heldout_prompts

    tok = AutoTokenizer.from_pretrained(chat_tokenizer)
    shown = "<|user|>9+1=<|end|><|assistant|><call>9+1</call><|end|><|tool|>10<|end|><|assistant|>10<|end|>"
    rows = [{"prompt": "1+1=", "answer": "2"},
            {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+5="}], "answer": "7"}]
    cfg = TaskConfig(name="dataset", path=write_jsonl(tmp_path / "t.jsonl", rows), chat_template=True, shuffle=False,
                     example_messages=EXAMPLES)
    a, b = first(cfg, tokenizer_path=chat_tokenizer)
    assert text(tok, a) == shown + "<|user|>1+1=<|end|><|assistant|>"
    assert text(tok, b) == shown + "<|system|>be brief<|end|><|user|>2+5=<|end|><|assistant|>"
    held = heldout_prompts(cfg, 1, tokenizer_path=chat_tokenizer)
    assert [text(tok, p) for p in held] == [text(tok, b)]  # the last row is held out, examples and all


@pytest.mark.parametrize("examples, match", [
    ([{"role": "user", "content": "hi"}], "ends with a 'user' message; end the examples with the assistant's reply"),
    ([{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}],
     r"example_messages\[0\].role='narrator': allowed roles are 'system', 'user', 'assistant', 'tool'"),
    ([{"role": "assistant", "content": 3}], r"example_messages\[0\]: want \{role"),
    ([{"role": "assistant", "content": "x", "name": "a"}], r"example_messages\[0\]: want"),
])
def test_example_messages_are_checked_with_the_field_named(tmp_path, examples, match):
    with pytest.raises(ValueError, match=match):
        TaskConfig(name="jsonl", path="p.jsonl", chat_template=True, example_messages=examples)


def test_example_messages_need_the_chat_template():
    with pytest.raises(ValueError, match="task.example_messages needs task.chat_template = true"):
        TaskConfig(name="jsonl", path="p.jsonl", example_messages=EXAMPLES)


def test_chat_template_needs_a_tokenizer_that_has_one(tmp_path):
    cfg = TaskConfig(name="jsonl", path=write_jsonl(tmp_path / "p.jsonl", [{"text": "1+1="}]), chat_template=True)
    with pytest.raises(ValueError, match="has no chat template; use an instruct/chat model's folder for model.path"):
        first(cfg, tokenizer_path=str(embedded_model_path()))  # the embedded tokenizer has none
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        first(cfg)
