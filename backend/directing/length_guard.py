"""The length guard: a take's frames are capped by its line's length, so a take that babbles
stops (the demo weights always run to max_new_tokens; a real model sometimes does).

The rule, with its constants:

    cap (seconds) = GUARD_BASE_S + GUARD_S_PER_CHAR × spoken characters
    cap (frames)  = ceil(cap seconds × the engine's frame rate), and at most the take's max_new_tokens

Design choices:
- Spoken characters are the line's text without speaker tags (`<|speaker:N|>`) and markup tags
  (`<whisper>`, `</whisper>`), with each run of white space counted once; bracketed cues
  (`[sighs]`, `[pause]`) count, since they take time too.
- GUARD_S_PER_CHAR is about three times ordinary speech (some 15 characters a second), and
  GUARD_BASE_S leaves room for a breath, a pause and the end of a short line ("No." gets 2.6 s):
  a take that passes the cap is not a slow reading of the line but something else.
- A take asks to be left unguarded with `length_guard: false` (the studio's per-take
  override); its max_new_tokens still holds. The cap is stored with the take (`guard_frames`),
  so a take that ends with `length` at exactly that many frames was stopped by the guard.
"""

from __future__ import annotations

import math
import re

GUARD_BASE_S = 2.0
GUARD_S_PER_CHAR = 0.2

_TAGS = re.compile(r"<\|speaker:\d+\|>|</?[A-Za-z][A-Za-z0-9_-]*>")
_SPACE = re.compile(r"\s+")


def spoken_characters(text: str) -> int:
    """The characters of a line that take time to say (see the module's rule)."""
    return len(_SPACE.sub(" ", _TAGS.sub(" ", text)).strip())


def guard_frames(text: str, frame_rate: float, max_new_tokens: int) -> int:
    """The most frames a take of `text` may have: the guard's cap, at most `max_new_tokens`."""
    seconds = GUARD_BASE_S + GUARD_S_PER_CHAR * spoken_characters(text)
    return min(max_new_tokens, math.ceil(seconds * frame_rate))
