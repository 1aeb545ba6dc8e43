"""The streaming-state protocol of PersonaPlex's modules (moshi's `StreamingModule`).

    mimi.setup_streams(batch)   # every streaming module in the tree: fresh state for `batch` rows
    mimi.reset_streams(rows)    # rows (bool [B]) start fresh streams; the other rows keep theirs

Design choices:
- A module that carries state from one call to the next subclasses `StreamingModule`
  and implements two hooks on its own state only: `_setup_stream(batch)` allocates
  static per-row buffers (a step reads and writes the same tensors every call, so it can
  be captured as a CUDA graph) and `_reset_stream(rows)` restarts chosen rows in place.
  The two public verbs walk the module tree, so a container (Mimi, Helium, the
  depformer) streams by composition and never reaches into a child's state.
- Rows are batch rows, i.e. PersonaPlex's slots. Which rows restart is data (a bool
  mask), so a reset never reallocates and never disturbs the other rows.
- A module whose history is hidden by positions its caller owns (the attention rings:
  a position below 0 is never visible, layers.py) needs nothing on reset; its
  `_reset_stream` is the default, which does nothing.
- Held rows: inside `holding(advancing)` every module of the tree reads one static mask
  (bool [B], rewritten by the caller between calls, read inside captured graphs), and a
  call moves on the state of the marked rows only (`kept`); the others compute, their
  output is thrown away and their streams stay as they were. Outside it every row moves.
  So a batched tick can carry only the conversations that have a frame
  (backend/conversation/loop.py). A ring written at a held row's next positions needs
  nothing: the row's real call writes the same positions before anything reads them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class StreamingModule(nn.Module):
    """A module with per-row state carried across calls (see the module docstring)."""

    advancing: torch.Tensor | None = None  # bool [B]: the rows whose streams a call moves on (None: all)

    @contextlib.contextmanager
    def holding(self, advancing: torch.Tensor) -> Iterator[None]:
        """Calls inside move on the streams of the rows marked in `advancing` (bool [B]) only."""
        modules = [module for module in self.modules() if isinstance(module, StreamingModule)]
        for module in modules:
            module.advancing = advancing
        try:
            yield
        finally:
            for module in modules:
                module.advancing = None

    def kept(self, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """A state update: `new` in the advancing rows, `old` in the held ones (rows first, a bucket's B)."""
        if self.advancing is None:
            return new
        rows = self.advancing[:new.shape[0]].view(-1, *([1] * (new.dim() - 1)))
        return torch.where(rows, new, old)

    def setup_streams(self, batch: int) -> None:
        """Fresh streams for `batch` rows in every streaming module of this tree (allocates)."""
        for module in self.modules():
            if isinstance(module, StreamingModule):
                module._setup_stream(batch)

    def reset_streams(self, rows: torch.Tensor) -> None:
        """Fresh streams for the rows marked in `rows` (bool [B]), in place; other rows keep theirs."""
        for module in self.modules():
            if isinstance(module, StreamingModule):
                module._reset_stream(rows)

    def _setup_stream(self, batch: int) -> None:
        """Allocate this module's own per-row state (none by default)."""

    def _reset_stream(self, rows: torch.Tensor) -> None:
        """Restart this module's own state in the marked rows (nothing by default)."""
