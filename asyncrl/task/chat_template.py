"""The tokenizer's own chat template, applied to prompts when task.chat_template = true.

Prompts become token ids here (with the template's generation prompt), so the generator does not add a
second BOS or re-tokenize the template's special tokens. Example messages (task.example_messages: few-shot as
earlier turns) go before every prompt's own messages.
"""

from __future__ import annotations

from transformers import AutoTokenizer

Message = dict[str, str]


class ChatTemplate:
    def __init__(self, tokenizer_path: str, examples: list[Message] | None = None) -> None:
        self.examples = [dict(m) for m in examples or []]
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"task.chat_template = true, but the tokenizer at {tokenizer_path} has no chat template; "
                             "use an instruct/chat model's folder for model.path or set task.chat_template = false")

    def encode(self, messages: list[Message], response_prefix: str = "") -> list[int]:
        """Token ids of `messages` followed by the assistant's generation prompt and then `response_prefix`
        (task.response_prefix: the start of the assistant's turn, tokenized on its own so the template's ids
        stay exactly what the template gives)."""
        ids = self.tokenizer.apply_chat_template(self.examples + messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers >= 5 may answer a BatchEncoding
            ids = ids["input_ids"]
        prefix = self.tokenizer.encode(response_prefix, add_special_tokens=False) if response_prefix else []
        return [int(t) for t in ids] + [int(t) for t in prefix]
