"""The whole tick on static buffers: Mimi encode, the lockstep, Mimi decode; one CUDA graph per batch bucket.

    ticks = Ticks(mimi, lockstep, silence, device, graphs=True)
    pcm, tokens, timings = ticks.run(user_pcm, n)     # the first n slots; [n, frame] and [n, K] on the host

Design choices:
- A tick reads and writes static device buffers only (the user's PCM in, the agent's PCM
  and the frame's tokens out, the `speaking` mask that sends silence codes to the decoder
  for slots that do not speak), so on CUDA the whole of it is captured once per batch
  bucket and replayed: nothing runs on the host between encode, model and decode.
- Batch buckets (1, 2, 4, ... slots): a tick runs the first n slots, the smallest bucket
  that holds every slot in use, so a tick costs what its conversations cost. Every module
  slices its state by the batch it is given (streaming.py), so each bucket's graph works
  on fixed views of the same state.
- On CUDA the whole tick encodes the user's frame on a side stream while the model steps
  (the lockstep's `think` reads none of this tick's user codes; `settle` writes them), a
  fork and a join inside the captured graph. Should a bucket's forked tick fail to
  capture, the tick goes sequential and is captured again (logged): an eager tick would
  cost far more than the encode it hides.
- The lockstep's `active` rows are the ones a tick moves on: Mimi's streams hold on the
  same mask in a tick (streaming.py `holding`), so a slot left out of a tick (no frame of its
  user's yet) keeps its encoder and decoder state as well as its step and ring.
- Graphs are captured when the ticks are built, before any conversation: capturing runs
  the tick, which would advance every slot, so all streams are reset afterwards. A bucket
  that cannot be captured (or whose tick would read the host: graphs.py checks under
  CUDA's sync debug mode) runs eagerly, with the reason logged.
- In and out through pinned host buffers with non-blocking copies and one CUDA event,
  polled: a pageable read (`.cpu()`, `.tolist()`) would block every other thread's kernel
  launches while it waits (docs/perf.md; PyTorch issue 143825), and Drama 3's engine shares
  the process and the GPU.
- Timings are CUDA events on the stream (host timers do not wait for the GPU): the whole
  tick always, and encode / model / decode when the parts run separately (`parts=True`:
  three graphs per bucket, for `retake bench personaplex --parts`; eager ticks always
  have them). On the CPU, host timers around synchronous work.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from numpy.typing import NDArray

from engine.graphs import StepGraphs, shared_pool
from engine.personaplex.lockstep import Lockstep
from engine.personaplex.mimi import LayerFn, Mimi, run_layer
from engine.readback import wait_for

log = logging.getLogger("retake.personaplex")


def buckets_for(slots: int) -> list[int]:
    """1, 2, 4, ... below `slots`, and `slots`."""
    sizes = [1 << i for i in range(slots.bit_length()) if 1 << i < slots]
    return [*sizes, slots]


class Ticks:
    def __init__(self, mimi: Mimi, lockstep: Lockstep, silence: torch.Tensor, device: torch.device,
                 graphs: bool, parts: bool = False, buckets: list[int] | None = None,
                 layer: LayerFn = run_layer) -> None:
        B, size, cb, K = lockstep.slots, mimi.frame_size, mimi.codebooks, lockstep.cfg.rows
        self.mimi, self.lockstep, self.silence, self.device = mimi, lockstep, silence, device
        self.side = torch.cuda.Stream(device=device) if device.type == "cuda" else None  # Mimi's encode (whole)
        self.layer = layer  # how Mimi's transformers run a layer (compiled_mimi.py, or the module)
        self.buckets = sorted({*(buckets or buckets_for(B)), B})  # the whole batch is always one
        cuda = device.type == "cuda"
        self.pcm_in = torch.zeros(B, size, device=device)
        self.codes = torch.zeros(B, cb, dtype=torch.long, device=device)
        self.pcm_out = torch.zeros(B, size, device=device)
        self.speaking = torch.zeros(B, dtype=torch.bool, device=device)
        self.host_in = torch.zeros(B, size, pin_memory=cuda)
        self.host_pcm = torch.zeros(B, size, pin_memory=cuda)
        self.host_tokens = torch.zeros(B, K, dtype=torch.long, pin_memory=cuda)
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(5)] if cuda else []
        # The stages by name (a graph's key, a timing's name), bound once.
        self.stages: dict[str, Callable[[int], None]] = {"encode": self.encode, "model": self.model,
                                                         "decode": self.decode, "whole": self.whole}
        captured = ("encode", "model", "decode") if parts else ("whole",)
        self.parts = parts
        pool = shared_pool() if graphs and cuda else None  # the stages never replay at once
        self.graphs = {name: StepGraphs(self.stages[name], self.buckets, enabled=graphs and cuda, pool=pool,
                                        name=f"personaplex {name}") for name in captured}
        self.graphed = False
        if graphs and cuda:
            self.capture()

    # The stages, on static buffers (the graphs capture these).

    def encode(self, n: int) -> None:
        with self.mimi.holding(self.lockstep.active):  # the streams of the rows the tick moves on only
            self.codes[:n] = self.mimi.encode(self.pcm_in[:n], self.layer)

    def model(self, n: int) -> None:
        self.lockstep.tick(self.codes[:n], n)

    def decode(self, n: int) -> None:
        cb = self.mimi.codebooks
        agent = torch.where(self.speaking[:n, None], self.lockstep.tokens[:n, 1:1 + cb], self.silence)  # [n, cb]
        with self.mimi.holding(self.lockstep.active):
            self.pcm_out[:n] = self.mimi.decode(agent, self.layer)

    def whole(self, n: int) -> None:
        """The tick. On CUDA, Mimi encodes the user's frame on a side stream while the model
        steps (Lockstep.think needs none of this tick's user codes): at one conversation the
        encode was 1.37 ms of a 10.7 ms tick, its small kernels leaving most of the GPU idle."""
        side = self.side
        if side is None:
            self.encode(n)
            sampled = self.lockstep.think(n)
        else:
            side.wait_stream(torch.cuda.current_stream())  # the user's PCM and the active rows are in
            with torch.cuda.stream(side):
                self.encode(n)
            sampled = self.lockstep.think(n)
            torch.cuda.current_stream().wait_stream(side)  # (a graph's capture rejoins it here too)
        self.lockstep.settle(self.codes[:n], sampled, n)
        self.decode(n)

    def capture(self) -> None:
        """Capture every bucket (then reset every stream: capturing ran ticks); a bucket that cannot be
        captured runs eagerly, with the reason logged (engine/graphs.py)."""
        started = time.perf_counter()
        with torch.no_grad():
            for graphs in self.graphs.values():
                graphs.capture()
            whole = self.graphs.get("whole")
            if whole is not None and whole.eager and self.side is not None:  # the fork could not be held in a graph:
                log.warning("PersonaPlex ticks: the tick with Mimi's encode beside the model could not be captured "
                            "(%s); capturing it with the encode first", next(iter(whole.eager.values())))
                self.side = None  # the sequential tick, whose graphs hold nothing but one stream
                whole.eager.clear()
                whole.capture()
        self.graphed = any(graphs.graphs for graphs in self.graphs.values())
        every = torch.ones(self.lockstep.slots, dtype=torch.bool, device=self.device)
        self.lockstep.reset(every)
        self.mimi.reset_streams(every)
        log.info("PersonaPlex ticks: buckets %s, %s in %.1f s", self.buckets,
                 "CUDA graphs" if self.graphed else "eager", time.perf_counter() - started)

    def close(self) -> None:
        for graphs in self.graphs.values():
            for graph in graphs.graphs.values():
                graph.reset()
            graphs.graphs.clear()
            graphs.pool = None

    # One tick.

    @torch.no_grad()
    def run(self, pcm: NDArray[np.float32] | None, n: int,
            codes: torch.Tensor | None = None) -> tuple[NDArray[np.float32], NDArray[np.int64], dict[str, float]]:
        """A tick of the first n slots (a bucket) from user audio [n, frame], or from user codes
        [n, codebooks] (eager: golden replays): their agent PCM [n, frame] and frames [n, K] on the
        host (views of the pinned buffers, valid until the next tick), and its timings."""
        assert n in self.buckets
        if codes is not None:
            self.codes[:n] = codes.to(self.device)
            stages = ["model", "decode"]
        else:
            assert pcm is not None
            self.host_in[:n] = torch.from_numpy(pcm)
            self.pcm_in[:n].copy_(self.host_in[:n], non_blocking=True)
            stages = ["whole"] if not self.parts and self.graphed else ["encode", "model", "decode"]
        if self.events:
            return self._run_cuda(stages, n)
        marks = [time.perf_counter()]
        for stage in stages:
            self.stages[stage](n)
            marks.append(time.perf_counter())
        self.host_pcm[:n] = self.pcm_out[:n]
        self.host_tokens[:n] = self.lockstep.tokens[:n]
        return self.host_pcm[:n].numpy(), self.host_tokens[:n].numpy(), _timings(marks, stages)

    def _run_cuda(self, stages: Sequence[str], n: int,
                  ) -> tuple[NDArray[np.float32], NDArray[np.int64], dict[str, float]]:
        events = self.events
        events[0].record()
        for i, stage in enumerate(stages):
            graphs = self.graphs.get(stage)
            if graphs is not None and n in graphs.graphs:
                graphs.graphs[n].replay()
            else:
                self.stages[stage](n)
            events[i + 1].record()
        self.host_pcm[:n].copy_(self.pcm_out[:n], non_blocking=True)
        self.host_tokens[:n].copy_(self.lockstep.tokens[:n], non_blocking=True)
        done = events[-1]
        done.record()
        wait_for(done)
        marks = [0.0] + [events[0].elapsed_time(events[i + 1]) / 1000 for i in range(len(stages))]
        return self.host_pcm[:n].numpy(), self.host_tokens[:n].numpy(), _timings(marks, stages)


def _timings(marks: list[float], names: Sequence[str]) -> dict[str, float]:
    """Milliseconds of the tick (`gpu_ms`) and, when its parts ran apart, of each part."""
    ms = [(b - a) * 1000 for a, b in itertools.pairwise(marks)]
    out = {"gpu_ms": sum(ms)}
    if list(names) != ["whole"]:
        out |= {f"{name}_ms": value for name, value in zip(names, ms)}
    return out
