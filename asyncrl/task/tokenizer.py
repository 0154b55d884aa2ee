"""Character-level tokenizer of the embedded model, built with the `tokenizers` library.

Vocabulary: <pad> <bos> <eos>, the digits, "+", "-", "=" and the space; one token per character, and
every encoded text starts with <bos>. Saved as tokenizer.json + tokenizer_config.json so that
`AutoTokenizer.from_pretrained(folder)` loads it.

Why it is byte-level BPE without merges rather than a plain word-level model: for model_type "qwen2"
recent transformers versions ignore tokenizer_class and rebuild the tokenizer as `Qwen2Tokenizer`
(byte-level BPE with Qwen's split regex) from our vocabulary. Building exactly that structure here makes
every loading path (Qwen2Tokenizer, TokenizersBackend, PreTrainedTokenizerFast, raw `tokenizers`)
tokenize identically. In byte-level spelling the space is "Ġ".
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
CHARS = tuple("0123456789+-=") + ("\u0120",)  # "\u0120" ("Ġ") is the byte-level spelling of " "
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
# Qwen2's pre-tokenizer split (same as transformers' Qwen2Tokenizer): digits one by one.
_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def token_id(char: str) -> int:
    """Id of one task character ("0".."9", "+", "-", "=", " ")."""
    return VOCAB["\u0120" if char == " " else char]


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab=VOCAB, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB[BOS])]
    )
    return tok


def save_tokenizer(folder: Path) -> None:
    build_tokenizer().save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": PAD,  # Qwen2Tokenizer would otherwise add "<|endoftext|>" beyond the model's vocabulary
        "add_bos_token": True,
        "add_prefix_space": False,
        "model_max_length": 64,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
