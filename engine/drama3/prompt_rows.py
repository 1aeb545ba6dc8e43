"""The rows of a prompt's parts, laid out once: a retake does not tokenise its history again.

    cache = PromptRows(functools.partial(segment_rows, tokenizer=tokenizer, config=config))
    rows = cache.rows(history_segments(turn, character))   # a hit after the first take of the scene
    build_prompt(..., rows=cache.rows)                      # every part of a prompt through it

Why: a take's prompt is rebuilt from the session's history at every take, and laying a part
out costs a tokeniser call per string segment and a few small tensors per part: on 2 CPU
cores ~0.11 ms a history turn, 5.8 ms for a prompt with 4,000 rows of history (48 turns)
against 0.17 ms with none. That time is the take's (`prompt_ms`, in its first audio), so
a long scene's retake paid it on top of a restored prefix (`retake bench retake`).

Design choices:
- A part (the system message, a history turn, the line) is keyed by what it holds: its
  strings, and its codes' shape and bytes. A turn whose codes or text change is another
  key, so a stale layout is never used; nothing is invalidated by hand.
- The cached tensors are only read: a prompt is the concatenation of its parts (a new
  tensor), so no caller can change a cached part through it.
- Least recently used parts are dropped past `max_rows` rows held (with their keys, ~180
  bytes a row), so the cache stays a few tens of MB however many scenes pass through it.
- One engine's cache serves every thread that builds prompts (a lock around the table;
  the layout itself runs outside it).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch
from numpy.typing import NDArray

MAX_ROWS = 250_000  # rows held: ~22 MB of rows and ~20 MB of keys
Key = tuple[object, ...]
Segment = str | NDArray[np.int64]  # prompt.py's: a string, or codes [num_codebooks, frames]


class PromptRows:
    """Rows [R, 1 + num_codebooks] of prompt parts, by their segments (LRU)."""

    def __init__(self, layout: Callable[[Sequence[Segment]], torch.Tensor], max_rows: int = MAX_ROWS) -> None:
        self.layout, self.max_rows = layout, max_rows  # layout: prompt.py's segment_rows, its tokeniser bound
        self.parts: collections.OrderedDict[Key, torch.Tensor] = collections.OrderedDict()
        self.held = 0  # rows in `parts`
        self.hits = self.misses = 0
        self.lock = threading.Lock()

    def rows(self, segments: Sequence[Segment]) -> torch.Tensor:
        """The rows of these segments (read only: a prompt concatenates them into its own)."""
        key = tuple(s if isinstance(s, str) else (s.shape, np.ascontiguousarray(s).tobytes()) for s in segments)
        with self.lock:
            found = self.parts.get(key)
            if found is not None:
                self.parts.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
        rows = self.layout(segments)
        with self.lock:
            if key not in self.parts and len(rows) <= self.max_rows:
                self.parts[key] = rows
                self.held += len(rows)
                while self.held > self.max_rows:
                    _, dropped = self.parts.popitem(last=False)
                    self.held -= len(dropped)
        return rows
