"""The decode state of N slots and the batched step that advances every slot by one frame.

    decoder = Decoder(model, max_rows, slots=N, graphs=True)  # static state [N, ...]; the model's caches for N + 1
    decoder.capture()                             # CUDA: step and prefill graphs, before the first take
    prefill = decoder.begin_prefill(prompt, slot) # a take's prompt into a free slot, a few chunks at a time
    while not decoder.prefill_more(prefill, rows=256): decoder.step(...)   # (the slot then turns active)
    decoder.step(max_position, rows)              # one frame for the decoding slots (graph replay or eager)
    finite, *frame = decoder.read_status()[slot]  # on CUDA: pinned copy, event polled (engine/readback.py)
    decoder.release(slot)                         # the take ended: the slot is free

A take's host side (stop rules, windows, Done) is take.py; the slot table is slots.py.

Design choices:
- The step (`advance`) is a pure function of static tensors, one row per slot: the
  hidden state, position, input frame, RAS window, sampling settings, seed and frame
  counter of every slot, and an active mask. It samples the main tokens (with RAS), runs
  the tower (codes 1..9), feeds the new frames to the backbone, and writes the next
  inputs and a status row per slot in place. Nothing in it reads the host, so it can be
  captured as a CUDA graph; the host reads the status after it, into pinned memory with
  an event polled (`read_status`): a blocking read would hold up the vocoder thread's
  kernel launches (engine/readback.py).
- The step in two halves, each its own graph: `sample` (the candidate head and the tower:
  the frame, into the status) and `feed` (the frame through the backbone: the next hidden
  state). The step copies the status to the host between them and `read_status` waits for
  that copy only, so the host hands the frames to their windows (the vocoder's side stream)
  while the backbone, most of the step, still runs: a take's first window is vocoded that
  much sooner, and the host's work between steps no longer leaves the GPU idle.
- One entry point, `step`, holds the graph-or-eager choice. On CUDA (graphs on) it
  replays the graphs of (the decoding rows' bucket, the KV bucket of the furthest row:
  512, 1,024, ... the cache; only the cache where every attention reads its own rows,
  fast.py `reads_own_rows`): per row bucket 1, 2, 4, ... 64 (and N) they step the rows
  listed in a static index (the decoding rows, padded with a row that is not decoding),
  so a step costs what its decoding takes cost. On a CPU it runs `advance` eagerly over
  the decoding rows only. A slot computes the same frame either way, in any row of any
  bucket (tests compare them). Graphs are captured before the first take (capturing runs
  the step), sharing one pool. `step(..., feeds)` runs a mixed step's second half
  instead (mixed.py: a waiting prompt's chunk beside the decoding rows).
- Draws are counter-based (engine/kernels/sampler.py, draws.py: noise of the take's seed,
  frame counter, head and candidate), so a seeded take draws the same frames in any row and
  bucket, graphed or not; unseeded takes get a random seed at prefill.
- The decoder owns the model's caches: N slots plus one scratch slot (`setup_caches(N +
  1)` when it is made; one Decoder per model at a time). Every row computes, active or
  not (fixed shapes); an inactive row's results are ignored and its inputs are held
  (`where` on the active mask), so its position stays put, and its row points at the
  scratch slot (`slots[i]`), so its cache and DeltaNet writes land there: a free slot,
  or one whose prompt is being prefilled between steps, is never written by a step.
- Prefill (prefill.py) runs one prompt through the backbone in chunks (graph replays on
  CUDA), teacher-forcing the tower with each row's next row (the last row's label a
  placeholder the first step overwrites); other slots are untouched. `begin_prefill` and
  `prefill_more` run a few chunks at a time between the steps (the slot turns active after
  its last chunk); `prefill_group` runs several prompts' next chunks as one (prefill_groups.py).
- With a prefix cache (`decoder.prefix`, prefix.py), a prefill restores the slot's state at
  the longest prefix an earlier prefill left a snapshot of, runs only the rows after it,
  and leaves snapshots at the prompt's cuts (prefill.py `cuts`).
- A take starts in a clean slot: its KV rows past the restored prefix are zeroed (a few
  memsets). Attention masks the rows past a query's position, but a masked row still
  enters the weighted sum with weight 0, and 0 * NaN is NaN: without it, one take that
  went non-finite left its rows behind and every later take in its slot failed at its
  first step (seen on the H200 at 16 and 64 directors, 2026-12-03).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import secrets
import time
from collections.abc import Callable

import torch

from engine.drama3.fast import caches_symbolic, reads_own_rows
from engine.drama3.finite import CHECK_FINITE, FiniteChecks
from engine.drama3.layers import KVCache
from engine.drama3.mixed import MixedSteps
from engine.drama3.model import Drama3Model
from engine.drama3.prefill import ChunkedPrefill, Prefill, cuts
from engine.drama3.prefill_groups import PREFILL_GROUP, PrefillGroups
from engine.drama3.prefix import Plan, PrefixCache
from engine.drama3.prompt import Prompt
from engine.drama3.sampler import RAS_WINDOW_FRAMES, SamplingTensors, ras_window_of
from engine.graphs import StepGraphs, shared_pool
from engine.kernels.sampler import sample_code, sample_main
from engine.readback import copy_to, pinned_like, to_device, to_host, wait_for

log = logging.getLogger("retake.engine")

KV_BUCKET_ROWS = 256  # eager steps attend over a whole number of these
GRAPH_KV_ROWS = 512  # the smallest graphed KV bucket; then 1,024, 2,048, ... and the whole cache
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # decoding rows a graph steps (and the slot count itself)


def graph_kv_buckets(max_rows: int) -> list[int]:
    """512, 1,024, 2,048, ... below `max_rows`, then `max_rows`."""
    return [GRAPH_KV_ROWS << i for i in range(16) if GRAPH_KV_ROWS << i < max_rows] + [max_rows]


def rows_of(index: torch.Tensor | None, tensor: torch.Tensor) -> torch.Tensor:
    """The stepped rows of a per-slot tensor (None: all of them)."""
    return tensor if index is None else tensor[index]


def write_rows(index: torch.Tensor | None, updates: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> None:
    """Each (per-slot target, stepped rows' values) written back into the stepped rows."""
    for target, value in updates:
        if index is None:
            target.copy_(value)
        else:
            target.index_copy_(0, index, value)


class Decoder:
    """The static decode state of N slots and the step that advances them by one frame."""

    def __init__(self, model: Drama3Model, max_rows: int, slots: int = 1, *, graphs: bool = False,
                 group: int | None = None, mixed: bool | None = None, mixed_group: bool = False) -> None:
        config = model.config
        self.model, self.max_rows, self.num_slots = model, max_rows, slots
        self.semantic_start, self.codebook_size = config.semantic_start_token_id, config.codebook_size
        self.eos = config.eos_token_id
        device = self.device = model.candidate_head.device
        N = slots
        model.setup_caches(N + 1, max_rows, device, model.candidate_head.dtype)  # slot N: the scratch slot
        caches_symbolic(model)  # compiled decode layers: one compile for decoders of any size
        self.scratch = N
        self.slots = torch.full((N,), N, device=device)  # [N]: row i's cache slot, i when active, else scratch
        self.hidden = torch.zeros((N, config.text.hidden_size), dtype=model.candidate_head.dtype, device=device)
        self.position = torch.zeros(N, dtype=torch.long, device=device)  # of the input frame
        self.frame = torch.zeros((N, config.frame_width), dtype=torch.long, device=device)  # the input frame
        self.sampled = torch.zeros_like(self.frame)  # the frame the step's first half sampled, for its second
        self.ras_window = torch.zeros((N, RAS_WINDOW_FRAMES), dtype=torch.long, device=device)
        self.settings = SamplingTensors(torch.ones(N, device=device), torch.ones(N, dtype=torch.long, device=device),
                                        torch.ones(N, device=device))
        self.active = torch.zeros(N, dtype=torch.bool, device=device)
        # Per slot after a step: all logits finite, then the new frame (main token, codes 0..9).
        self.status = torch.zeros((N, 1 + config.frame_width), dtype=torch.long, device=device)
        self.status_host = pinned_like(self.status)  # the host's copy, reused every step
        self.status_copied = False  # by a graphed step, between its halves (`status_event` after the copy)
        self.seed = torch.zeros(N, dtype=torch.long, device=device)  # each take's draws: seed and frame counter
        self.counter = torch.zeros(N, dtype=torch.long, device=device)
        self.index = torch.zeros(N, dtype=torch.long, device=device)  # the rows a graph steps (padded)
        self.row_buckets = sorted({b for b in ROW_BUCKETS if b < N} | {N})
        # Every attention reading its own rows from the cache: a step costs the same in any bucket, so one.
        kv_buckets = [max_rows] if reads_own_rows(model) else graph_kv_buckets(max_rows)
        enabled = graphs and device.type == "cuda"  # on a CPU `step` runs `advance` eagerly
        pool = shared_pool() if enabled else None
        self.status_event = torch.cuda.Event() if enabled else None
        self.graphs = {rows: StepGraphs(functools.partial(self.half_rows, self.sample, rows), kv_buckets,
                                        enabled=enabled, pool=pool, name=f"decode step, {rows} rows, sample")
                       for rows in self.row_buckets}
        self.feeds = {rows: StepGraphs(functools.partial(self.half_rows, self.feed, rows), kv_buckets,
                                       enabled=enabled, pool=pool, name=f"decode step, {rows} rows, feed")
                      for rows in self.row_buckets}
        self.chunked = ChunkedPrefill(model, max_rows, graphs=graphs and device.type == "cuda")
        # Waiting prompts' chunks batched (prefill_groups.py): up to 8 where chunks are graphs, else off.
        most = group if group is not None else PREFILL_GROUP if self.chunked.graphed else 1
        self.groups = PrefillGroups(self.chunked, scratch=N, most=most)
        # Steps that carry waiting prompts' chunks (mixed.py): on where chunks are graphs, unless asked.
        self.mixed = MixedSteps(self, enabled=self.chunked.graphed if mixed is None else mixed, grouped=mixed_group)
        self.caches = [module for module in model.modules() if isinstance(module, KVCache)]
        self.prompts: dict[int, Prompt] = {}  # slots being prefilled, and their prompts
        self.prefix: PrefixCache | None = None  # snapshots of prompt prefixes (prefix.py), when the engine keeps them
        self.plans: dict[int, Plan] = {}  # slots being prefilled with the prefix cache: where it resumed, what to keep
        self.planned: tuple[Prompt, int, Plan] | None = None  # (prompt, cache clock, plan): pick_slot's last
        self.finite = FiniteChecks(model, self.hidden, self.active)  # where a take went non-finite (finite.py)

    @torch.inference_mode()
    def prefill(self, prompt: Prompt, slot: int = 0) -> None:
        """Fill `slot`'s caches with the prompt's rows, set its state for the first step, activate it."""
        self.prefill_more(self.begin_prefill(prompt, slot))

    @torch.inference_mode()
    def begin_prefill(self, prompt: Prompt, slot: int, stop: int | None = None) -> Prefill:
        """A prefill of `prompt` into `slot` (inactive until its last chunk has run); with `stop` (one of its
        cuts, such as its last boundary, or its end), only the chunks up to that row: a prefill for the
        prefix cache's snapshots alone (`Slots.start`'s prefill-only takes), whose slot is released after."""
        rows = to_device(prompt.rows, self.device)  # [R, 11]
        count = len(rows)
        if count < 2 or count + prompt.sampling.max_new_tokens > self.max_rows:
            raise ValueError(f"a prompt of {count} rows and {prompt.sampling.max_new_tokens} new frames does not "
                             f"fit the {self.max_rows} cache rows")
        self.release(slot)
        if self.prefix is None:
            prefill = self.chunked.begin(rows, slot)
        else:  # resume after the longest prefix in the cache; chunks cut where snapshots are kept
            plan = self.plans[slot] = self.plan(prompt)
            plan.stop = stop
            start, hidden = self.prefix.restore(plan, slot)
            prefill = self.chunked.begin(rows, slot, start, cuts(prompt))
            prefill.hidden, prefill.cached = hidden, start
        if stop is not None:
            if self.prefix is None or stop not in (*cuts(prompt), count):
                raise ValueError(f"a prefill stops at one of the prompt's cuts {cuts(prompt)} or at its "
                                 f"end ({count}), with a prefix cache; got {stop}")
            prefill.chunks = collections.deque(chunk for chunk in prefill.chunks if chunk[1] <= stop)
            prefill.prefill_only = True
        self.clear_rows(slot, prefill.cached)
        self.prompts[slot] = prompt
        self.finite.reported.discard(slot)
        if CHECK_FINITE and prefill.cached and (bad := self.finite.nonfinite(slot, prefill.cached)):
            log.warning("slot %d: the state restored from the prefix cache (%d rows) is non-finite: %s", slot,
                        prefill.cached, bad)
        return prefill

    def pick_slot(self, prompt: Prompt, free: list[int]) -> int:
        """Of the `free` slots, the one to prefill `prompt` into: the one holding most of the rows
        it restores (prefix.py `kept`: those are not copied), else the first."""
        prefix = self.prefix
        if prefix is None or len(free) == 1:
            return free[0]
        plan = prefix.plan(prompt)
        self.planned = (prompt, prefix.clock, plan)  # for its begin_prefill, while the cache is as it was
        return max(free, key=lambda slot: (prefix.kept(plan, slot), -slot))

    def plan(self, prompt: Prompt) -> Plan:
        """The prefix cache's plan for `prompt` (the one `pick_slot` just made, if any)."""
        assert self.prefix is not None
        planned, self.planned = self.planned, None
        if planned is not None and planned[0] is prompt and planned[1] == self.prefix.clock:
            return planned[2]
        return self.prefix.plan(prompt)

    @torch.inference_mode()
    def prefill_more(self, prefill: Prefill, rows: int | None = None, largest: int | None = None) -> bool:
        """Run about `rows` rows of the prefill's chunks (None: all), none longer than `largest`
        rows (prefill.py `run`); True once it is done and its slot active."""
        hidden = self.chunked.run(prefill, rows, self.after_chunk(prefill), largest)
        if hidden is None:
            return False
        self.activate(prefill, hidden)
        return True

    @torch.inference_mode()
    def prefill_group(self, group: list[Prefill]) -> list[bool]:
        """The next chunk of each prefill in `group` (`groups.pick`'s) as one batched chunk;
        for each, True once it is done and its slot active."""
        self.groups.run(group, [self.after_chunk(prefill) for prefill in group])
        done = [not prefill.chunks for prefill in group]
        for prefill, finished in zip(group, done, strict=True):
            if finished:
                assert prefill.hidden is not None, "a prefill that ran its last chunk has its hidden state"
                self.activate(prefill, prefill.hidden)  # (before the next group overwrites that view)
        return done

    @torch.inference_mode()
    def prefill_together(self, prefills: list[Prefill]) -> None:
        """Run the prefills to their end, their next chunks in groups where they fit one, else
        the first waiting one's chunk alone (prompts waiting at once, with nothing decoding)."""
        while waiting := [prefill for prefill in prefills if prefill.chunks]:
            if group := self.groups.pick(waiting):
                self.prefill_group(group)
            else:
                self.prefill_more(waiting[0], rows=1)  # (one chunk: at least one runs)

    def after_chunk(self, prefill: Prefill) -> Callable[[int, torch.Tensor], None] | None:
        """What runs after each of the prefill's chunks: the prefix cache's snapshots, the finite check."""
        plan = self.plans.get(prefill.slot)
        after = None if plan is None or self.prefix is None else functools.partial(self.prefix.record, plan,
                                                                                   prefill.slot)
        if CHECK_FINITE:
            after = functools.partial(self.finite.after_chunk, prefill, after)
        return after

    def activate(self, prefill: Prefill, hidden: torch.Tensor) -> None:
        """The prefill is done: its slot's state for the first step; the slot decodes from now on."""
        self.plans.pop(prefill.slot, None)
        slot, prompt = prefill.slot, self.prompts.pop(prefill.slot)
        if self.prefix is not None and not prefill.prefill_only:
            self.prefix.decoding(slot, len(prefill.rows) - 1)
        # Numbers by fill_ (a kernel argument): `t[slot] = n` copies from host memory, a sync (stop 38)
        self.hidden[slot] = hidden
        self.position[slot].fill_(len(prefill.rows) - 1)
        self.frame[slot] = prefill.rows[-1]
        self.ras_window[slot] = ras_window_of(prefill.rows)[0]
        self.settings.fill(prompt.sampling, slot)
        seed = prompt.sampling.seed
        self.seed[slot].fill_(secrets.randbits(63) if seed is None else seed)
        self.counter[slot].fill_(0)
        self.slots[slot].fill_(slot)
        self.active[slot].fill_(True)

    def clear_rows(self, slot: int, start: int) -> None:
        """Zero the slot's KV rows from `start` on (what an earlier take left there)."""
        torch._foreach_zero_([rows for cache in self.caches for rows in (cache.k[slot, start:], cache.v[slot, start:])])

    def read_status(self, idle: Callable[[], object] | None = None) -> list[list[int]]:
        """The status rows of the last step on the host ([N][finite, main, code0..9]), read
        without blocking other threads' launches; `idle()` while the GPU runs (readback.py)."""
        if self.status_copied and self.status_event is not None:  # by the graphed step, between its halves
            wait_for(self.status_event, idle)
            self.status_copied = False
        else:
            to_host(self.status, self.status_host, idle)
        status: list[list[int]] = self.status_host.tolist()
        return status

    def release(self, slot: int) -> None:
        """The slot's take ended: its row is ignored, held at position 0, writing to the scratch slot."""
        self.active[slot].fill_(False)
        self.position[slot].fill_(0)
        self.slots[slot].fill_(self.scratch)
        self.prompts.pop(slot, None)
        self.plans.pop(slot, None)

    def forget(self, slot: int) -> None:
        """The slot's rows are not to be reused in place (its take failed: whatever it left is
        suspect); the next prompt in it restores every row it resumes from."""
        if self.prefix is not None:
            self.prefix.held.pop(slot, None)

    @property
    def graphed(self) -> bool:
        return self.graphs[self.row_buckets[0]].enabled

    @property
    def captured(self) -> bool:
        """Every bucket of the step and of the prefill chunks has its graph or runs eagerly
        for a logged reason (or graphs are off)."""
        return all(graphs.captured for graphs in (*self.graphs.values(), *self.feeds.values(), *self.mixed.graphs())) \
            and self.chunked.captured and self.groups.captured

    def capture(self, up_to_rows: int | None = None) -> None:
        """Capture the step's graphs (every row bucket, the KV buckets up to `up_to_rows`;
        default: all) and the prefill chunks' graphs; nothing when graphs are off. Capturing
        runs them (into the scratch slot), which would advance a take in flight: call before
        a take starts."""
        limit = up_to_rows or self.max_rows
        self.position.zero_()
        self.active.zero_()
        self.slots.fill_(self.scratch)
        self.index.zero_()
        for rows, graphs in self.graphs.items():  # each logged: a slow warm-up says where its time went
            started = time.perf_counter()
            buckets = [b for b in graphs.buckets if b <= graphs.bucket_for(limit)]
            graphs.capture(buckets)
            self.feeds[rows].capture(buckets)
            if graphs.enabled:
                log.info("decode graphs, %d rows: %d KV buckets, each step in two (sample, feed), in %.1f s (the "
                         "first ones compile the layers)", rows, len(buckets), time.perf_counter() - started)
        started = time.perf_counter()
        self.chunked.capture(self.scratch)
        self.groups.capture()
        self.mixed.capture()
        if self.graphed:
            counts = [sum(len(g.graphs) for g in family) for family in (
                self.chunked.graphs.values(), self.groups.graphs.values(), self.mixed.graphs())]
            log.info("prefill chunk graphs: %d, %d of grouped chunks and %d of mixed steps, in %.1f s", *counts,
                     time.perf_counter() - started)

    def graph_kv_len(self, position: int) -> int:
        """The KV bucket a graphed step whose furthest row is at `position` attends."""
        return self.graphs[self.row_buckets[0]].bucket_for(position + 2)

    def row_bucket(self, rows: int) -> int:
        return next(b for b in self.row_buckets if b >= rows)

    def step(self, position: int, rows: list[int] | None = None, feeds: dict[int, StepGraphs] | None = None,
             feed_kv: int | None = None) -> None:
        """One frame for the decoding slots `rows` (default all), the furthest at `position`
        (its input frame's): with graphs, replays of the graphs of their row bucket at
        position's KV bucket (sample, the status copied out, feed); without, an eager `advance`
        of `rows` only. `feeds` (mixed.py): the second half's graphs per row bucket instead of
        the decoder's, at `feed_kv` (also run through their buckets on a CPU)."""
        rows = list(range(self.num_slots)) if rows is None else rows
        if not self.graphed and feeds is None:
            self.advance(self.kv_len(position), rows)
            return
        bucket = self.row_bucket(len(rows))
        graphs, feed = self.graphs[bucket], (feeds or self.feeds)[bucket]
        kv_bucket, feed_kv = graphs.bucket_for(position + 2), feed_kv or position + 2
        if self.graphed and not all(kv in g.graphs or kv in g.eager
                                    for g, kv in ((graphs, kv_bucket), (feed, feed.bucket_for(feed_kv)))):
            raise RuntimeError(f"no graph captured for {bucket} rows and {kv_bucket} cache rows; capture it before "
                               f"the take")
        if len(rows) < bucket:  # pad with a row that is not decoding: inactive, it holds its inputs
            pad = next(row for row in range(self.num_slots) if row not in rows)
            rows = rows + [pad] * (bucket - len(rows))
        copy_to(self.index[:bucket], torch.tensor(rows))
        graphs(position + 2)  # the frames sampled: a replay, or eagerly where it could not be captured
        if self.status_event is not None:
            self.status_host.copy_(self.status, non_blocking=True)  # read by the host while the backbone runs
            self.status_event.record()
            self.status_copied = True
        feed(feed_kv)  # the frames through the backbone

    def half_rows(self, half: Callable[[int | None, torch.Tensor | None], None], bucket: int, kv_len: int) -> None:
        """What a graph of `bucket` rows captures: a half of the step over the static index."""
        half(kv_len, self.index[:bucket])

    def advance(self, kv_len: int | None = None, rows: list[int] | None = None) -> None:
        """One frame for the slots `rows` (None: every slot): `advance_index`."""
        self.advance_index(kv_len, None if rows is None or rows == list(range(self.num_slots)) else
                           to_device(torch.tensor(rows), self.device))

    def advance_index(self, kv_len: int | None, index: torch.Tensor | None) -> None:
        """The step itself: one frame for the rows in `index` (None: all) from the static
        state; writes their status and next inputs in place (inactive rows keep theirs, and
        a row listed twice writes the same values). kv_len bounds the attended cache rows
        (>= every active position + 2). Two halves, `sample` then `feed`, each its own graph
        on CUDA, so the host reads the frames while the backbone runs. A slot computes the
        same frame whatever else is stepped with it."""
        self.sample(kv_len, index)
        self.feed(kv_len, index)

    def sample(self, kv_len: int | None, index: torch.Tensor | None) -> None:
        """The step's first half: each row's frame (the main token from the candidate head,
        codes 1..9 from the tower) into `sampled` and the status."""
        model, tower = self.model, self.model.tower
        of = functools.partial(rows_of, index)
        hidden_in, position, frame_in = of(self.hidden), of(self.position), of(self.frame)
        ras_window, seed, counter, slots = of(self.ras_window), of(self.seed), of(self.counter), of(self.slots)
        settings = SamplingTensors(of(self.settings.temperature), of(self.settings.top_k), of(self.settings.top_p))
        logits = model.candidate_logits(hidden_in)  # [B, 4097] float32
        finite = torch.ones_like(of(self.active))  # [B]: every head's logits finite (the samplers AND it)
        main = sample_main(logits, model.candidate_ids, ras_window, settings, seed, counter, self.semantic_start,
                           self.codebook_size, finite)  # [B]
        code0 = (main - self.semantic_start).clamp(0, self.codebook_size - 1)
        semantic = tower.is_semantic(main)
        hidden = tower.run_shared(hidden_in, code0, semantic, frame_in, position, slots, kv_len)
        codes = [code0]
        for head_index, (layer, head) in enumerate(zip(tower.residual_layers, tower.heads)):
            hidden = layer(hidden, codes[-1], semantic, position, slots, kv_len)  # [B, D]
            codes.append(sample_code(head(hidden), settings, seed, counter, head_index, finite))  # [B]
        frame = torch.stack((main, *codes), dim=-1)  # [B, 11]
        write_rows(index, ((self.sampled, frame), (self.status, torch.cat((finite.long()[:, None], frame), dim=-1))))

    def feed(self, kv_len: int | None, index: torch.Tensor | None,
             backbone: Callable[..., torch.Tensor] | None = None) -> None:
        """The step's second half: the sampled frames through the backbone (or `backbone`, a
        call like it: mixed.py's); the next inputs."""
        model = self.model
        of = functools.partial(rows_of, index)
        hidden_in, position, frame_in, frame = of(self.hidden), of(self.position), of(self.frame), of(self.sampled)
        ras_window, counter, active = of(self.ras_window), of(self.counter), of(self.active)
        next_hidden = (backbone or model.backbone)(model.embed(frame[:, None]), (position + 1)[:, None],
                                                   of(self.slots), kv_len)[:, 0]  # [B, D]
        keep = active[:, None]  # [B, 1]: inactive rows hold their inputs
        write_rows(index, (
            (self.hidden, torch.where(keep, next_hidden, hidden_in)),
            (self.frame, torch.where(keep, frame, frame_in)),
            (self.ras_window, torch.where(keep, torch.cat((ras_window[:, 1:], frame[:, :1]), dim=-1), ras_window)),
            (self.position, position + active.long()),
            (self.counter, counter + active.long()),
        ))

    def kv_len(self, position: int) -> int:
        """The attended cache rows for a step whose furthest row is at `position`: a bucket covering position + 1."""
        return min(self.max_rows, math.ceil((position + 2) / KV_BUCKET_ROWS) * KV_BUCKET_ROWS)
