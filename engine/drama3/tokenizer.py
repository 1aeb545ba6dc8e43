"""The Drama 3 tokenizer: `tokenizer.json` read with Hugging Face `tokenizers`.

The released tokenizer is Qwen3.5's with Fish's special tokens added. The tiny demo
checkpoint gets a byte-level BPE with no merges (every UTF-8 byte is a token) plus the
same special tokens, so prompts exercise the same code paths: the structural tokens are
single ids, the semantic band is contiguous, and `<|im_end|>` is end of speech.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

STRUCTURAL = ("<|im_start|>", "<|im_end|>", "<|voice|>", "<|text|>", "<|interleave|>", "<|audio_separator|>")
SPEAKERS = 16
SEMANTIC_CODES = 4096


def semantic_token(code: int) -> str:
    return f"<|semantic:{code}|>"


def speaker_token(speaker: int) -> str:
    return f"<|speaker:{speaker}|>"


def tiny_tokenizer() -> Tokenizer:
    """256 byte tokens, then the structural, speaker and semantic specials, in that order."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [*STRUCTURAL, *(speaker_token(i) for i in range(SPEAKERS)),
                *(semantic_token(i) for i in range(SEMANTIC_CODES))]
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tokenizer


def token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """The ids config.json records: semantic band, end of speech, vocabulary size."""
    start = tokenizer.token_to_id(semantic_token(0))
    end = tokenizer.token_to_id(semantic_token(SEMANTIC_CODES - 1))
    eos = tokenizer.token_to_id("<|im_end|>")
    if start is None or end is None or eos is None or end - start + 1 != SEMANTIC_CODES:
        raise ValueError("the tokenizer lacks <|im_end|> or a contiguous <|semantic:i|> band")
    return {"semantic_start": start, "eos": eos, "vocab": tokenizer.get_vocab_size()}


def load_tokenizer(path: Path) -> Tokenizer:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; a Drama 3 checkpoint carries tokenizer.json")
    return Tokenizer.from_file(str(path))
