"""The codec's decoder as CUDA graphs, one per window length: a window's PCM16 from a replay.

    graphs = WindowGraphs(codec, window_lengths(overlap, first_window))   # stream.py's lengths
    graphs.capture()                             # before the first take (CUDA)
    pcm = decode_window(codec, codes, window, graphs)   # int16 numpy, the window's new samples
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
- The graph converts to PCM16 on the device; only the kept int16 samples come to the host,
  pinned and event-polled (engine/readback.py).
- The static buffers serve one window at a time: the vocoder thread and an export on the
  engine thread take a lock around copy-in, replay and read-back (replays on two streams
  would otherwise overwrite each other's buffers). The same window always decodes through
  the same graph, so `render_take` still reproduces a stream sample for sample.
- The graphs belong to whoever vocodes (the engine, its takes, the export), passed along
  with the codec rather than hung on it, so the codec and the pure schedule (stream.py)
  never import this module. Without graphs (a CPU) a window decodes eagerly.
- The graphs share one memory pool of their own (they may run while the decode graphs do).
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from numpy.typing import NDArray

from engine.drama3.codec import Codec
from engine.drama3.stream import STREAM_OVERLAP_FRAMES, Window, take_windows, window_pcm
from engine.graphs import StepGraphs
from engine.pcm import pcm16
from engine.readback import to_host


class WindowGraphs:
    """A window's PCM16 from the graph of its length (padded up), for one codec."""

    def __init__(self, codec: Codec, lengths: list[int], *, enabled: bool = True) -> None:
        self.codec, self.lengths = codec, sorted(set(lengths))
        device = codec.device
        longest = self.lengths[-1]
        self.codes = torch.zeros((codec.num_codebooks, longest), dtype=torch.long, device=device)
        self.out = torch.zeros(longest * codec.frame_samples, dtype=torch.int16, device=device)
        self.graphs = StepGraphs(self.static_window, self.lengths, enabled=enabled and device.type == "cuda",
                                 name="codec window")
        self.lock = threading.Lock()

    @property
    def captured(self) -> bool:
        return self.graphs.captured

    def capture(self) -> None:
        with self.lock:
            self.graphs.capture()

    def static_window(self, length: int) -> None:
        """What a graph captures: PCM16 of the first `length` static frames."""
        audio = self.codec.decode(self.codes[:, :length])  # [length * frame_samples] float32
        self.out[:audio.numel()].copy_(pcm16(audio))

    def runs(self, window: Window) -> bool:
        """Whether `window` decodes through a graph (else eagerly)."""
        frames = window.end - window.start
        return self.graphs.enabled and frames <= self.lengths[-1] \
            and self.graphs.bucket_for(frames) in self.graphs.graphs

    def pcm(self, codes: torch.Tensor, window: Window) -> NDArray[np.int16]:
        """The window's new samples as int16 (on the host); codes [num_codebooks, >= window.end]
        on the codec's device."""
        frames = window.end - window.start
        length = self.graphs.bucket_for(frames)
        fs = self.codec.frame_samples
        with self.lock:
            self.codes[:, :frames].copy_(codes[:, window.start:window.end])
            self.codes[:, frames:length].zero_()  # causal: the padding does not reach the window's frames
            self.graphs(length)
            kept: NDArray[np.int16] = to_host(self.out[(window.emit - window.start) * fs:frames * fs]).numpy()
        return kept


def decode_window(codec: Codec, codes: torch.Tensor, window: Window,
                  graphs: WindowGraphs | None = None) -> NDArray[np.int16]:
    """A window's new samples as numpy int16 on the host (read without blocking other threads'
    launches); replayed from `graphs` when one of them runs it, else decoded eagerly."""
    if graphs is not None and window.frames > 0 and graphs.runs(window):
        return graphs.pcm(codes, window)
    pcm: NDArray[np.int16] = to_host(window_pcm(codec, codes, window)).numpy()
    return pcm


def render_take(codec: Codec, codes: torch.Tensor, overlap: int = STREAM_OVERLAP_FRAMES,
                first_window: int | None = None, graphs: WindowGraphs | None = None) -> NDArray[np.int16]:
    """int16 PCM [frames * frame_samples]: exactly what the stream of a take with these
    final codes [num_codebooks, frames] carried, with the same settings and graphs."""
    windows = take_windows(codes.shape[1], overlap, first_window)
    return np.concatenate([decode_window(codec, codes, w, graphs) for w in windows])
