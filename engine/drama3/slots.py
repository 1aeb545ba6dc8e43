"""The slot table: takes started into a Decoder's free slots and advanced together, one
batched step at a time.

    slots = Slots(decoder, codec, first_window=None, executor=vocoder, graphs=window_graphs)
    take = slots.start(prompt, deadline, cancelled)   # into a free slot; its prefill runs in the steps
    for take, events in slots.step(): ...             # prefill chunks, then one frame for every decoding take
    for event in slots.generate(take): ...            # one take alone: its events to Done

Design choices (nano-vllm's scheduler/model_runner split, moshi-server's fixed slots):
- Fixed slots, one per Decoder row. `start` takes the free slot that holds most of the
  prompt's prefix already (prefix.py), else the lowest; which take to
  start, and when, is the caller's choice (the backend loop picks earliest deadline
  first). Its prompt is prefilled by the next steps, a few chunks per step while other
  takes decode: as many rows as keep a step within most of a frame's duration, measured
  as the steps go (admission.py), so a new director never makes the others fall behind
  real time, nor a take whose stream just began run out of audio before its next window
  (admission.py's playback limit); `prefill_rows` fixes the rows per step instead. With no
  take decoding, a step runs the whole prefill at once. Prompts waiting for their prefill
  go in start order; where groups are on (prefill_groups.py), the next chunks of several
  waiting prompts run as one batched chunk first, counted in the budget as their longest
  chunk; so do the warms' (prefill-only takes below) with what the takes leave.
- `step` polls every decoding take's stop rules (cancel, deadline), runs one decode step
  for all slots at the KV bucket of the furthest take, reads every slot's status in one
  host read (pinned, event polled: it never holds up the vocoder thread's launches), and
  hands each take its row. A take that ends frees its slot at once; its last windows
  vocode while the others decode (with none decoding, `step` waits for them). While the
  host waits for the GPU, windows the vocoder finished go out (`hand_ready`; Done after the
  step): on stop 57's H100 a step took 13-35 ms at 48 directors, and each window waited.
- One take's failure ends that take only; the shared step's ends the takes in it.
- A prefill-only take (`start(..., stop=row)`, Drama3Engine.warm) prefills a prompt up to
  one of its cuts (its last boundary: prefill.py `cuts`) or its end for the prefix cache's
  snapshots, then ends "prefilled" with no frames and frees its slot. It never delays a
  take: the takes' prompts are prefilled first, and its own chunks are budgeted even with
  nothing decoding, so a take started next waits one step's chunks at most.
- Mixed steps (mixed.py, on where chunks are graphs): while takes decode, the step itself
  carries the next chunk of the first waiting prompt instead (`carried`), its experts read
  once with the decoding rows'; a take's prompt rides every step, a warm's what the playing
  takes allow (admission.py `Carrying`). Grouped (`--mixed-step groups`): the next chunks
  of up to 8 waiting takes ride one step (warms in the rows they leave, alone one a step).
  Where its chunk has no mixed size (near the cache's end) the prefill runs apart as above.
- A prompt restored whole by the prefix cache decodes from this step whatever the budget
  (`restored`): on stop 57's H100, 40 of the 47 first audios over 250 ms at 48 listening
  directors had waited 150-782 ms so, held back by the playback limit with nothing to run.
- Warms yield to the vocoder (`warms_yield`; off: no clear gain on stop 55's H100): while a
  window in the vocoder's queue is due within the next steps, no warm's chunk runs beside.
- Early windows (take.py, `early_windows`): each take plans its windows with the longest of
  the last PACE_STEPS steps' wall times.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass

import torch

from engine.drama3.admission import HAND_OUT_STEPS, HELD_S, Admission, Carrying, playback_limit
from engine.drama3.codec import Codec
from engine.drama3.codec_graphs import WindowGraphs
from engine.drama3.decoder import Decoder
from engine.drama3.pace import Pace
from engine.drama3.prefill import BESIDE_ROWS, Prefill
from engine.drama3.prompt import Prompt
from engine.drama3.stream import StreamSchedule
from engine.drama3.take import AudioWindow, Done, Take
from engine.drama3.vocoder import Vocoder

Events = list[AudioWindow | Done]
Hand = Callable[[list[tuple[Take, Events]]], None]  # takes' windows, handed out while a step runs

log = logging.getLogger("retake.engine")
PACE_STEPS = 8  # steps whose longest wall time early windows plan with (take.py)


@dataclass
class Carry:
    """What the next decode step carries (mixed.py): the next chunks of `prompts`, as a group
    where there are several, else the first's first `rows` rows (0: it is held back this step)
    in the chunk of `size` rows (a group: its shape's rows, admission.py `Carrying`'s key)."""

    prompts: list[tuple[Take, Prefill]]
    rows: int
    size: int


class Slots:
    """Takes in the slots of one Decoder; owned by one thread."""

    def __init__(self, decoder: Decoder, codec: Codec, *, first_window: int | None,
                 executor: Executor | None = None, graphs: WindowGraphs | None = None,
                 prefill_rows: int | None = None, early_windows: bool = False,
                 vocoder_order: str = "deadline", warms_yield: bool = False) -> None:
        self.decoder, self.codec = decoder, codec
        self.pace = Pace()  # steps and windows, for the server's log (pace.py)
        # every take's windows, on its thread, the most urgent first (vocoder.py `order`)
        self.vocoder = Vocoder(codec, graphs, executor, self.pace, order=vocoder_order)
        self.held = self.yielded = False  # this step held a prompt back for playback; a warm for the vocoder
        self.beside = self.beside_warm = 0  # prompt rows this step prefilled beside decoding takes (warms')
        self.first_window, self.early_windows = first_window, early_windows  # take.py: its first window; cuts
        self.warms_yield = warms_yield  # warms wait while the vocoder has a window due (`vocoder_due`)
        self.recent: collections.deque[float] = collections.deque(maxlen=PACE_STEPS)  # the last steps' wall times
        self.prefill_rows = prefill_rows  # prompt rows per step while takes decode; None: `admission`'s
        self.admission = Admission(frame_s=codec.frame_samples / codec.sample_rate)
        self.carrying = Carrying(self.admission)  # which chunk a step may carry (mixed steps on)
        self.takes: list[Take | None] = [None] * decoder.num_slots  # the take of each slot (prefilling or decoding)
        self.prefills: dict[Take, Prefill] = {}  # takes whose prompt is not all prefilled yet, in start order
        self.closing: list[Take] = []  # ended, slot free, last windows still to hand out
        self.looked = 0  # the vocoder's windows decoded when `hand_ready` last looked

    @property
    def free_slots(self) -> int:
        return self.takes.count(None)

    @property
    def in_flight(self) -> int:
        """Takes decoding or closing: started, Done not handed out yet."""
        return len(self.takes) - self.free_slots + len(self.closing)

    @property
    def idle(self) -> bool:
        return self.in_flight == 0

    def decoding(self) -> list[Take]:
        """The takes whose prompt is prefilled and whose frames are decoding."""
        return [take for take in self.takes if take is not None and take not in self.prefills]

    def started(self) -> list[Take]:
        """Every take in a slot: prefilling or decoding."""
        return [take for take in self.takes if take is not None]

    @torch.inference_mode()
    def start(self, prompt: Prompt, deadline: float | None = None,
              cancelled: Callable[[], bool] | None = None, stop: int | None = None) -> Take:
        """Start `prompt` in a free slot (the next steps prefill it): the one holding most of its
        prefix (decoder.py `pick_slot`), else the lowest. A take already cancelled or past its
        deadline ends without a slot; a prompt that cannot be prefilled ends the take as an error.
        With `stop` (a cut of the prompt, or its end): a prefill-only take of the rows before it."""
        if self.free_slots == 0:
            raise RuntimeError(f"all {len(self.takes)} slots are decoding; start a take when one is free")
        decoder = self.decoder
        slot = decoder.pick_slot(prompt, [slot for slot, held in enumerate(self.takes) if held is None])
        take = Take(prompt, slot, self.vocoder, StreamSchedule(self.first_window),
                    deadline, cancelled, eos=decoder.eos, semantic_start=decoder.semantic_start,
                    stop=stop, early=self.early_windows)
        if (reason := take.stopped()) is not None:
            take.close(reason)
            self.closing.append(take)
            return take
        self.takes[slot] = take
        try:
            begun = time.perf_counter()
            prefill = self.prefills[take] = decoder.begin_prefill(prompt, slot, stop)
            # The host's time to begin: the prefix cache's plan and restore launched (not awaited), the
            # slot's rows past them zeroed.
            take.timings["restore_ms"] = round((time.perf_counter() - begun) * 1000, 2)
            take.timings["cached_rows"] = prefill.cached  # prompt rows the prefix cache restored
            take.timings["prefill_chunks"] = len(prefill.chunks)  # the chunks left to run
        except Exception as exc:  # noqa: BLE001 - one take's failure must not stop the others
            self.end(take, "error", f"{type(exc).__name__}: {exc}")
        return take

    def prefill(self) -> int:
        """Run waiting prompts' chunks in start order: `prefill_rows` (or the admission's budget)
        while takes decode, else the first prompt's whole prefill. A take whose prefill is done
        decodes from this step on. Returns the rows prefilled beside decoding takes as the budget
        counts them (a group as its longest chunk); `beside` gets the rows themselves."""
        decoding = bool(self.decoding())
        step_rows = self.prefill_rows or self.admission.rows(self.playback_limit())
        if decoding and step_rows == 0:  # a playing take needs this step short: no prefill in it...
            now = time.perf_counter()
            if all(now - take.started < HELD_S for take in self.prefills if not take.prefill_only):
                self.held = any(not take.prefill_only for take in self.prefills)
                return 0
            step_rows = self.admission.min_rows  # ...unless a prompt waited HELD_S for it: a few rows
        budget = allowed = step_rows if decoding else 0
        took = False  # a take's prefill ran in this step
        # Several takes' next chunks as one batched chunk while they fit a group (the weights read
        # once for all of them), then the rest one by one.
        while group := self.group(ordered=decoding):
            took = True
            budget -= self.run_group(group, decoding)
            if decoding and budget <= 0:
                return allowed - budget
        # Takes first (in start order), then prefill-only takes, which never delay a take: while
        # takes decode they get what is left of the step's budget; otherwise a step of their own.
        warms_grouped = False
        for take, prefill in sorted(self.prefills.items(), key=lambda item: item[0].prefill_only):
            if take.prefill_only and ((took and not decoding) or (decoding and self.vocoder_due())):
                break
            if take.prefill_only and not warms_grouped:  # warms waiting together: in groups first
                warms_grouped = True
                while group := self.warm_group():
                    budget -= self.run_group(group, decoding)
                    if budget <= 0 or not decoding:  # (with nothing decoding: one group, a step of its own)
                        return allowed - budget if decoding else 0
            if take not in self.prefills:  # its last chunk ran in a group
                continue
            took |= not take.prefill_only
            left = sum(end - start for start, end in prefill.chunks)
            rows = budget if decoding else step_rows if take.prefill_only else None
            try:
                done = self.decoder.prefill_more(prefill, rows, BESIDE_ROWS if decoding else None)
            except Exception as exc:  # noqa: BLE001 - one take's failure must not stop the others
                self.end(take, "error", f"{type(exc).__name__}: {exc}")
                continue
            self.prefilled(take, prefill, done)
            ran = left - sum(end - start for start, end in prefill.chunks)
            budget -= ran
            self.beside += ran if decoding else 0
            if decoding and budget <= 0:
                break
        return allowed - budget if decoding else 0

    def carried(self) -> Carry | None:
        """What the next decode step carries (mixed.py): the next chunks of the first waiting
        prompt (takes before warms) where its chunk has a mixed size, with those riding with it
        (`riding`); else None (`prefill` runs it apart). A take's prompt rides every step in the
        largest size (a chunk costs the playing takes ~12-17 ms once on an H100); a warm's what
        they allow (admission.py `Carrying`: a warm in every step cost stop 44's 32 directors
        real time), never while a take awaits first audio (a warm is a guess) nor, with
        `warms_yield`, while the vocoder has a window due. A fixed `prefill_rows` caps the rows."""
        mixed = self.decoder.mixed
        if not mixed.enabled or not self.prefills:
            return None
        take, prefill = min(self.prefills.items(), key=lambda item: item[0].prefill_only)  # (stable: start order)
        if mixed.size(prefill) is None:
            return None
        if take.prefill_only and (any(other.playing_until is None for other in self.decoding())
                                  or self.vocoder_due()):
            return Carry([(take, prefill)], 0, 0)
        limit = self.playback_limit() if take.prefill_only else None
        if group := [] if take.prefill_only else self.riding():
            return Carry(group, mixed.group_rows, mixed.group_rows)
        largest = self.prefill_rows or (self.carrying.size(mixed.sizes, limit) if take.prefill_only
                                        else max(mixed.sizes))
        size = None if largest is None else mixed.size(prefill, largest)
        return Carry([(take, prefill)], largest or 0, size or 0)

    def riding(self) -> list[tuple[Take, Prefill]]:
        """The waiting takes' prompts whose next chunks ride the next step together (mixed.py
        `pick`), from the first, with warms in the rows they leave (a graph computes them all);
        [] when fewer than two takes fit (or a fixed `prefill_rows`). Warms alone ride one a
        step: on stop 57's H100 groups of warms lengthened the steps for no gain."""
        mixed = self.decoder.mixed
        if not mixed.grouped or self.prefill_rows:
            return []
        waiting = [(take, prefill) for take, prefill in self.prefills.items() if not take.prefill_only]
        picked = mixed.pick([prefill for _, prefill in waiting], max(take.position for take in self.decoding()))
        group = [(take, prefill) for take, prefill in waiting if any(prefill is p for p in picked)]
        if not group:
            return group
        others = [(take, prefill) for take, prefill in self.prefills.items() if take.prefill_only]
        riders = self.decoder.groups.fill(picked, [prefill for _, prefill in others])
        return group + [(take, prefill) for take, prefill in others if any(prefill is p for p in riders)]

    def carry(self, plan: Carry, position: int, rows: list[int]) -> None:
        """One decode step of the slots `rows` carrying the plan's chunks; a take decodes from
        the next step once its last chunk ran."""
        prefills = [prefill for _, prefill in plan.prompts]
        left = [sum(end - start for start, end in prefill.chunks) for prefill in prefills]
        mixed = self.decoder.mixed
        done = mixed.step_group(position, rows, prefills) if len(prefills) > 1 \
            else [mixed.step(position, rows, prefills[0], plan.rows)]
        for (take, prefill), before, finished in zip(plan.prompts, left, done, strict=True):
            ran = before - sum(end - start for start, end in prefill.chunks)
            self.beside += ran
            self.beside_warm += ran if take.prefill_only else 0
            self.prefilled(take, prefill, finished)

    def restored(self) -> None:
        """The waiting prompts with no chunk left to run (restored whole): done, in start order."""
        for take, prefill in [(take, prefill) for take, prefill in self.prefills.items() if not prefill.chunks]:
            try:
                self.prefilled(take, prefill, self.decoder.prefill_more(prefill))
            except Exception as exc:  # noqa: BLE001 - one take's failure must not stop the others
                self.end(take, "error", f"{type(exc).__name__}: {exc}")

    def prefilled(self, take: Take, prefill: Prefill, done: bool) -> None:
        """After chunks of the take's prefill: a warm whose chunks all ran ends (its snapshots
        are kept, the slot goes back); a take whose last chunk ran (`done`) decodes from the
        next step."""
        if take.prefill_only and not prefill.chunks:
            del self.prefills[take]
            take.prefilled()
            self.end(take, "prefilled")
        elif done:
            del self.prefills[take]
            take.prefilled()

    def run_group(self, group: list[tuple[Take, Prefill]], decoding: bool) -> int:
        """The next chunk of each prompt in `group` as one batched chunk; the rows it costs the
        step's budget: its longest chunk's (on the H200 a chunk's cost hardly follows its rows;
        counting all would teach the admission a per-row cost a single chunk then overruns)."""
        self.pace.group(len(group))
        chunk_rows = [end - start for start, end in (prefill.chunks[0] for _, prefill in group)]
        self.beside += sum(chunk_rows) if decoding else 0
        try:
            ended = self.decoder.prefill_group([prefill for _, prefill in group])
        except Exception as exc:  # noqa: BLE001 - the group's takes fail, the others go on
            for take, _ in group:
                self.end(take, "error", f"{type(exc).__name__}: {exc}")
            return max(chunk_rows)
        for (take, prefill), finished in zip(group, ended, strict=True):
            self.prefilled(take, prefill, finished)
        return max(chunk_rows)

    def warm_group(self) -> list[tuple[Take, Prefill]]:
        """Warms (prefill-only takes) whose next chunks run together, in start order; [] when
        fewer than two fit one group (prefill_groups.py `pick`)."""
        warms = [(take, prefill) for take, prefill in self.prefills.items() if take.prefill_only]
        picked = self.decoder.groups.pick([prefill for _, prefill in warms])
        return [(take, prefill) for take, prefill in warms if any(prefill is p for p in picked)]

    def group(self, ordered: bool) -> list[tuple[Take, Prefill]]:
        """The waiting prompts whose next chunks run together next (prefill_groups.py `pick`);
        [] when fewer than two takes' chunks fit one. `ordered` (takes decode): it starts with
        the first waiting take, so a long chunk is never passed over; otherwise with the first
        that can join one. Warms fill the rows the takes leave (a graph computes them all)."""
        groups = self.decoder.groups
        takes = [(take, prefill) for take, prefill in self.prefills.items() if not take.prefill_only]
        if not ordered:
            takes = [(take, prefill) for take, prefill in takes if groups.groupable(prefill)]
        picked = groups.pick([prefill for _, prefill in takes])
        if not picked:
            return []
        group = [(take, prefill) for take, prefill in takes if any(prefill is p for p in picked)]
        warms = [(take, prefill) for take, prefill in self.prefills.items() if take.prefill_only]
        riders = groups.fill(picked, [prefill for _, prefill in warms])
        return group + [(take, prefill) for take, prefill in warms if any(prefill is p for p in riders)]

    def vocoder_due(self) -> bool:
        """With `warms_yield`: a window in the vocoder's queue is due within HAND_OUT_STEPS
        steps (or is a first window), so a warm's chunk, which slows them, waits."""
        due = self.warms_yield and self.vocoder.due(HAND_OUT_STEPS * max(self.recent, default=0.0))
        self.yielded |= due
        return due

    def playback_limit(self) -> float | None:
        """The longest step the takes playing allow (admission.py), None if none is playing."""
        now = time.perf_counter()
        return playback_limit([playing for take in self.decoding() if (playing := take.playing(now))])

    def end(self, take: Take, reason: str, error: str | None = None) -> None:
        """Stop a take in a slot (prefilling or decoding): free its slot, send its last window."""
        self.prefills.pop(take, None)
        if self.takes[take.slot] is take:
            self.takes[take.slot] = None
            self.decoder.release(take.slot)
            if reason == "error":
                self.decoder.forget(take.slot)
        take.close(reason, error)
        self.closing.append(take)

    def hand_ready(self, hand: Hand) -> None:
        """While a step runs on the GPU: the windows the vocoder finished since it last looked (closed
        takes' last ones too), to `hand` now (which must not raise); Done after the step."""
        if self.vocoder.decoded == self.looked:
            return
        self.looked = self.vocoder.decoded
        out = [(take, events) for take in self.decoding() + self.closing if (events := take.ready(done=False))]
        if out:
            self.pace.early(sum(len(events) for _, events in out))
            hand(out)

    @torch.inference_mode()
    def step(self, hand: Hand | None = None) -> list[tuple[Take, Events]]:
        """Prefill chunks of the waiting prompts, then one decode step for every decoding take;
        every take's new events (windows, Done). `hand`: windows vocoded while the step runs on
        the GPU go to it then (`hand_ready`), the rest are returned."""
        for take in self.started():
            if (reason := take.stopped()) is not None:
                self.end(take, reason)
        self.restored()
        started, budgeted = time.perf_counter(), bool(self.decoding())  # takes were decoding: prefill is budgeted
        self.held, self.yielded, self.beside, self.beside_warm, groups = False, False, 0, 0, self.pace.groups
        plan = self.carried() if budgeted else None  # prompts' chunks in the step itself (mixed.py)
        carried = plan if plan is not None and plan.rows else None  # (0 rows: held back this step)
        self.held = plan is not None and not plan.rows and not plan.prompts[0][0].prefill_only
        admitted = self.prefill() if self.prefills and plan is None else 0  # rows beside decoding, budgeted
        stepping = self.decoding()
        if stepping:
            timer = time.perf_counter()
            try:
                position, rows = max(take.position for take in stepping), [take.slot for take in stepping]
                if carried is None:
                    self.decoder.step(position, rows)
                else:
                    self.carry(carried, position, rows)
                # [N][finite, main, code0..9]: the host reads once, handing out windows while it waits
                status = self.decoder.read_status(None if hand is None else lambda: self.hand_ready(hand))
            except Exception as exc:  # noqa: BLE001 - the shared step failed: its takes end, the others go on
                for take in stepping + ([take for take, _ in carried.prompts] if carried is not None else []):
                    self.end(take, "error", f"{type(exc).__name__}: {exc}")
            else:
                step_s = time.perf_counter() - timer
                if budgeted and carried is None:  # (a step after a whole prefill says nothing of the budget)
                    self.admission.record(time.perf_counter() - started, admitted)
                elif carried is not None:
                    self.carrying.record(carried.size, time.perf_counter() - started)
                    self.pace.carried(time.perf_counter() - started, self.beside, self.beside_warm,
                                      len(carried.prompts))
                self.pace.step(time.perf_counter() - started, len(stepping), self.beside, self.held,
                               grouped=self.pace.groups > groups, yielded=self.yielded)
                if budgeted:  # (a step that ran a whole prefill, nothing decoding before it, says nothing of the next)
                    self.recent.append(time.perf_counter() - started)
                pace_s = max(self.recent, default=step_s)  # the next steps': one carrying a chunk, not the average
                cuts = sum(len(take.schedule.cuts) for take in stepping)
                for take in stepping:
                    if (reason := take.advance(status[take.slot], step_s, pace_s)) is not None:
                        if reason == "error":  # non-finite logits: where, for whoever debugs the step
                            log.warning("slot %d: non-finite logits at position %d after %d steps (a prompt of %d "
                                        "rows, %d restored from the prefix cache; a step of %d decoding rows: "
                                        "slots %s; %s)", take.slot, take.position, take.steps,
                                        len(take.prompt.rows), take.timings.get("cached_rows", 0), len(stepping),
                                        [t.slot for t in stepping][:16],
                                        self.decoder.finite.diagnose(take.slot, take.position - 1))
                        self.end(take, reason)
                self.pace.cut(sum(len(take.schedule.cuts) for take in stepping) - cuts)
        wait = not self.started()  # nothing to step next: wait for the closing takes' windows
        out: list[tuple[Take, Events]] = []
        for take in self.decoding() + self.closing:
            if events := take.ready(wait):
                out.append((take, events))
        self.closing = [take for take in self.closing if not take.done]
        return out

    def drop(self, take: Take) -> None:
        """Forget a take whose events nobody reads any more (its slot is freed)."""
        if take.decoding:
            self.end(take, "cancelled")
        take.windows.pending.clear()
        if take in self.closing:
            self.closing.remove(take)

    def generate(self, take: Take) -> Iterator[AudioWindow | Done]:
        """Step until `take` is done, yielding its events (other takes' are dropped: run one take
        alone); its windows are handed out while the steps run, as the server's (`hand_ready`)."""
        early: list[tuple[Take, Events]] = []
        try:
            while not take.done:
                returned = self.step(hand=early.extend)
                yield from (event for stepped, events in [*early, *returned] if stepped is take for event in events)
                early.clear()
        finally:
            if not take.done:  # the caller stopped reading
                self.drop(take)
