"""Checks on the text a user writes, and the speaker tag every spoken text carries.

Design choices:
- White space is the Unicode White_Space property, spelled out below. `str.strip()`
  with no argument also strips U+001C..U+001F, which would let a line of separators
  through the empty check and move a speaker tag that should stay put.
- Only the prompt builder writes structural tokens (`<|im_start|>`, `<|voice|>`, ...);
  a user who types one gets an error instead of a prompt with a forged turn.
- Speaker tags are `<|speaker:N|>` with N in 0..15 and no leading zero (the spellings
  the tokenizer has). Like the seed and sglang-omni 0.1.9, only speaker 0 is accepted.
- Every message names the field and says what to change; all are `RequestError`s.
"""

from __future__ import annotations

import re

from engine.errors import RequestError

UNICODE_WHITE_SPACE = "".join(map(chr, (
    *range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
    0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
)))
STRUCTURAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|voice|>", "<|text|>", "<|interleave|>", "<|semantic:")
MAX_SPEAKER_ID = 15
SPEAKER_TAG_PATTERN = re.compile(r"<\|speaker:(0|[1-9][0-9]?)\|>")
SPEAKER_MARKER = "<|speaker"


def check_text(value: object, location: str) -> str:
    """`value` unchanged if it is speakable caller text; else a RequestError naming `location`."""
    if not isinstance(value, str):
        raise RequestError(f"{location} must be a string; got {type(value).__name__}")
    if not value.strip(UNICODE_WHITE_SPACE):
        raise RequestError(f"{location} is empty; write some text")
    for token in STRUCTURAL_TOKENS:
        if token in value:
            raise RequestError(f"{location} contains {token}, which only the prompt builder may write; remove it")
    speakers = set()
    for marker in re.finditer(re.escape(SPEAKER_MARKER), value):
        tag = SPEAKER_TAG_PATTERN.match(value, marker.start())
        if tag is None or int(tag.group(1)) > MAX_SPEAKER_ID:
            raise RequestError(f"{location} has a malformed speaker tag; write <|speaker:N|> with N in "
                               f"0..{MAX_SPEAKER_ID} and no leading zero")
        speakers.add(int(tag.group(1)))
    if speakers - {0}:
        raise RequestError(f"{location}: only speaker 0 is supported; got speaker tags "
                           f"{sorted(speakers - {0})}; use <|speaker:0|> or no tag")
    return value


def check_line(value: object, location: str) -> str:
    """A single-line field (a character's name, description or scene), stripped."""
    if not isinstance(value, str) or not value.strip(UNICODE_WHITE_SPACE):
        raise RequestError(f"{location} must be a non-empty string")
    if "\n" in value or "\r" in value:
        raise RequestError(f"{location} must be a single line; remove the line breaks")
    return check_text(value, location).strip(UNICODE_WHITE_SPACE)


def with_speaker_tag(text: str) -> str:
    """`text` led by a speaker tag: `<|speaker:0|> ` is prefixed unless a tag already
    leads it after white space."""
    if SPEAKER_TAG_PATTERN.match(text.lstrip(UNICODE_WHITE_SPACE)) is None:
        return f"<|speaker:0|> {text}"
    return text


def reference_transcript(transcript: str) -> str:
    """A reference transcript as it follows "Text: ": the speaker tag first, then any
    white space that preceded the tag, then the rest."""
    tagged = with_speaker_tag(transcript)
    body = tagged.lstrip(UNICODE_WHITE_SPACE)
    tag = SPEAKER_TAG_PATTERN.match(body)
    assert tag is not None  # with_speaker_tag guarantees one
    leading = tagged[: len(tagged) - len(body)]
    return tag.group(0) + leading + body[tag.end():]
