"""A take's codec state between its streamed windows, and a window decoded from it: only the
window's new frames run through the codec's post transformer.

    state = StreamState()                                # one per take, before its first window
    pcm = window_pcm(codec, codes, window, state)        # int16 [window.frames * frame_samples]

Design choices:
- The codec is causal (codec_layers.py): a frame's samples depend on it and the frames before
  it. What reaches far back is the quantiser's post transformer (8 layers, each step
  attending to 128 steps: stacked, hundreds of frames). The seed (and SGLang Omni, with 32
  frames) decoded each window again from its left context: with 320 frames, ~50 dB from a
  whole-take decode, and the transformer ran over 330 to 384 frames for 1 to 64 new ones,
  every window. A `CodecState` keeps what a take's next window needs of the frames before
  it: each layer's last `window - 1` keys and values (what the new steps attend to;
  codec_transformer.py `Memory`) and the last `conv_context` transformed frames (what the
  upsampling's and the decoder's convolutions reach). A window then runs the transformer over
  its new frames only and the convolutions over those and `conv_context` frames before them,
  and its samples are the whole take's decode of its frames, to rounding, however long the
  take.
- Static shapes and the bookkeeping on the device: a call decodes codes [B, N, n] with `count`
  [B] real frames a row (the rest is padding on the right: causal, it changes none of the
  row's samples) and moves the state on by `count` in place, so a CUDA graph captures the call
  with the state in its static buffers (codec_graphs.py).
- `context` is `conv_context`, or 0 for a take's first window: nothing comes before it, and
  its convolutions run on its own frames only (as the whole take's do at its start), so a
  take's first audio does not pay for context it does not have.
- `StreamState` is the host's side: the device state, made by the take's first window on the
  codec's device (on the vocoder's stream), and the frames decoded. A window must start
  where the state ends: decoded twice or out of order it is refused, never decoded from a
  state that is not its own.
- Memory: 8.3 MB a take at the release's size (8 layers x 127 steps x keys and values x
  1,024 float32 values), from its first window to its last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.drama3.codec import Codec
from engine.drama3.codec_transformer import Memory
from engine.drama3.stream import Window
from engine.pcm import pcm16


@dataclass
class CodecState:
    """What a take's next window needs of its frames so far."""

    keys: torch.Tensor  # [L, B, H, P, Dh] float32: each post-transformer layer's last P = window - 1 steps
    values: torch.Tensor  # [L, B, H, P, Dh]
    tail: torch.Tensor  # [B, C, conv_context]: the last conv_context transformed frames
    frames: torch.Tensor  # [B] long: frames decoded

    def copy_(self, other: CodecState, into: slice | int = slice(None), row: slice | int = slice(None)) -> None:
        """Rows `row` of `other` into rows `into` of this state."""
        self.keys[:, into].copy_(other.keys[:, row])
        self.values[:, into].copy_(other.values[:, row])
        self.tail[into].copy_(other.tail[row])
        self.frames[into].copy_(other.frames[row])


def new_state(codec: Codec, batch: int) -> CodecState:
    """The state before any frame: nothing decoded, every value zero."""
    post = codec.quantizer.post_module
    weight = post.norm.weight  # (the dtype and device of its values)
    shape = (len(post.layers), batch, post.n_head, post.window - 1, post.head_dim)
    return CodecState(weight.new_zeros(shape), weight.new_zeros(shape),
                      weight.new_zeros(batch, post.input_dim, codec.conv_context),
                      torch.zeros(batch, dtype=torch.long, device=weight.device))


def decode_next(codec: Codec, codes: torch.Tensor, state: CodecState, count: torch.Tensor,
                context: int) -> torch.Tensor:
    """float32 waveforms [B, (context + n) * frame_samples] of the next frames codes [B, N, n]
    of each row's take (`count` [B] of them real, the rest padding), with `context` frames
    before them (fewer at a take's start: its frames from 0); moves `state` on by `count`."""
    if codes.dim() != 3 or codes.shape[1] != codec.num_codebooks:
        raise ValueError(f"the codec decodes codes [batch, {codec.num_codebooks}, frames]; got {tuple(codes.shape)}")
    new = codes.shape[2]
    device = state.frames.device
    memory = Memory(state.frames, list(state.keys.unbind(0)), list(state.values.unbind(0)))
    z = codec.quantizer.transformed(codes.to(device, torch.long), memory)  # [B, C, n]
    held = state.tail.shape[2]
    transformed = torch.cat((state.tail, z), 2)  # [B, C, held + n]: the tail's frames, then the new ones
    # The convolutions read `context` frames before the new ones, or from the take's frame 0:
    # the index runs past the row's frames there (clamped: causal, they follow every kept one).
    first = held - torch.clamp(state.frames, max=context)  # [B]
    index = (first[:, None] + torch.arange(context + new, device=device)).clamp(max=held + new - 1)  # [B, context + n]
    kept = transformed.gather(2, index[:, None, :].expand(-1, transformed.shape[1], -1))  # [B, C, context + n]
    latent = codec.quantizer.upsample(kept)  # [B, C, 4 (context + n)]
    audio: torch.Tensor = codec.decoder(latent.to(codec.decoder_dtype))[:, 0].float()  # [B, (context + n) * fs]
    # The next window's state: each row's last P steps and `held` frames, ending at its count.
    past = state.keys.shape[3]
    steps = count[:, None] + torch.arange(past, device=device)  # [B, P] into [P + n]
    steps = steps[:, None, :, None].expand(-1, state.keys.shape[2], -1, state.keys.shape[4])  # [B, H, P, Dh]
    state.keys.copy_(torch.stack([keys.gather(2, steps) for keys in memory.keys]))  # [L, B, H, P, Dh]
    state.values.copy_(torch.stack([values.gather(2, steps) for values in memory.values]))
    tail = (count[:, None] + torch.arange(held, device=device))[:, None, :]  # [B, 1, held] into [held + n]
    state.tail.copy_(transformed.gather(2, tail.expand(-1, transformed.shape[1], -1)))
    state.frames.add_(count)
    return audio


class StreamState:
    """One take's codec state between its windows (made by its first window, on the codec's
    device) and the frames decoded so far."""

    def __init__(self) -> None:
        self.codec: CodecState | None = None
        self.frames = 0

    def check(self, window: Window) -> None:
        if window.emit != self.frames:
            raise ValueError(f"a take's window from frame {window.emit} cannot follow its decoded "
                             f"{self.frames} frames: windows decode once each, in order")

    def state(self, codec: Codec) -> CodecState:
        if self.codec is None:
            self.codec = new_state(codec, 1)
        return self.codec


def context_for(codec: Codec, window: Window) -> int:
    """Frames of context a window's convolutions read before its new frames (0 at a take's start)."""
    return codec.conv_context if window.emit else 0


def window_pcm(codec: Codec, codes: torch.Tensor, window: Window, stream: StreamState) -> torch.Tensor:
    """int16 PCM [window.frames * frame_samples] of a window, on the codec's device, decoded
    alone; `codes` [num_codebooks, >= window.end] holds the take's frames so far."""
    if window.frames == 0:
        return torch.zeros(0, dtype=torch.int16, device=codec.device)
    stream.check(window)
    state, context = stream.state(codec), context_for(codec, window)
    count = torch.full((1,), window.frames, device=state.frames.device)  # (a fill: no copy from host memory)
    audio = decode_next(codec, codes[None, :, window.emit:window.end], state, count, context)
    stream.frames = window.end
    offset = min(window.emit, context) * codec.frame_samples
    return pcm16(audio[0, offset:offset + window.frames * codec.frame_samples])  # [frames * frame_samples]
