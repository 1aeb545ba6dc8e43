"""How the conversation loop keeps its tick under load, as one log line every REPORT_S seconds.

    pace = TickPace()
    pace.tick(step_s=0.072, wait_s=0.006, heard=48, prompting=0, chunk=False)   # after each tick (engine thread)
    line = pace.report()          # "converse pace: 10.0 s: 310 ticks (step p50 30.4 ms, ...)", then reset

The load test (`retake loadtest --converse`) says what a caller felt (tick latency, gaps);
this says why: whether the tick itself (the engine's step: Mimi in, the model, Mimi out, and
the host's work around it) outgrew what the conversations need, how long the loop waited
for audio between ticks, and how many conversations each tick carried (heard: a frame of
their user's; or still reading their system prompt), and what the ticks that also read a
chunk of a joining conversation's system prompt cost (a join delays the others' tick by
that much), the conversations started between ticks (the ticks wait for their starts), and
the frames still queued for a conversation after a tick took its own (a backlog drains at a
frame a tick: above 0, some user waits more than a tick). Ticks run as frames arrive (loop.py),
so with N talking conversations and ticks of S ms a tick hears about N x S / 80 of them.

Design choices:
- Lists and counters kept by the engine thread alone (no lock): the report is read on the
  same thread, between ticks.
- Percentiles as engine/drama3/pace.py's (nearest rank over the period's values).
"""

from __future__ import annotations

import time

from engine.drama3.pace import percentile


class TickPace:
    """The conversation loop's ticks since the last report."""

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.step_s: list[float] = []  # each tick's engine step, wall time on the engine thread
        self.wait_s: list[float] = []  # from the previous tick's end to this tick's start
        self.heard = self.prompting = 0  # summed over the ticks
        self.chunk_step_s: list[float] = []  # the steps that also read a chunk of a system prompt
        self.backlog: list[float] = []  # frames still queued for a listening conversation after each tick took its own
        self.start_s: list[float] = []  # each batch of joins started between two ticks
        self.starts = 0  # conversations started

    def tick(self, step_s: float, wait_s: float, heard: int, prompting: int, chunk: bool = False,
             backlog: int = 0) -> None:
        if chunk:
            self.chunk_step_s.append(step_s)
        self.backlog.append(backlog)
        self.step_s.append(step_s)
        self.wait_s.append(wait_s)
        self.heard += heard
        self.prompting += prompting

    def started(self, conversations: int, seconds: float) -> None:
        """`conversations` joins started between two ticks in `seconds` (the ticks waited as long)."""
        self.starts += conversations
        self.start_s.append(seconds)

    def report(self) -> str | None:
        """One line of the ticks since the last report (None if none ran), and reset."""
        steps, waits, chunks, backlog = self.step_s, self.wait_s, self.chunk_step_s, self.backlog
        starts, start_s = self.starts, self.start_s
        seconds, self.since = time.monotonic() - self.since, time.monotonic()
        heard, prompting = self.heard, self.prompting
        self.step_s, self.wait_s, self.chunk_step_s, self.backlog, self.start_s = [], [], [], [], []
        self.heard = self.prompting = self.starts = 0
        if not steps:
            return None
        ticks = len(steps)
        return (f"converse pace: {seconds:.1f} s: {ticks:,} ticks (step p50 {percentile(steps, 0.5) * 1000:.1f} ms, "
                f"p95 {percentile(steps, 0.95) * 1000:.1f} ms; waiting between ticks p50 "
                f"{percentile(waits, 0.5) * 1000:.1f} ms, p95 {percentile(waits, 0.95) * 1000:.1f} ms), "
                f"{heard / ticks:.1f} conversations heard and {prompting / ticks:.1f} reading their system prompt "
                f"a tick, {heard:,} frames heard"
                + (f"; {len(chunks):,} ticks also read a system prompt chunk (step p50 "
                   f"{percentile(chunks, 0.5) * 1000:.1f} ms, max {max(chunks) * 1000:.1f} ms)" if chunks else "")
                + (f"; {starts:,} conversations started between ticks (a batch p50 "
                   f"{percentile(start_s, 0.5) * 1000:.1f} ms, max {max(start_s) * 1000:.1f} ms)" if starts else "")
                + (f"; frames queued behind a tick p95 {percentile(backlog, 0.95):.0f}, max {max(backlog):.0f}"
                   if max(backlog) else ""))
