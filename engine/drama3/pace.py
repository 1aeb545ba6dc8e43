"""How the engine keeps pace under load: steps, prefill and windows, as one log line.

    pace = Pace()                                   # the slot table's (slots.py)
    pace.step(seconds, decoding=12, prefilled=64, held=False, grouped=True)   # after each step (engine thread)
    pace.group(prompts=8)                           # a grouped prefill chunk (prefill_groups.py)
    pace.window(seconds, late=False, dry=False)     # each window's closed-to-PCM time (vocoder thread)
    pace.drain(seconds, cpu)                        # each of the vocoder's drains: how busy it was
    pace.call(ms)                                   # each codec call's time on the GPU (CUDA events)
    pace.turn(seconds, cpu, step=..., handed=...)   # each turn of the server's engine loop (its thread)
    pace.handed(seconds); pace.early(windows)       # each window's PCM-to-handed-out time; those out mid-step
    line = pace.report()                            # the numbers since the last report, then reset

A load test says what a director felt (first audio, gaps); this says why: whether the
steps ran long (and how many takes they carried), how many prompt rows went in beside
them (and in how many grouped chunks), how often the playback limit held a prompt back
(admission.py), and how long a
closed window waited for its audio (the vocoder's queue and its codec calls), how many the
vocoder made late (closed before their take's client would run dry, out after: a gap that is
the vocoder's), how many closed after it had (a gap that is the decode's), and how much of the period the
vocoder's worker spent decoding (near 100%: the vocoder is the queue; low: its windows wait on
the GPU or on being handed out). The server
logs a line every `REPORT_S` seconds while takes run (backend/directing/loop.py).

Design choices:
- Plain counters and lists, appended to by the engine thread (steps) and the vocoder's
  worker (windows), under one lock; a report reads and clears them, so nothing grows
  between reports and each line covers its own seconds.
- Percentiles are nearest-rank over that period's values (a few thousand at most).
- A server's engine loop also reports its turns: each turn's wall time (takes started, the
  engine's step, the events handed to the sessions), and the share of it its thread ran on a
  CPU (`time.thread_time`). At 64 directors on an H100 (stop 38) 358 steps took 10 s, ~28 ms
  a turn, while a step (its prefill and decode) took 14.7 ms p50: the turn says where the rest
  goes, and a low CPU share says the thread waited (the GIL, the GPU) rather than worked.
- The vocoder's drains say the same of its worker (its CPU share), and each codec call its
  time on the GPU, from an event before its copies to the event after its samples' copy on
  the vocoder's stream: against the graphs' replays alone (the server logs them at warm-up)
  it says how much the decode steps beside it slow it down. At 64 directors on an H100 (stop
  50) the vocoder was busy 94% for ~9.7 ms a window against 2.2-7.7 ms a replay alone, and
  nothing said whether the GPU or the host made the rest.
- Each window's wait from its PCM on the host to its hand-out (take.py), and how many went
  out while a step ran on the GPU (slots.py `hand_ready`): until stop 58 every window waited
  for the end of the step running when its PCM came, and "closed to audio" did not count it.
"""

from __future__ import annotations

import threading
import time

REPORT_S = 10.0  # seconds between two lines in the server's log


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class Pace:
    """Steps and windows since the last report."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since = time.monotonic()
        self.step_s: list[float] = []
        self.window_s: list[float] = []
        self.decoding = 0  # takes decoding, summed over the steps
        self.prefilled = 0  # prompt rows prefilled beside decoding takes
        self.held = 0  # steps in which the playback limit held back a waiting prompt
        self.yielded = 0  # steps in which a warm waited for the vocoder (slots.py `warms_yield`)
        self.drain_s: list[float] = []  # the vocoder's drains, each from its first launch to its last PCM
        self.drain_cpu = 0.0  # seconds the vocoder's worker ran on a CPU in those drains
        self.call_ms: list[float] = []  # each codec call's time on the GPU (none on a CPU)
        self.late = 0  # windows closed before their take's client would run dry, their PCM out after
        self.dry = 0  # windows closed after their take's client had run dry (the decode was late)
        self.cuts = 0  # windows closed early (take.py: a client short of audio)
        self.groups = self.grouped = 0  # grouped prefill chunks, and the prompts they carried
        self.group_step_s: list[float] = []  # the steps that ran a grouped chunk (what a group costs a step)
        self.carried_s: list[float] = []  # the steps that carried prompts' chunks (mixed.py)
        self.carried_rows = self.warm_rows = self.carried_prompts = 0  # the rows they carried (warms'), of prompts
        self.turn_s: list[float] = []  # the server's engine loop: each turn's wall time
        self.turn_step_s: list[float] = []  # of it, the engine's step (prefill, decode, windows out)
        self.turn_handed_s: list[float] = []  # of it, handing the takes' events to their sessions
        self.turn_cpu = 0.0  # seconds the loop's thread ran on a CPU in those turns
        self.handed_s: list[float] = []  # each window's wait from its PCM on the host to its hand-out
        self.handed_early = 0  # windows handed out while a step ran (slots.py `hand_ready`)

    def step(self, seconds: float, decoding: int, prefilled: int, held: bool, grouped: bool = False,
             yielded: bool = False) -> None:
        with self.lock:
            self.step_s.append(seconds)
            if grouped:
                self.group_step_s.append(seconds)
            self.decoding += decoding
            self.prefilled += prefilled
            self.held += held
            self.yielded += yielded

    def carried(self, seconds: float, rows: int, warm_rows: int, prompts: int = 1) -> None:
        """A step that carried `rows` of `prompts` prompts, `warm_rows` of them warms' (prefill-only takes')."""
        with self.lock:
            self.carried_s.append(seconds)
            self.carried_rows += rows
            self.warm_rows += warm_rows
            self.carried_prompts += prompts

    def group(self, prompts: int) -> None:
        with self.lock:
            self.groups += 1
            self.grouped += prompts

    def window(self, seconds: float, late: bool = False, dry: bool = False) -> None:
        with self.lock:
            self.window_s.append(seconds)
            self.late += late
            self.dry += dry

    def drain(self, seconds: float, cpu: float = 0.0) -> None:
        with self.lock:
            self.drain_s.append(seconds)
            self.drain_cpu += cpu

    def call(self, ms: float) -> None:
        with self.lock:
            self.call_ms.append(ms)

    def cut(self, windows: int) -> None:
        with self.lock:
            self.cuts += windows

    def turn(self, seconds: float, cpu: float, step: float, handed: float) -> None:
        with self.lock:
            self.turn_s.append(seconds)
            self.turn_step_s.append(step)
            self.turn_handed_s.append(handed)
            self.turn_cpu += cpu

    def handed(self, seconds: float) -> None:
        with self.lock:
            self.handed_s.append(seconds)

    def early(self, windows: int) -> None:
        with self.lock:
            self.handed_early += windows

    def report(self) -> str | None:
        """One line of what happened since the last report (None if no step ran), and reset."""
        with self.lock:
            steps, windows = self.step_s, self.window_s
            seconds, self.since = time.monotonic() - self.since, time.monotonic()
            decoding, prefilled, held, cuts, late, dry = (self.decoding, self.prefilled, self.held,
                                                          self.cuts, self.late, self.dry)
            yielded, self.yielded = self.yielded, 0
            drains, drain_cpu, calls = self.drain_s, self.drain_cpu, self.call_ms
            self.drain_s, self.drain_cpu, self.call_ms = [], 0.0, []
            groups, grouped, group_steps = self.groups, self.grouped, self.group_step_s
            carried, carried_rows, warm_rows = self.carried_s, self.carried_rows, self.warm_rows
            prompts, self.carried_prompts = self.carried_prompts, 0
            self.carried_s, self.carried_rows, self.warm_rows = [], 0, 0
            turns, turn_steps, handed, turn_cpu = self.turn_s, self.turn_step_s, self.turn_handed_s, self.turn_cpu
            self.turn_s, self.turn_step_s, self.turn_handed_s, self.turn_cpu = [], [], [], 0.0
            handed_s, early, self.handed_s, self.handed_early = self.handed_s, self.handed_early, [], 0
            self.step_s, self.window_s, self.group_step_s = [], [], []
            self.decoding = self.prefilled = self.held = self.groups = self.grouped = 0
            self.cuts = self.late = self.dry = 0
        if not steps:
            return None
        line = (f"pace: {seconds:.1f} s: {len(steps):,} steps (p50 {percentile(steps, 0.5) * 1000:.1f} ms, p95 "
                f"{percentile(steps, 0.95) * 1000:.1f} ms), {decoding / len(steps):.1f} takes decoding a step, "
                f"{prefilled:,} prompt rows prefilled beside them, {held:,} steps held a prompt back for playback")
        if yielded:
            line += f", {yielded:,} held a warm back for the vocoder"
        if groups:
            line += f"; {groups:,} grouped prefill chunks of {grouped / groups:.1f} prompts"
            if group_steps:
                line += f" (steps with one p50 {percentile(group_steps, 0.5) * 1000:.1f} ms)"
        if carried:
            line += (f"; {len(carried):,} steps carried prompts' chunks (p50 {percentile(carried, 0.5) * 1000:.1f} "
                     f"ms; {prompts / len(carried):.1f} prompts a step; {carried_rows:,} rows, {warm_rows:,} of "
                     f"them warms')")
        if windows:
            line += (f"; {len(windows):,} windows ({cuts:,} closed early) in "
                     f"{len(drains):,} drains, closed to audio "
                     f"p50 {percentile(windows, 0.5) * 1000:.1f} ms, p95 {percentile(windows, 0.95) * 1000:.1f} ms, "
                     f"{late:,} made late by the vocoder, {dry:,} closed after their client ran dry")
        if handed_s:
            line += (f"; handed out p50 {percentile(handed_s, 0.5) * 1000:.1f} ms, p95 "
                     f"{percentile(handed_s, 0.95) * 1000:.1f} ms after their audio, {early:,} while a step ran")
        if drains:
            line += (f"; vocoder busy {100 * sum(drains) / max(seconds, 1e-9):.0f}% (drain p50 "
                     f"{percentile(drains, 0.5) * 1000:.1f} ms, p95 {percentile(drains, 0.95) * 1000:.1f} ms; "
                     f"its thread on a CPU {100 * drain_cpu / max(sum(drains), 1e-9):.0f}% of them)")
            if calls:
                line += (f"; {len(calls):,} codec calls on the GPU p50 {percentile(calls, 0.5):.1f} ms, "
                         f"p95 {percentile(calls, 0.95):.1f} ms")
        if turns:
            line += (f"; {len(turns):,} turns of the engine loop (p50 {percentile(turns, 0.5) * 1000:.1f} ms, p95 "
                     f"{percentile(turns, 0.95) * 1000:.1f} ms; engine step p50 "
                     f"{percentile(turn_steps, 0.5) * 1000:.1f} ms, events handed p50 "
                     f"{percentile(handed, 0.5) * 1000:.1f} ms), its thread on a CPU "
                     f"{100 * turn_cpu / max(sum(turns), 1e-9):.0f}% of them")
        return line
