"""The script's directing history, as the server owns it: which take of a line is kept, and what a
new take of each line hears.

Design choices:
- A line has at most one kept take, and the server enforces it: keeping a take un-keeps the
  line's other kept take (`keep` returns it, and the `history` reply announces it in
  `unkept`), so every client sees the same scene whatever it did locally.
- The history is computed here and nowhere else. The script's kept history (`history`) is
  every kept take of the script in script order (by line, then take id); a take of a line
  with history "kept" hears the kept takes of the lines above it, which is a prefix of that
  list, so each line's share is one number (`hears`): the client shows the first `hears`
  takes of `history`, and never works out the history itself.
- The kept flag of a take is written before the take of its line is un-kept: a crash in
  between leaves the line with two kept takes (nothing lost), never with none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from backend.directing.protocol import LineInfo
from backend.store import Store


@dataclass(frozen=True)
class KeptHistory:
    history: list[int]  # every kept take of the script, in script order
    hears: dict[str, int]  # line id -> how many of `history` a new take of the line hears


def kept_history(store: Store, session_id: str, lines: list[LineInfo] | None = None) -> KeptHistory:
    """The script's kept history and each line's share of it (`lines`: the script, if already read)."""
    history = store.kept_history(session_id)
    line_of = store.kept_lines(session_id)
    kept_per_line = Counter(line_of[take_id] for take_id in history)
    hears: dict[str, int] = {}
    heard = 0
    for line in store.lines(session_id) if lines is None else lines:  # in script order
        hears[line["line_id"]] = heard
        heard += kept_per_line[line["line_id"]]
    return KeptHistory(history, hears)
