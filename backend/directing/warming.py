"""The next line's prompt, to warm the prefix cache with when a take is kept.

    build = next_line_warm(store, session_id, kept_line_id, max_rows)   # on the store's thread
    engine_loop.warm(session_id, build)                                 # prefilled when a slot is idle

Design choices:
- After a keep, the scene's next take is most likely of the script's next line, and that
  line's prompt shares everything before its own text: the system message (its voice, or
  its character and the cast) and the kept takes above it. The engine prefills that much
  into the prefix cache while the director reads (Drama3Engine.warm), so the line's first
  audio pays for its own rows only. The line's text is not prefilled (the warm stops
  before it); it only decides, as for the take, which oldest turns a long scene drops.
- Past the script's last line, the next line is a new one at the end: it hears every kept
  take, in the session's voice.
- It is a guess: a director who retakes the kept line or jumps elsewhere loses only GPU
  time spent while no take waited (directing/loop.py gives warms the lowest priority).
"""

from __future__ import annotations

from backend.directing.cast import history_turns, take_voice
from backend.directing.loop import WarmBuilder
from backend.store import Store
from engine import Drama3Engine, Prompt, Sampling

PLACEHOLDER = "..."  # the text of a line not written yet (it is never prefilled)


def next_line_warm(store: Store, session_id: str, line_id: str, max_rows: int | None) -> WarmBuilder:
    """The prompt builder of the line after `line_id` in the script (or of a new last line)."""
    script = store.lines(session_id)
    ids = [line["line_id"] for line in script]
    after = ids.index(line_id) + 1 if line_id in ids else len(ids)
    if after < len(script):
        next_id, text = script[after]["line_id"], script[after]["text"] or PLACEHOLDER
        history_ids = store.kept_history(session_id, next_id)
    else:
        next_id, text = "", PLACEHOLDER  # (no line has that id: the session's voice)
        history_ids = store.kept_history(session_id)
    _, _, voice = take_voice(store, session_id, next_id)
    heard = [take for take_id in history_ids if (take := store.take(session_id, take_id)) is not None]
    turns = history_turns(store, session_id, heard, voice)

    def build(engine: Drama3Engine) -> Prompt:
        return engine.prompt(text, voice, turns, Sampling(max_new_tokens=1), drop_oldest_history=True,
                             max_rows=max_rows)

    return build
