"""Small fakes for multi-turn rollout tests: an environment that answers with the same token ids for a fixed
number of turns, a tokenizer that decodes ids as their numbers, and a byte-level tokenizer with a chat template."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from asyncrl.rollout.environment import Observation, Step

TURNS, ENV_IDS = 3, [3, 4, 5]


class Again:
    """TURNS turns: each model turn but the last gets ENV_IDS back; the last ends the episode with reward 1."""

    def reset(self, task):
        return None

    def step(self, action):
        if action.turn < TURNS:
            return Step(observation=Observation(token_ids=ENV_IDS))
        return Step(reward=1.0, done=True)


class IdTokenizer:
    eos_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def byte_tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    """One token per byte (no merges) plus <|im_start|> and <|im_end|> (the eos), with `chat_template`."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", chat_template=chat_template)
