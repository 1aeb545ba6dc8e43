"""How many prompt rows a step may prefill while takes decode, so admission never stalls them;
which chunk a decode step may carry (`Carrying`: mixed.py) by the same limits.

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
- Playback (`playback_limit`): a take's audio reaches the client a window at a time, and
  the stream's windows grow (4, 10, 20, 32, 64 frames...), so a take early in its stream
  must run faster than real time to send its next window before the audio it has sent
  runs out: from 32 frames sent to the window at 64, 32 frames must decode while at
  most 32 play, so any step above 46 ms less the vocode makes it stall, and 3/4 of a frame is
  not enough. The slot table knows, for every take playing, the audio it has sent ahead
  of playback and the frames still to decode before its next window; the step may not
  be longer than the tightest of those allows (counting two more steps for the window's
  vocode and hand-out), and the prefill gets only what is left. Where nothing is left, no prompt
  row is prefilled in that step (a chunk is never cut, so even `min_rows` could cost a
  playing take its audio): the playing takes gain on playback with every such step, so
  the new prompt is admitted a few steps later. Not much later: a prompt held back for
  `HELD_S` gets `min_rows` a step whatever the limit (the slot table's choice). Measured on
  the H200 (docs/perf.md), 16 / 64 directors starting at once: the limit alone, first audio
  p95 1.9 / 12.9 s and longest gap p95 44 ms / 1.5 s; held 1 s at most, 1.3 / 2.7 s and
  288 ms / 4.0 s. 2 s lies between (not measured): it keeps 16 directors' playback whole
  (their waits were mostly under 2 s) and bounds the wait at 64. Only while they can gain: where the
  decode step alone takes 3/4 of a frame or more (an overloaded GPU, a CPU), the limit
  would hold every new prompt until the playing takes end, so it is not applied and
  the budget is the plain one (at least `min_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

START_ROWS = 512
SMOOTHING = 0.2  # weight of the newest step in the averages
HAND_OUT_STEPS = 2  # steps from a window's last frame to its audio leaving: its vocode, its hand-out
HELD_S = 2.0  # a prompt the playback limit held back this long gets `min_rows` a step anyway


@dataclass
class Admission:
    frame_s: float  # audio one frame plays for
    share: float = 0.75  # of a frame a step may take, prefill included
    start_rows: int = START_ROWS
    min_rows: int = 16
    max_rows: int = 4096
    decode_s: float | None = None  # a step that prefills nothing
    row_s: float | None = None  # one prompt row's prefill, beside a step

    def rows(self, limit_s: float | None = None) -> int:
        """Prompt rows to prefill in the next step while takes decode; `limit_s`: the longest
        step the takes playing allow (`playback_limit`), None when none is playing."""
        target = self.share * self.frame_s
        gaining = self.decode_s is None or self.decode_s < target  # steps alone outpace playback
        if limit_s is not None and limit_s < target and gaining:  # a playing take's next window sets the pace
            spare = limit_s - (self.decode_s or 0.0)
            if self.row_s is None:  # rows not measured yet: a few, which measure them
                return self.min_rows if spare > 0 else 0
            rows = spare / self.row_s if self.row_s > 0 else self.max_rows
            return 0 if rows < self.min_rows else int(min(self.max_rows, rows))
        if self.decode_s is None or self.row_s is None:
            return self.start_rows
        rows = (target - self.decode_s) / self.row_s if self.row_s > 0 else self.max_rows
        return int(min(self.max_rows, max(self.min_rows, rows)))

    def record(self, step_s: float, rows: int) -> None:
        """A step of `step_s` seconds (prefill chunks, the frame, the status read) that
        prefilled `rows` prompt rows while takes decoded."""
        if rows <= 0:
            self.decode_s = step_s if self.decode_s is None else average(self.decode_s, step_s)
        elif self.decode_s is not None:
            per_row = max(0.0, step_s - self.decode_s) / rows
            self.row_s = per_row if self.row_s is None else average(self.row_s, per_row)


@dataclass
class Carrying:
    """Which chunk a decode step may carry (mixed.py), under the same limits as `Admission.rows`.

    A carried chunk's cost hardly follows its rows (on an H100 beside 64 decoding rows a
    64-row chunk added 12.5 ms to the step, a 256-row one 16.6: its own ~2,000 kernels,
    not its rows), so each chunk size's cost beyond the step alone is measured apart
    (`extra_s`, an exponential average) instead of a cost per row. Without a playing take's
    limit the largest size rides every step: a step with a chunk still beats the step and
    the chunk apart. Under one, the largest size whose step fits it; an unmeasured size
    fits where any time is left (which measures it); none fits: the prompt waits a step
    (the slot table's HELD_S still applies)."""

    admission: Admission  # its `decode_s`, the step alone, and its share of a frame
    extra_s: dict[int, float] = field(default_factory=dict)  # by chunk size

    def record(self, size: int, step_s: float) -> None:
        """A step of `step_s` seconds that carried a chunk of `size` rows."""
        if self.admission.decode_s is None:
            return
        extra = max(0.0, step_s - self.admission.decode_s)
        self.extra_s[size] = average(self.extra_s[size], extra) if size in self.extra_s else extra

    def size(self, sizes: Sequence[int], limit_s: float | None = None) -> int | None:
        """The largest of `sizes` the next step may carry; None: none (the prompt waits)."""
        admission = self.admission
        decode_s = admission.decode_s or 0.0
        gaining = admission.decode_s is None or decode_s < admission.share * admission.frame_s
        if limit_s is None or limit_s >= admission.share * admission.frame_s or not gaining:
            return max(sizes)
        spare = limit_s - decode_s
        fits = [size for size in sizes if (self.extra_s[size] <= spare if size in self.extra_s else spare > 0)]
        return max(fits, default=None)


@dataclass(frozen=True)
class Playing:
    """A take whose first audio is out: how far its sent audio is ahead of playback, and the
    frames to decode before its next window closes."""

    ahead_s: float  # audio its client has yet to play: handed out and not played yet, or vocoding
    frames: int  # frames still to decode before its next window (>= 1)


def playback_limit(playing: list[Playing]) -> float | None:
    """The longest step that still lets every playing take's next window out before the audio it
    sent has played (None: no take is playing; <= 0: one is already late). A window's frames
    decode in `frames` steps, then it vocodes beside the next step and is handed out after
    it: `frames + HAND_OUT_STEPS` steps in all."""
    if not playing:
        return None
    return min(take.ahead_s / (max(1, take.frames) + HAND_OUT_STEPS) for take in playing)


def average(old: float, new: float) -> float:
    return (1 - SMOOTHING) * old + SMOOTHING * new
