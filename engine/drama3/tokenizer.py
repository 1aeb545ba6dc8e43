"""The Drama 3 tokenizer: `tokenizer.json` read with Hugging Face `tokenizers`.

The released tokenizer is Qwen3.5's with Fish's special tokens added. The tiny demo
checkpoint gets a byte-level BPE with no merges (every UTF-8 byte is a token) plus the
same special tokens, so prompts exercise the same code paths: the structural tokens are
single ids, the semantic band is contiguous, and `<|im_end|>` is end of speech.
`tokenizer_for` lays the same tokens out at another config's ids (random-weight models of
the full preset have Qwen's: `<|im_end|>` 248,046, the band from 248,192, 252,288 in all),
with reserved tokens that no text produces filling the ids between.
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


def reserved_token(index: int) -> str:
    return f"<|reserved:{index}|>"


def byte_tokenizer(reserved_before: int = 0, reserved_between: int = 0, reserved_after: int = 0) -> Tokenizer:
    """256 byte tokens, `reserved_before` reserved ids, then the structural and speaker
    specials, `reserved_between` reserved ids, the semantic band and `reserved_after` more."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update((reserved_token(i), i) for i in range(len(vocab), len(vocab) + reserved_before))  # no merge makes them
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    first = len(vocab) + len(STRUCTURAL) + SPEAKERS
    specials = [*STRUCTURAL, *(speaker_token(i) for i in range(SPEAKERS)),
                *(reserved_token(first + i) for i in range(reserved_between)),
                *(semantic_token(i) for i in range(SEMANTIC_CODES)),
                *(reserved_token(first + reserved_between + SEMANTIC_CODES + i) for i in range(reserved_after))]
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tokenizer


def tiny_tokenizer() -> Tokenizer:
    """256 byte tokens, then the structural, speaker and semantic specials, in that order."""
    return byte_tokenizer()


def tokenizer_for(semantic_start: int, eos: int, vocab: int) -> Tokenizer:
    """The tiny tokenizer's tokens at a config's ids: `<|im_end|>` at `eos` (the structural
    tokens start one before it), the semantic band from `semantic_start`, `vocab` ids in all."""
    before = eos - STRUCTURAL.index("<|im_end|>") - 256
    between = semantic_start - (eos - 1 + len(STRUCTURAL) + SPEAKERS)
    after = vocab - semantic_start - SEMANTIC_CODES
    if min(before, between, after) < 0:
        raise ValueError(f"no byte tokenizer has <|im_end|> at {eos}, the semantic band at {semantic_start} and "
                         f"{vocab} ids")
    tokenizer = byte_tokenizer(before, between, after)
    assert token_ids(tokenizer) == {"semantic_start": semantic_start, "eos": eos, "vocab": vocab}
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
