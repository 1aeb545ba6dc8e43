"""The codec's decoder as CUDA graphs, one per window frame count: windows' PCM16 from a
replay, several takes' windows of one count in one replay.

    graphs = WindowGraphs(codec, [first_frames(f)], window_frames(f), batch=8)   # stream.py's counts
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
  windows go in the order given, a call never holding two of one take), and a window
  that does not start where its take's state ends is refused (codec_stream.py).
- Windows from `batched_from` frames decode up to `batch` of several takes in one call, in
  a graph of the fewest rows that hold them (1, 2, 4, ... `batch`: `rows_for`; a graph per
  row count and frame count), so a lone window never pays for a batch (one graph of `batch`
  rows for every call made each lone window pay for all of them: on the H200, stop 48,
  `--vocoder-batch 8 --vocoder-batch-from 2` made 32 directors' gap p99 1,831 ms against
  77). A call of fewer windows than rows leaves the other rows' frames at 0 (their results
  unused). In a drain a window joins the first call of its graph with a row free after the
  call of its take's window before it, not only the call just before it: in deadline order
  windows of one graph are rarely next to each other. On the H200 (stop 48, `bench takes`)
  8 windows of 2 frames cost 1.68 ms each in one call against 3.8 alone, of 10 frames 2.54
  against 6.26.
- The clips of a batch never mix (codec_layers.py), and a row's samples do not depend on its
  place in the batch or on the other rows (tested on a CPU, and on the GPU by the gpu
  tests), but they do depend on the call's row count: convolution algorithms change with the
  batch size (cuDNN, and oneDNN on a CPU), up to rounding. So each window decoded in a call
  of several rows is listed with its row count in its take's state (Done.rows), and
  `render_take` (the WAV export from codes, one window per call) decodes it in a call of as
  many rows: the stream sample for sample.
- The graph converts to PCM16 on the device; only the int16 rows come to the host,
  pinned and event-polled (engine/readback.py).
- The static buffers serve one caller at a time: the vocoder thread and an export on the
  engine thread take a lock around copy-in, replay and read-back (replays on two streams
  would otherwise overwrite each other's buffers).
- A drain's calls (`decode_windows`) are launched back to back, each one's samples copied to
  pinned memory behind an event on the stream (`Launched`), and handed out as each copy
  lands, in launch order: the GPU runs the calls without waiting for the host between them,
  and the next call's copy-in is ordered after the last one's read-back on the same stream.
  Read one by one, each window waited for its samples, the polling thread and the GIL
  before the next launched: at 64 directors on an H100 the vocoder fell behind (windows
  closed to audio p95 1.85 s, stop 37). If a launch fails, the calls launched before it
  still hand their windows out (their takes' states have moved on past them).
- The graphs belong to whoever vocodes (the engine, its takes, the export), passed along
  with the codec rather than hung on it, so the codec and the pure schedule (stream.py)
  never import this module. Without graphs (a CPU) a window decodes eagerly, alone;
  WindowGraphs on a CPU run their padded, batched code eagerly (the tests' way to the
  batched path).
- The graphs share one memory pool of their own (they may run while the decode graphs do).
- `compiled` (`retake serve --vocoder-compile`, on by default; on an H100 14-18% off a window's
  replay, 6.13 against 7.46 ms for 64 frames, 2.67 against 3.22 for one; through the server on
  the H200, stop 48, 32 directors' longest gap p99 39 ms against 77, for a warm-up ~90 s longer):
  the graphs capture the window's decode through Inductor (`compiled_decode`) instead of op by
  op. A replay still runs every kernel of the window, ~685 on an H100 (stop 38's profile: the
  post transformer's ~37 a layer in float32, the casts, adds and norms around the convolutions),
  most of a short window's 3-4 ms; Inductor fuses the elementwise ones. One compile serves
  every frame count and row count (`dynamic=True`; a take's first windows, without context,
  and calls of one frame or one row are compiled apart, and on a CPU one row's windows under
  32 frames: a convolution's size test; the static buffers have a row and a frame to spare,
  since a slice of them that was contiguous by chance compiled apart too: stop 51 counted 8
  compiles for 10 calls, 4 since, and the batched vocoder's warm-up on an H100 ran past
  260 s), the Snakes go to Inductor as the
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
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import torch
import torch.fx.experimental._config as fx_config
from numpy.typing import NDArray

from engine.drama3.codec import Codec
from engine.drama3.codec_stream import CodecState, StreamState, context_for, decode_next, new_state, window_pcm
from engine.drama3.stream import Window, join_windows, take_windows
from engine.graphs import StepGraphs
from engine.pcm import pcm16
from engine.readback import pinned_like, to_host, wait_for

log = logging.getLogger("retake.engine")

VOCODER_BATCH = 1  # the most windows a call decodes (engine default; more once the H200 shows it pays: docs/perf.md)
BATCHED_FROM = 64  # frames: windows with this many new frames decode up to `batch` to a call
ROW_COUNTS = (1, 2, 4, 8, 16, 32)  # a call's rows: the least of these (or `batch`) that holds its windows

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
    """Windows' PCM16 from the graph of their frame count (padded up), `batch` windows to a call
    from `batched_from` frames, for one codec; `compiled`: the window's decode through Inductor."""

    def __init__(self, codec: Codec, firsts: list[int], frames: list[int], *, batch: int = 1,
                 batched_from: int = BATCHED_FROM, enabled: bool = True, compiled: bool = False) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"the vocoder's batch must be a whole number of windows >= 1; got {batch!r}")
        self.codec, self.frames = codec, sorted(set(frames))
        self.compiled = compiled
        self.decode_next = compiled_decode() if compiled else decode_next
        self.batch, self.batched_from = batch, batched_from
        self.row_counts = [rows for rows in ROW_COUNTS if rows < batch] + [batch]  # a graph set each
        longest, device = max(*firsts, *self.frames), codec.device
        # A row and a frame to spare: no call's slice of the codes or the state's keys and values is
        # contiguous by chance (compiled, one that was would compile apart: dynamo guards a
        # contiguous tensor's strides as its sizes').
        self.codes = torch.zeros((batch + 1, codec.num_codebooks, longest + 1), dtype=torch.long, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)  # real frames per row
        self.state = new_state(codec, batch + 1)
        self.out = torch.zeros((batch, (codec.conv_context + longest) * codec.frame_samples), dtype=torch.int16,
                               device=device)
        enabled = enabled and device.type == "cuda"
        # By rows: every frame count in one row, those from `batched_from` in more (their own graphs).
        self.batched = {rows: StepGraphs(functools.partial(self.static_window, context=codec.conv_context, rows=rows),
                                         [n for n in self.frames if rows == 1 or n >= batched_from],
                                         enabled=enabled, name=f"codec window x{rows}") for rows in self.row_counts}
        self.graphs = self.batched[1]  # (the routing: `fastest_for`)
        self.firsts = StepGraphs(functools.partial(self.static_window, context=0, rows=1), firsts, enabled=enabled,
                                 name="codec first window")
        self.lock = threading.Lock()

    @property
    def captured(self) -> bool:
        return all(graphs.captured for graphs in self.batched.values()) and self.firsts.captured

    @property
    def count_captured(self) -> int:
        """Graphs captured."""
        return sum(len(graphs.graphs) for graphs in self.batched.values()) + len(self.firsts.graphs)

    def capture(self) -> None:
        with self.lock:
            # Captures and timed replays run every graph on the static buffers as they are: after
            # takes they hold real windows' counts (10 frames into a 1-frame graph gathered out of
            # bounds: a device-side assert when the engine warmed up again, stop 41's H100).
            for buffer in (self.codes, self.count, self.state.keys, self.state.values, self.state.tail,
                           self.state.frames):
                buffer.zero_()
            for rows in sorted(self.batched, reverse=True):  # the widest first: the pool is sized once
                self.batched[rows].pool = self.firsts.pool  # one pool for every window graph
                self.batched[rows].capture()
                self.firsts.pool = self.batched[rows].pool
            self.firsts.capture()
            if self.graphs.graphs:
                self.graphs.time_replays()
                log.info("codec window graphs: replay ms by new frames %s; windows of %s frames run in %s",
                         {n: round(ms, 2) for n, ms in self.graphs.replay_ms.items()}, self.frames,
                         [self.graphs.fastest_for(n) for n in self.frames])

    def rows(self, key: Key) -> int:
        """The most windows a call of the graphs of `key` decodes."""
        context, frames = key
        return self.batch if context and frames >= self.batched_from else 1

    def rows_for(self, key: Key, windows: int) -> int:
        """The rows of the call that decodes `windows` windows of `key` (the least that hold them)."""
        if not 0 < windows <= self.rows(key):
            raise ValueError(f"one call decodes windows of one graph, at most {self.rows(key)}")
        return next(rows for rows in self.row_counts if rows >= windows)

    def static_window(self, frames: int, context: int, rows: int) -> None:
        """What a graph captures: PCM16 of `rows` rows' next `frames` static frames after their state."""
        state = CodecState(self.state.keys[:, :rows], self.state.values[:, :rows], self.state.tail[:rows],
                           self.state.frames[:rows])
        audio = self.decode_next(self.codec, self.codes[:rows, :, :frames], state, self.count[:rows], context)
        self.out[:rows, :audio.shape[1]].copy_(pcm16(audio))  # [rows, (context + frames) * fs]

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

    def pcm_batch(self, windows: list[Job], rows: int | None = None) -> list[NDArray[np.int16]]:
        """Each window's new samples as int16 (on the host), decoded in one call: windows of one
        graph, at most `rows(key)` of them, of different takes, in a call of `rows` rows (default
        the least that hold them)."""
        with self.lock:
            return self.launch(windows, rows).result()

    def launch(self, windows: list[Job], rows: int | None = None) -> Launched:
        """pcm_batch's call, launched: its samples on their way to the host (`result()` waits),
        each take's state moved on. With `lock` held until every launched call's result is read:
        the static buffers serve the next launch in stream order, and another thread's call would not be."""
        keys = {self.key_for(window) for _, window, _ in windows}
        key = keys.pop() if len(keys) == 1 else None
        if key is None:
            raise ValueError("one call decodes windows of one graph, at most 1 without a graph")
        rows = self.rows_for(key, max(len(windows), rows or 0))
        if len({id(stream) for _, _, stream in windows}) < len(windows):
            raise ValueError("a take's windows decode one call each, in order")
        context, frames = key
        started = None
        if self.codes.is_cuda:  # the call's time on the GPU: from here to its samples' copy (Launched.gpu_ms)
            started = torch.cuda.Event(enable_timing=True)
            started.record()
        for row, (codes, window, stream) in enumerate(windows):
            stream.check(window)
            self.codes[row, :, :window.frames].copy_(codes[:, window.emit:window.end])
            self.codes[row, :, window.frames:frames].zero_()  # causal: the padding does not reach the window's frames
            self.count[row].fill_(window.frames)
            if stream.codec is None:  # the take's first window: nothing before it
                for part in (self.state.keys[:, row], self.state.values[:, row], self.state.tail[row],
                             self.state.frames[row]):
                    part.zero_()
            else:
                self.state.copy_(stream.codec, into=row, row=0)
        self.count[len(windows):rows].zero_()  # unused rows: their states stay where they are
        (self.batched[rows] if context else self.firsts)(frames)
        for row, (_, window, stream) in enumerate(windows):
            stream.state(self.codec).copy_(self.state, into=0, row=row)
            stream.frames = window.end
            if rows > 1:  # the export decodes it in a call of as many rows: the same kernels, the same samples
                stream.rows.append((window.end, rows))
        out = self.out[:len(windows), :(context + frames) * self.codec.frame_samples]  # [windows, kept * fs]
        return Launched(out, [(min(window.emit, context), min(window.emit, context) + window.frames)
                              for _, window, _ in windows], self.codec.frame_samples, started)

class Launched:
    """A graph call's samples on their way to the host: pinned, non-blocking, an event behind the
    copy (engine/readback.py), so a vocoder launches its next call before this one's samples
    are read; on a CPU a copy made at once (the static buffer is the next call's)."""

    def __init__(self, pcm: torch.Tensor, spans: list[tuple[int, int]], frame_samples: int,
                 started: torch.cuda.Event | None = None) -> None:
        self.spans, self.frame_samples = spans, frame_samples  # each row's new frames, from the first kept
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

    def result(self) -> list[NDArray[np.int16]]:
        """Each row's new samples (waits for the copy)."""
        self.wait()
        out, fs = self.host.numpy(), self.frame_samples
        return [out[row, first * fs:end * fs] for row, (first, end) in enumerate(self.spans)]


def decode_window(codec: Codec, codes: torch.Tensor, window: Window, stream: StreamState,
                  graphs: WindowGraphs | None = None, rows: int = 1) -> NDArray[np.int16]:
    """A window's new samples as numpy int16 on the host (read without blocking other threads'
    launches); replayed from `graphs` when one of them runs it (in a call of `rows` rows), else
    decoded eagerly."""
    if rows > 1 and graphs is not None:
        return graphs.pcm_batch([(codes, window, stream)], rows)[0]
    return decode_windows(codec, [(codes, window, stream)], graphs)[0]


def decode_windows(codec: Codec, windows: list[Job], graphs: WindowGraphs | None = None,
                   ready: Callable[[int, NDArray[np.int16]], None] | None = None,
                   timed: Callable[[float], None] | None = None) -> list[NDArray[np.int16]]:
    """Each window's new samples (numpy int16, on the host), decoded in the order given (the
    vocoder's: the most urgent first), a take's windows in its order: a window of a graph joins
    the first call of the same graph with a row free after the call of its take's window
    before it (`rows` to a call); the others eagerly, one by one. `ready(index, pcm)` is
    called as each window's samples exist, before the next call runs: a vocoder hands a window
    out then, not after every window of its drain. `timed(ms)`: each graph call's time on the GPU."""
    out: list[NDArray[np.int16] | None] = [None] * len(windows)

    def put(index: int, pcm: NDArray[np.int16]) -> None:
        out[index] = pcm
        if ready is not None:
            ready(index, pcm)

    calls: list[tuple[Key | None, list[int]]] = []  # each call's graph (None: eager) and windows, in order
    latest: dict[int, int] = {}  # a take's call of its latest window so far: its next goes in a later one
    for index, (_, window, stream) in enumerate(windows):
        key = graphs.key_for(window) if graphs is not None else None
        rows = graphs.rows(key) if graphs is not None and key is not None else 1
        after = latest.get(id(stream), -1)
        call = next((number for number in range(after + 1, len(calls))
                     if key is not None and calls[number][0] == key and len(calls[number][1]) < rows), None)
        if call is None:
            calls.append((key, []))
            call = len(calls) - 1
        calls[call][1].append(index)
        latest[id(stream)] = call
    launched: collections.deque[tuple[list[int], Launched]] = collections.deque()

    def hand_out(wait: bool) -> None:  # the calls whose samples are on the host, in launch order
        while launched and (wait or launched[0][1].done()):
            indices, call = launched.popleft()
            pcms = call.result()
            if timed is not None and (ms := call.gpu_ms()) is not None:
                timed(ms)
            for index, pcm in zip(indices, pcms):
                put(index, pcm)

    with graphs.lock if graphs is not None else contextlib.nullcontext():
        try:  # every call launched before the first is read: the GPU runs them back to back
            for key, members in calls:
                if key is None:
                    codes, window, stream = windows[members[0]]
                    put(members[0], to_host(window_pcm(codec, codes, window, stream)).numpy())
                    continue
                assert graphs is not None  # (a window has a graph's key only with graphs)
                launched.append((members, graphs.launch([windows[i] for i in members])))
                hand_out(wait=False)
            hand_out(wait=True)
        except BaseException:  # the calls launched before the failure: their takes' states moved on past them
            with contextlib.suppress(Exception):
                hand_out(wait=True)
            raise
    return [pcm for pcm in out if pcm is not None]


def render_take(codec: Codec, codes: torch.Tensor, first_window: int | None = None,
                graphs: WindowGraphs | None = None, cuts: Sequence[int] = (),
                joined: Sequence[int] = (), rows: Sequence[tuple[int, int]] = ()) -> NDArray[np.int16]:
    """int16 PCM [frames * frame_samples]: exactly what the stream of a take with these
    final codes [num_codebooks, frames] carried, with the same settings and graphs, its
    early windows' `cuts` (Done.cuts), the windows its vocoder joined (Done.joined) and the
    rows of the calls that decoded several windows (Done.rows: (end, rows))."""
    stream, wide = StreamState(), dict(rows)
    windows = join_windows(take_windows(codes.shape[1], first_window, cuts), joined)
    return np.concatenate([decode_window(codec, codes, window, stream, graphs, wide.get(window.end, 1))
                           for window in windows])
