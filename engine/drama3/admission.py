"""How many prompt rows a step may prefill while takes decode, so admission never stalls them.

    budget = Admission(frame_s=2048 / 44100)
    rows = budget.rows()                  # prompt rows to prefill before this step's frame
    ... prefill about `rows` rows, decode one frame, read the status ...
    budget.record(step_s, rows_prefilled) # the step's wall time (prefill + frame, GPU work included)

Every decoding take gains one frame per step; a frame plays for `frame_s` (46 ms at
44.1 kHz). A step that takes longer than a frame makes every take fall behind real time,
so a new director's prompt is prefilled only as far as fits beside the frame.

Design choices:
- A step's wall time is modelled as `decode_s + rows * row_s`: `decode_s` from the steps
  that prefilled nothing, `row_s` from the others (exponential averages of both, so a
  change of load is followed within a few steps). The wall time is measured by the slot
  table from before its prefill chunks to the status read, which waits for the GPU
  (pinned copy, event polled): it includes the GPU time of both, and whatever the
  vocoder thread's windows took from them.
- The budget is the rows that keep a step within `share` (3/4) of a frame: the rest is
  slack for the vocoder's windows and the host. At least `min_rows` (a prompt is always
  admitted, if slowly), at most `max_rows`. Chunks are the prefill's own (prefill.py: at
  least one chunk runs), so a step can exceed its budget by less than one chunk.
- Before anything is measured the budget is `start_rows` (512: what the slot table
  prefilled per step before it was adaptive).
"""

from __future__ import annotations

from dataclasses import dataclass

START_ROWS = 512
SMOOTHING = 0.2  # weight of the newest step in the averages


@dataclass
class Admission:
    frame_s: float  # audio one frame plays for
    share: float = 0.75  # of a frame a step may take, prefill included
    start_rows: int = START_ROWS
    min_rows: int = 16
    max_rows: int = 4096
    decode_s: float | None = None  # a step that prefills nothing
    row_s: float | None = None  # one prompt row's prefill, beside a step

    def rows(self) -> int:
        """Prompt rows to prefill in the next step while takes decode."""
        if self.decode_s is None or self.row_s is None:
            return self.start_rows
        spare = self.share * self.frame_s - self.decode_s
        rows = spare / self.row_s if self.row_s > 0 else self.max_rows
        return int(min(self.max_rows, max(self.min_rows, rows)))

    def record(self, step_s: float, rows: int) -> None:
        """A step of `step_s` seconds (prefill chunks, the frame, the status read) that
        prefilled `rows` prompt rows while takes decoded."""
        if rows <= 0:
            self.decode_s = step_s if self.decode_s is None else average(self.decode_s, step_s)
        elif self.decode_s is not None:
            per_row = max(0.0, step_s - self.decode_s) / rows
            self.row_s = per_row if self.row_s is None else average(self.row_s, per_row)


def average(old: float, new: float) -> float:
    return (1 - SMOOTHING) * old + SMOOTHING * new
