"""The codec's decoder as CUDA graphs, one per window frame count: a window's PCM16 from a replay.

    graphs = WindowGraphs(codec, [first_frames(f)], window_frames(f))   # stream.py's counts
    graphs.capture()                             # before the first take (CUDA)
    pcm = decode_window(codec, codes, window, state, graphs)   # int16 numpy, the window's new samples
    pcms = decode_windows(codec, [(codes, window, state), ...], graphs)   # windows of many takes
    pcm = render_take(codec, codes, first_window, graphs)   # a whole take, as streamed

Launched from Python, a window's decode (quantiser embeddings, the 8-layer post
transformer, upsampling, the convolutional decoder) costs 15-20 ms on the H200 even for 10
frames; most of that is launching. A replay leaves the kernels.

Design choices:
- A window decodes its new frames after its take's codec state (codec_stream.py): the post
  transformer runs on the new frames only, the convolutions on those and `conv_context`
  frames before them. One graph per frame count of a take's later windows (1, 2, 6, 10,
  12, 32, 64 with a first window of 1: `window_frames`) and one for its first window (each
  first window size asked for), whose convolutions have no context (`first_frames`). A
  take's last window runs in a graph of a larger count, its codes padded with zeros on the
  right: the codec is causal and the state moves on by the real frames (`count`), so the
  padding changes none of its samples. A window that fits no graph decodes eagerly.
- A window runs in the graph that replayed fastest among those it fits, timed at capture
  (`StepGraphs.time_replays`), not always the smallest: cuDNN picks the convolutions by
  length, and on an H100 (stop 38) windows of 20 and 32 frames took 9.6-9.7 ms in the
  32-frame graph and the 64-frame window 7.6 in its own. The times are taken once, so the
  export (`render_take`) still runs each window in the graph the stream ran it in.
- The state is copied into the graph's static rows before a replay and back out to the take
  after it, on the same stream: a take's windows decode in order, one call each (a drain's
  windows go in the order given), and a window
  that does not start where its take's state ends is refused (codec_stream.py).
- One window per call. Several takes' windows in one call of several rows (`retake serve
  --vocoder-batch`) and a take's queued windows joined into one (`--vocoder-join`) were built
  and measured (stops 46-52) and deleted: on the H200 (stop 48) 8 windows of 2 frames cost
  1.68 ms each in one call against 3.8 alone, but through the server few due windows share a
  frame count (an H100, stop 52: 961 windows in 747 calls) and the wider calls made first
  audio and gaps worse (64 directors' first audio p95 2,441 ms against 1,388).
- The graph converts to PCM16 on the device; only the int16 rows come to the host,
  pinned and event-polled (engine/readback.py).
- The static buffers serve one caller at a time: the vocoder thread and an export on the
  engine thread take a lock around copy-in, replay and read-back (replays on two streams
  would otherwise overwrite each other's buffers).
- A drain's calls (`decode_windows`) are launched ahead of their reading (IN_FLIGHT at most), each
  one's samples copied to pinned memory behind an event on the stream (`Launched`), and
  handed out as each copy lands, in launch order: the GPU runs the calls without waiting for
  the host between them, and the next call's copy-in is ordered after the last one's
  read-back on the same stream. No more than IN_FLIGHT: each window is taken from its source
  as it is launched, so the vocoder picks the most urgent window queued by then (a new take's
  first window waits for at most IN_FLIGHT calls, not a whole drain launched at once).
  Read one by one, each window waited for its samples, the polling thread and the GIL
  before the next launched: at 64 directors on an H100 the vocoder fell behind (windows
  closed to audio p95 1.85 s, stop 37). If a launch fails, the calls launched before it
  still hand their windows out (their takes' states have moved on past them).
- The graphs belong to whoever vocodes (the engine, its takes, the export), passed along
  with the codec rather than hung on it, so the codec and the pure schedule (stream.py)
  never import this module. Without graphs (a CPU) a window decodes eagerly;
  WindowGraphs on a CPU run their padded code eagerly (the tests' way to the graphs' path).
- The graphs share one memory pool of their own (they may run while the decode graphs do).
- `compiled` (`retake serve --vocoder-compile`, on by default; on an H100 14-18% off a window's
  replay, 6.13 against 7.46 ms for 64 frames, 2.67 against 3.22 for one; through the server on
  the H200, stop 48, 32 directors' longest gap p99 39 ms against 77, for a warm-up ~90 s longer):
  the graphs capture the window's decode through Inductor (`compiled_decode`) instead of op by
  op. A replay still runs every kernel of the window, ~685 on an H100 (stop 38's profile: the
  post transformer's ~37 a layer in float32, the casts, adds and norms around the convolutions),
  most of a short window's 3-4 ms; Inductor fuses the elementwise ones. One compile serves
  every frame count (`dynamic=True`; a take's first windows, without context, and windows of
  one frame are compiled apart, and on a CPU windows under 32 frames: a convolution's size
  test; the static buffers have a row and a frame to spare, since a slice of them that was
  contiguous by chance compiled apart too: stop 51 counted 8 compiles for 10 calls, 4
  since), the Snakes go to Inductor as the
  reference (it fuses them as the Triton pass does: float32, rounded once), and
  `emulate_precision_casts` keeps the release's roundings (the rope's bfloat16 cos and sin, the
  scale's cast): without it Inductor skips a float32 -> bfloat16 -> float32 round trip and the
  post transformer's output moved by 3e-4 of its scale. The samples differ from the op-by-op
  window's in float16 rounding only, and the export replays the same graphs, so it is still
  the stream sample for sample.
- cuDNN's own heuristics pick the convolutions' algorithms. Autotuning at capture
  (`torch.backends.cudnn.benchmark` for the warm-up call) was tried (stop 36): on an H100 a
  10 + 320-frame window replayed in 14.6 ms either way, so it is not done.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import cast

import numpy as np
import torch
import torch.fx.experimental._config as fx_config
from numpy.typing import NDArray

from engine.drama3.codec import Codec
from engine.drama3.codec_stream import CodecState, StreamState, context_for, decode_next, new_state, window_pcm
from engine.drama3.stream import Window, take_windows
from engine.graphs import StepGraphs
from engine.pcm import pcm16
from engine.readback import pinned_like, to_host, wait_for

log = logging.getLogger("retake.engine")

IN_FLIGHT = 2  # calls launched and not yet read: the GPU never waits for the host, a first window for a drain

# A window of a take: its take's codes [num_codebooks, >= window.end] (on the codec's device), the
# window, the take's codec state.
Job = tuple[torch.Tensor, Window, StreamState]
Key = tuple[int, int]  # a graph: (frames of context, 0 for first windows; its frame count)


DecodeNext = Callable[[Codec, torch.Tensor, CodecState, torch.Tensor, int], torch.Tensor]


def compiled_decode() -> DecodeNext:
    """`decode_next` through Inductor, any window and row count (see the design choices)."""
    compiled = cast(DecodeNext, torch.compile(decode_next, dynamic=True, fullgraph=True,
                                              options={"emulate_precision_casts": True}))

    def decode(codec: Codec, codes: torch.Tensor, state: CodecState, count: torch.Tensor, context: int) -> torch.Tensor:
        # Not duck-shaped: a window of 64 frames would share a symbol with the heads' 64 dims and compile apart.
        with fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]  # (set up at import)
            return compiled(codec, codes, state, count, context)
    return decode


class WindowGraphs:
    """Windows' PCM16 from the graph of their frame count (padded up), for one codec; `compiled`:
    the window's decode through Inductor."""

    def __init__(self, codec: Codec, firsts: list[int], frames: list[int], *, enabled: bool = True,
                 compiled: bool = False) -> None:
        self.codec, self.frames = codec, sorted(set(frames))
        self.compiled = compiled
        self.decode_next = compiled_decode() if compiled else decode_next
        longest, device = max(*firsts, *self.frames), codec.device
        # A row and a frame to spare: no call's slice of the codes or the state's keys and values is
        # contiguous by chance (compiled, one that was would compile apart: dynamo guards a
        # contiguous tensor's strides as its sizes').
        self.codes = torch.zeros((2, codec.num_codebooks, longest + 1), dtype=torch.long, device=device)
        self.count = torch.zeros(1, dtype=torch.long, device=device)  # the window's real frames
        self.state = new_state(codec, 2)
        self.out = torch.zeros((1, (codec.conv_context + longest) * codec.frame_samples), dtype=torch.int16,
                               device=device)
        enabled = enabled and device.type == "cuda"
        self.graphs = StepGraphs(functools.partial(self.static_window, context=codec.conv_context), self.frames,
                                 enabled=enabled, name="codec window")
        self.firsts = StepGraphs(functools.partial(self.static_window, context=0), firsts, enabled=enabled,
                                 name="codec first window")
        self.lock = threading.Lock()

    @property
    def captured(self) -> bool:
        return self.graphs.captured and self.firsts.captured

    @property
    def count_captured(self) -> int:
        """Graphs captured."""
        return len(self.graphs.graphs) + len(self.firsts.graphs)

    def capture(self) -> None:
        with self.lock:
            # Captures and timed replays run every graph on the static buffers as they are: after
            # takes they hold real windows' counts (10 frames into a 1-frame graph gathered out of
            # bounds: a device-side assert when the engine warmed up again, stop 41's H100).
            for buffer in (self.codes, self.count, self.state.keys, self.state.values, self.state.tail,
                           self.state.frames):
                buffer.zero_()
            self.graphs.pool = self.firsts.pool  # one pool for every window graph
            self.graphs.capture()
            self.firsts.pool = self.graphs.pool
            self.firsts.capture()
            if self.graphs.graphs:
                self.graphs.time_replays()
                log.info("codec window graphs: replay ms by new frames %s; windows of %s frames run in %s",
                         {n: round(ms, 2) for n, ms in self.graphs.replay_ms.items()}, self.frames,
                         [self.graphs.fastest_for(n) for n in self.frames])

    def static_window(self, frames: int, context: int) -> None:
        """What a graph captures: PCM16 of the static row's next `frames` static frames after its state."""
        state = CodecState(self.state.keys[:, :1], self.state.values[:, :1], self.state.tail[:1],
                           self.state.frames[:1])
        audio = self.decode_next(self.codec, self.codes[:1, :, :frames], state, self.count, context)
        self.out[:, :audio.shape[1]].copy_(pcm16(audio))  # [1, (context + frames) * fs]

    def key_for(self, window: Window) -> Key | None:
        """The graph `window` decodes in (its frames padded up; replayed once captured on CUDA, the
        same code eagerly on a CPU), None if it decodes eagerly alone (empty, longer than every
        graph, or its graph failed to capture)."""
        graphs = self.firsts if window.emit == 0 else self.graphs
        if window.frames == 0 or window.frames > graphs.buckets[-1]:
            return None
        frames = graphs.fastest_for(window.frames)
        return None if frames in graphs.eager else (context_for(self.codec, window), frames)

    def runs(self, window: Window) -> bool:
        """Whether `window` decodes as a graph replay."""
        key = self.key_for(window)
        graphs = self.firsts if window.emit == 0 else self.graphs
        return graphs.enabled and key is not None and key[1] in graphs.graphs

    def pcm(self, window: Job) -> NDArray[np.int16]:
        """A window's new samples as int16 (on the host), decoded in one call of its graph."""
        with self.lock:
            return self.launch(window).result()

    def launch(self, job: Job) -> Launched:
        """pcm's call, launched: its samples on their way to the host (`result()` waits), the
        take's state moved on. With `lock` held until every launched call's result is read:
        the static buffers serve the next launch in stream order, and another thread's call would not be."""
        codes, window, stream = job
        key = self.key_for(window)
        if key is None:
            raise ValueError(f"a window of {window.frames} frames has no graph: it decodes eagerly")
        context, frames = key
        started = None
        if self.codes.is_cuda:  # the call's time on the GPU: from here to its samples' copy (Launched.gpu_ms)
            started = torch.cuda.Event(enable_timing=True)
            started.record()
        stream.check(window)
        self.codes[0, :, :window.frames].copy_(codes[:, window.emit:window.end])
        self.codes[0, :, window.frames:frames].zero_()  # causal: the padding does not reach the window's frames
        self.count.fill_(window.frames)
        if stream.codec is None:  # the take's first window: nothing before it
            for part in (self.state.keys[:, 0], self.state.values[:, 0], self.state.tail[0], self.state.frames[0]):
                part.zero_()
        else:
            self.state.copy_(stream.codec, into=0, row=0)
        (self.graphs if context else self.firsts)(frames)
        stream.state(self.codec).copy_(self.state, into=0, row=0)
        stream.frames = window.end
        out = self.out[:, :(context + frames) * self.codec.frame_samples]  # [1, kept * fs]
        first = min(window.emit, context)
        return Launched(out, (first, first + window.frames), self.codec.frame_samples, started)


class Launched:
    """A graph call's samples on their way to the host: pinned, non-blocking, an event behind the
    copy (engine/readback.py), so a vocoder launches its next call before this one's samples
    are read; on a CPU a copy made at once (the static buffer is the next call's)."""

    def __init__(self, pcm: torch.Tensor, span: tuple[int, int], frame_samples: int,
                 started: torch.cuda.Event | None = None) -> None:
        self.span, self.frame_samples = span, frame_samples  # the window's new frames, from the first kept
        self.started = started  # recorded before the call's copies (timing), or None
        self.event: torch.cuda.Event | None = None
        if pcm.is_cuda:
            self.host = pinned_like(pcm).copy_(pcm, non_blocking=True)
            self.event = torch.cuda.Event(enable_timing=started is not None)
            self.event.record()
        else:
            self.host = pcm.clone()

    def done(self) -> bool:
        return self.event is None or self.event.query()

    def wait(self) -> None:
        """Until the samples are on the host (polling: no blocking driver call)."""
        if self.event is not None:
            wait_for(self.event)

    def gpu_ms(self) -> float | None:
        """The call's time on the GPU, copies in and out included, once its samples are on the host."""
        if self.started is None or self.event is None or not self.done():
            return None
        return float(self.started.elapsed_time(self.event))

    def result(self) -> NDArray[np.int16]:
        """The window's new samples (waits for the copy)."""
        self.wait()
        (first, end), fs = self.span, self.frame_samples
        return self.host.numpy()[0, first * fs:end * fs]


def decode_window(codec: Codec, codes: torch.Tensor, window: Window, stream: StreamState,
                  graphs: WindowGraphs | None = None) -> NDArray[np.int16]:
    """A window's new samples as numpy int16 on the host (read without blocking other threads'
    launches); replayed from `graphs` when one of them runs it, else decoded eagerly."""
    return decode_windows(codec, [(codes, window, stream)], graphs)[0]


def decode_windows(codec: Codec, windows: Iterable[Job], graphs: WindowGraphs | None = None,
                   ready: Callable[[int, NDArray[np.int16]], None] | None = None,
                   timed: Callable[[float], None] | None = None) -> list[NDArray[np.int16]]:
    """Each window's new samples (numpy int16, on the host), decoded in the order given (the
    vocoder's: the most urgent first), a take's windows in its order, a call each (eagerly where
    a window has no graph). Each window is taken from `windows` once its call can launch (at
    most IN_FLIGHT launched and not yet read): a lazy source picks it then. `ready(index, pcm)` is
    called as each window's samples exist: a vocoder hands a window out then, not after every
    window of its drain. `timed(ms)`: each graph call's time on the GPU."""
    out: list[NDArray[np.int16] | None] = []
    launched: collections.deque[tuple[int, Launched]] = collections.deque()

    def put(index: int, pcm: NDArray[np.int16]) -> None:
        out[index] = pcm
        if ready is not None:
            ready(index, pcm)

    def hand_out(keep: int) -> None:  # read calls in launch order: down to `keep` in flight, and any done
        while len(launched) > keep or (launched and launched[0][1].done()):
            index, call = launched.popleft()
            pcm = call.result()
            if timed is not None and (ms := call.gpu_ms()) is not None:
                timed(ms)
            put(index, pcm)

    source = iter(windows)
    with graphs.lock if graphs is not None else contextlib.nullcontext():
        try:
            while True:
                hand_out(keep=IN_FLIGHT - 1)  # room for the next call before its window is picked
                job = next(source, None)
                if job is None:
                    break
                out.append(None)
                codes, window, stream = job
                if graphs is None or graphs.key_for(window) is None:
                    put(len(out) - 1, to_host(window_pcm(codec, codes, window, stream)).numpy())
                else:
                    launched.append((len(out) - 1, graphs.launch(job)))
            hand_out(keep=0)
        except BaseException:  # the calls launched before the failure: their takes' states moved on past them
            with contextlib.suppress(Exception):
                hand_out(keep=0)
            raise
    return [pcm for pcm in out if pcm is not None]


def render_take(codec: Codec, codes: torch.Tensor, first_window: int | None = None,
                graphs: WindowGraphs | None = None, cuts: Sequence[int] = ()) -> NDArray[np.int16]:
    """int16 PCM [frames * frame_samples]: exactly what the stream of a take with these
    final codes [num_codebooks, frames] carried, with the same settings and graphs and its
    early windows' `cuts` (Done.cuts)."""
    stream = StreamState()
    return np.concatenate([decode_window(codec, codes, window, stream, graphs)
                           for window in take_windows(codes.shape[1], first_window, cuts)])
