"""The prompt of the line a director most likely takes next, to warm the prefix cache with.

    build = line_warm(store, session_id, next_line(store, session_id, after=kept_line_id), max_rows)
    engine_loop.warm(session_id, build)          # prefilled when a slot is idle (directing/loop.py)

Design choices:
- A take's prompt is the system message (the line's voice, or its character and the cast),
  the kept takes of the lines above it, then the line. It can be prefilled into the prefix
  cache before the take is asked for (Drama3Engine.warm). The server does it while the
  director reads: after a keep (the script's next line), after a voice or the cast is set,
  after the line to take next is written or edited, and when a session is opened or
  resumed (the first line with no kept take: after a restart the cache is cold, and a long
  scene's history is most of its first take's prefill).
- A line the script holds is prefilled with its text, so a take of it (the studio sends the
  script's text) restores its whole prompt and prefills nothing: its first audio is a
  retake's. A line not written yet (past the script's end) is warmed up to the end of its
  history only, hearing every kept take, in the session's voice; its placeholder text only
  decides, as a text does for the take, which oldest turns a long scene drops. A line
  edited later is warmed again (directing/session.py `set_line`); its history's snapshot
  still serves a take whose text differs from the script's.
- It is a guess: a director who takes another line loses only GPU time spent while no take
  waited (warms have the lowest priority, and one per session).
"""

from __future__ import annotations

from backend.directing.cast import history_turns, take_voice
from backend.directing.loop import Warm, WarmBuilder
from backend.store import Store
from engine import Drama3Engine, Sampling

PLACEHOLDER = "..."  # the text of a line not written yet (it is never prefilled)


def next_line(store: Store, session_id: str, after: str | None = None) -> str | None:
    """The line after `after` in the script; without `after`, the first line with no kept take.
    None: a new line at the end."""
    ids = store.line_ids(session_id)
    if after is not None:
        at = ids.index(after) + 1 if after in ids else len(ids)
        return ids[at] if at < len(ids) else None
    kept = set(store.kept_lines(session_id).values())
    return next((line_id for line_id in ids if line_id not in kept), None)


def line_warm(store: Store, session_id: str, line_id: str | None, max_rows: int | None) -> WarmBuilder:
    """The builder of the prompt a take of `line_id` (None: a new last line) would get."""
    texts = {line["line_id"]: line["text"] for line in store.lines(session_id)}
    written = texts.get(line_id or "")
    history_ids = store.kept_history(session_id, line_id) if line_id in texts else store.kept_history(session_id)
    _, _, voice = take_voice(store, session_id, line_id or "")  # (no line has the id "": the session's voice)
    found = store.takes_by_id(session_id, history_ids)
    heard = [found[take_id] for take_id in history_ids if take_id in found]
    turns = history_turns(store, session_id, heard, voice)

    def build(engine: Drama3Engine) -> Warm:
        prompt = engine.prompt(written or PLACEHOLDER, voice, turns, Sampling(max_new_tokens=1),
                               drop_oldest_history=True, max_rows=max_rows)
        return Warm(prompt, line=bool(written))

    return build
