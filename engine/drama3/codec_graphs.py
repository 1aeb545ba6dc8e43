"""The codec's decoder as CUDA graphs, one per window length: windows' PCM16 from a replay,
several takes' windows of one length in one replay.

    graphs = WindowGraphs(codec, window_lengths(overlap, first_window), batch=8)   # stream.py's lengths
    graphs.capture()                             # before the first take (CUDA)
    pcm = decode_window(codec, codes, window, graphs)   # int16 numpy, the window's new samples
    pcms = decode_windows(codec, [(codes, window), ...], graphs)   # windows of many takes, batched
    pcm = render_take(codec, codes, overlap, first_window, graphs)   # a whole take, as streamed

Launched from Python, a window's decode (quantiser embeddings, the 8-layer post
transformer, upsampling, the convolutional decoder) costs 15-20 ms on the H200 even for 10
frames; most of that is launching. A replay leaves the kernels.

Design choices:
- One graph per window length L (frames decoded: the window's left context plus its new
  frames). The stream's windows have few lengths until their context is full (4, 10, 20,
  32, 64, 128, 192, 256, 320, then 384 for every later window with the seed's schedule and
  320 frames of context), so those are captured. Any other window (a take's last one) runs
  in the graph of the next longer length, its codes padded with zeros on the right: the
  codec is causal, so the padding changes no sample of the window's own frames beyond
  rounding, and only those samples are kept. A window longer than every graph runs eagerly.
- The long lengths (`batched_from` frames and more: 128 ... 384 with the seed's schedule,
  where a take spends most of its codec time, 52 ms per 384-frame window on the H200)
  decode `batch` windows of several takes in one call: their graphs have `batch` rows,
  the short ones (a take's first windows) one row, so a lone first window never pays
  for a batch. A group of fewer windows fills the other rows with zero codes.
- Each length has exactly one graph, of one row count, so a window decodes through the
  same kernels whichever other windows share its call: the clips of a batch never mix
  (codec_layers.py), and a row's samples do not depend on its place in the batch or on
  the other rows (tested on a CPU, and on the GPU by the gpu tests). So `render_take`
  (the WAV export, one window per call) still reproduces a stream sample for sample. A
  graph per (rows, length), picked by how many windows are due, would let a lone window
  pay less, but a window would then decode through different kernels (convolution
  algorithms change with the batch size), up to rounding: the export would no longer be
  the stream.
- A graph runs the codec's post transformer on all its frames and the convolutions (most of
  the work) on the `kept` frames that end with the window's new ones (codec.py
  `decode_tail`; the first kept frame is a per-row static index): at most `length - shorter
  length` new frames plus `conv_context`, so 74 of a 384-frame window's frames. A window
  whose new frames do not fit (none of the stream's) decodes eagerly.
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
  closed to audio p95 1.85 s, stop 37).
- The graphs belong to whoever vocodes (the engine, its takes, the export), passed along
  with the codec rather than hung on it, so the codec and the pure schedule (stream.py)
  never import this module. Without graphs (a CPU) a window decodes eagerly, alone;
  WindowGraphs on a CPU run their padded, batched code eagerly (the tests' way to the
  batched path).
- The graphs share one memory pool of their own (they may run while the decode graphs do).
- cuDNN's own heuristics pick the convolutions' algorithms. Autotuning at capture
  (`torch.backends.cudnn.benchmark` for the warm-up call) was tried (stop 36): on an H100 a
  10 + 320-frame window replayed in 14.6 ms either way, so it is not done.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import numpy as np
import torch
from numpy.typing import NDArray

from engine.drama3.codec import Codec
from engine.drama3.stream import STREAM_OVERLAP_FRAMES, Window, take_windows, window_pcm
from engine.graphs import StepGraphs
from engine.pcm import pcm16
from engine.readback import pinned_like, to_host, wait_for

VOCODER_BATCH = 1  # rows of the long windows' graphs (engine default; 8 once the H200 shows it pays: docs/perf.md)
BATCHED_FROM = 128  # frames: windows this long (context included) decode `batch` to a call


class WindowGraphs:
    """Windows' PCM16 from the graph of their length (padded up), `batch` windows to a call
    for the lengths from `batched_from`, for one codec."""

    def __init__(self, codec: Codec, lengths: list[int], *, batch: int = 1, batched_from: int = BATCHED_FROM,
                 enabled: bool = True) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"the vocoder's batch must be a whole number of windows >= 1; got {batch!r}")
        self.codec, self.lengths = codec, sorted(set(lengths))
        self.batch, self.batched_from = batch, batched_from
        device = codec.device
        longest = self.lengths[-1]
        # Frames each length's convolutions run on (codec.py `decode_tail`): a window of length L
        # after the next shorter length L' has at most L - L' new frames, plus the convolutions'
        # context; the shortest length runs all its frames.
        self.kept = {length: min(length, codec.conv_context + length - shorter)
                     for shorter, length in zip([self.lengths[0], *self.lengths], self.lengths)}
        self.kept[self.lengths[0]] = self.lengths[0]
        self.codes = torch.zeros((batch, codec.num_codebooks, longest), dtype=torch.long, device=device)
        self.starts = torch.zeros(batch, dtype=torch.long, device=device)  # first frame kept, per row
        self.out = torch.zeros((batch, longest * codec.frame_samples), dtype=torch.int16, device=device)
        self.graphs = StepGraphs(self.static_window, self.lengths, enabled=enabled and device.type == "cuda",
                                 name="codec window")
        self.lock = threading.Lock()

    @property
    def captured(self) -> bool:
        return self.graphs.captured

    def capture(self) -> None:
        with self.lock:
            self.graphs.capture()

    def rows(self, length: int) -> int:
        """Windows decoded per call by the graph of `length` frames."""
        return self.batch if length >= self.batched_from else 1

    def static_window(self, length: int) -> None:
        """What a graph captures: PCM16 of the first `length` static frames of its rows."""
        rows, kept = self.rows(length), self.kept[length]
        codes = self.codes[:rows, :, :length]
        if kept == length:
            audio = self.codec.decode_batch(codes)  # [rows, length * frame_samples] float32
        else:
            audio = self.codec.decode_tail(codes, self.starts[:rows], kept)  # [rows, kept * frame_samples]
        self.out[:rows, :audio.shape[1]].copy_(pcm16(audio))

    def start_for(self, window: Window, length: int) -> int | None:
        """The first frame (from the window's start) that the convolutions of `length`'s graph
        run on for `window`; None if that graph cannot give its new frames exactly."""
        kept, context = self.kept[length], self.codec.conv_context
        start = max(0, min(window.emit - window.start - context, length - kept))
        whole = start == 0 or window.emit - window.start - start >= context
        return start if whole and window.end - window.start <= start + kept else None

    def length_for(self, window: Window) -> int | None:
        """The graph length `window` decodes at (padded up; replayed once captured on CUDA, the
        same code eagerly on a CPU), None if it decodes eagerly alone (empty, longer than every
        graph, or its graph failed to capture)."""
        frames = window.end - window.start
        if window.frames == 0 or frames > self.lengths[-1]:
            return None
        length = self.graphs.bucket_for(frames)
        return None if length in self.graphs.eager or self.start_for(window, length) is None else length

    def runs(self, window: Window) -> bool:
        """Whether `window` decodes as a graph replay."""
        length = self.length_for(window)
        return self.graphs.enabled and length is not None and length in self.graphs.graphs

    def pcm(self, codes: torch.Tensor, window: Window) -> NDArray[np.int16]:
        """The window's new samples as int16 (on the host); codes [num_codebooks, >= window.end]
        on the codec's device."""
        return self.pcm_batch([(codes, window)])[0]

    def pcm_batch(self, windows: list[tuple[torch.Tensor, Window]]) -> list[NDArray[np.int16]]:
        """Each window's new samples as int16 (on the host), decoded in one call: windows of one
        graph length, at most `rows` of it, each with its take's codes [num_codebooks, >= end]."""
        with self.lock:
            return self.launch(windows).result()

    def launch(self, windows: list[tuple[torch.Tensor, Window]]) -> Launched:
        """pcm_batch's call, launched: its samples on their way to the host (`result()` waits).
        With `lock` held until every launched call's result is read: the static buffers serve
        the next launch in stream order, and another thread's call would not be."""
        frames = [window.end - window.start for _, window in windows]
        length = self.graphs.bucket_for(max(frames))
        if len(windows) > self.rows(length) or any(self.graphs.bucket_for(f) != length for f in frames):
            raise ValueError(f"one call decodes at most {self.rows(length)} windows of one graph length")
        kept = self.kept[length]
        starts = [self.start_for(window, length) for _, window in windows]
        if any(start is None for start in starts):
            raise ValueError(f"a window's new frames do not fit the {kept} frames the {length}-frame graph keeps")
        for row, ((codes, window), span, start) in enumerate(zip(windows, frames, starts)):
            self.codes[row, :, :span].copy_(codes[:, window.start:window.end])
            self.codes[row, :, span:length].zero_()  # causal: the padding does not reach the window's frames
            self.starts[row].fill_(start or 0)
        self.codes[len(windows):self.rows(length), :, :length].zero_()  # unused rows: a fixed input
        self.starts[len(windows):self.rows(length)].zero_()
        self.graphs(length)
        pcm = self.out[:len(windows), :kept * self.codec.frame_samples]  # [windows, kept * fs]
        return Launched(pcm, [(window.emit - window.start - (start or 0), span - (start or 0))
                              for (_, window), span, start in zip(windows, frames, starts)],
                        self.codec.frame_samples)


class Launched:
    """A graph call's samples on their way to the host: pinned, non-blocking, an event behind the
    copy (engine/readback.py), so a vocoder launches its next call before this one's samples
    are read; on a CPU a copy made at once (the static buffer is the next call's)."""

    def __init__(self, pcm: torch.Tensor, spans: list[tuple[int, int]], frame_samples: int) -> None:
        self.spans, self.frame_samples = spans, frame_samples  # each row's new frames, from the first kept
        self.event: torch.cuda.Event | None = None
        if pcm.is_cuda:
            self.host = pinned_like(pcm).copy_(pcm, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = pcm.clone()

    def done(self) -> bool:
        return self.event is None or self.event.query()

    def wait(self) -> None:
        """Until the samples are on the host (polling: no blocking driver call)."""
        if self.event is not None:
            wait_for(self.event)

    def result(self) -> list[NDArray[np.int16]]:
        """Each row's new samples (waits for the copy)."""
        self.wait()
        out, fs = self.host.numpy(), self.frame_samples
        return [out[row, first * fs:end * fs] for row, (first, end) in enumerate(self.spans)]


def decode_window(codec: Codec, codes: torch.Tensor, window: Window,
                  graphs: WindowGraphs | None = None) -> NDArray[np.int16]:
    """A window's new samples as numpy int16 on the host (read without blocking other threads'
    launches); replayed from `graphs` when one of them runs it, else decoded eagerly."""
    return decode_windows(codec, [(codes, window)], graphs)[0]


def decode_windows(codec: Codec, windows: list[tuple[torch.Tensor, Window]],
                   graphs: WindowGraphs | None = None,
                   ready: Callable[[int, NDArray[np.int16]], None] | None = None) -> list[NDArray[np.int16]]:
    """Each window's new samples (numpy int16, on the host), in the order given; each window
    with its take's codes [num_codebooks, >= window.end]. The windows of one graph length
    decode together, `rows` to a call, shortest length first (a take's first windows are
    short: they do not wait behind long ones); the others eagerly, one by one. `ready(index,
    pcm)` is called as each window's samples exist, before the next call runs: a vocoder
    hands a window out then, not after every window of its drain."""
    out: list[NDArray[np.int16] | None] = [None] * len(windows)

    def put(index: int, pcm: NDArray[np.int16]) -> None:
        out[index] = pcm
        if ready is not None:
            ready(index, pcm)

    groups: dict[int, list[int]] = {}  # graph length -> indices of its windows
    for index, (codes, window) in enumerate(windows):
        length = graphs.length_for(window) if graphs is not None else None
        if length is None:
            put(index, to_host(window_pcm(codec, codes, window)).numpy())
        else:
            groups.setdefault(length, []).append(index)
    if graphs is None or not groups:
        return [pcm for pcm in out if pcm is not None]
    launched: collections.deque[tuple[list[int], Launched]] = collections.deque()

    def hand_out(wait: bool) -> None:  # the calls whose samples are on the host, in launch order
        while launched and (wait or launched[0][1].done()):
            indices, call = launched.popleft()
            for index, pcm in zip(indices, call.result()):
                put(index, pcm)

    with graphs.lock:  # every call launched before the first is read: the GPU runs them back to back
        try:
            for length, indices in sorted(groups.items()):
                rows = graphs.rows(length)
                for chunk in (indices[i:i + rows] for i in range(0, len(indices), rows)):
                    launched.append((chunk, graphs.launch([windows[i] for i in chunk])))
                    hand_out(wait=False)
            hand_out(wait=True)
        finally:  # (a call that failed to launch) those launched end before another thread's replays
            for _, call in launched:
                call.wait()
    return [pcm for pcm in out if pcm is not None]


def render_take(codec: Codec, codes: torch.Tensor, overlap: int = STREAM_OVERLAP_FRAMES,
                first_window: int | None = None, graphs: WindowGraphs | None = None) -> NDArray[np.int16]:
    """int16 PCM [frames * frame_samples]: exactly what the stream of a take with these
    final codes [num_codebooks, frames] carried, with the same settings and graphs."""
    windows = take_windows(codes.shape[1], overlap, first_window)
    return np.concatenate([decode_window(codec, codes, w, graphs) for w in windows])
