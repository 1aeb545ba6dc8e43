"""Mimi's convolutions: streaming causal Conv1d / ConvTranspose1d and the SEANet encoder and decoder.

Design choices:
- Every convolution streams (streaming.py): its state is a static per-slot buffer (a
  call of B rows uses the first B slots: a batch bucket), and `reset_streams(rows)` gives
  chosen rows a fresh stream (a masked fill: no host sync), as Moshi's `StreamingConv1d` /
  `StreamingConvTranspose1d` do (moshi `modules/conv.py`):
  - Conv1d keeps the last `effective_kernel - stride` input samples as left context, zero
    at stream start; with `replicate` (the 25 -> 12.5 Hz resampler) the first input sample
    of a stream fills that context instead.
  - ConvTranspose1d keeps the `kernel - stride` overlap-add tail; the bias, already in the
    next frame's output, is taken out of the saved tail.
- The module tree mirrors Moshi's SEANet (`model.{i}`, `block.{j}`), so checkpoint keys map
  with one rename (`.conv.conv.` -> `.conv.`, `.convtr.convtr.` -> `.convtr.`, checkpoint.py).
- A frame's length is a multiple of every stride (1920 samples), so no padding logic.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.personaplex.config import MimiConfig
from engine.personaplex.streaming import StreamingModule


class StreamingConv1d(StreamingModule):
    previous: torch.Tensor  # [B, cin, context]: the last input samples
    first: torch.Tensor  # [B] bool: the row's next call starts its stream

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, bias: bool = True, replicate: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, groups=groups, bias=bias)
        self.context = (kernel - 1) * dilation + 1 - stride
        self.replicate = replicate
        self.register_buffer("previous", torch.zeros(0), persistent=False)
        self.register_buffer("first", torch.zeros(0, dtype=torch.bool), persistent=False)

    def _setup_stream(self, batch: int) -> None:
        w = self.conv.weight
        self.previous = torch.zeros(batch, w.shape[1] * self.conv.groups, self.context, dtype=w.dtype, device=w.device)
        self.first = torch.ones(batch, dtype=torch.bool, device=w.device)

    def _reset_stream(self, rows: torch.Tensor) -> None:
        self.previous.masked_fill_(rows[:, None, None], 0)
        self.first.logical_or_(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.context > 0:
            previous = self.previous[:x.shape[0]]  # a batch bucket runs the first B slots
            context = previous
            if self.replicate:
                first = self.first[:x.shape[0]]
                context = torch.where(first[:, None, None], x[..., :1], previous)  # a stream's start: its first sample
                first.copy_(self.kept(torch.zeros_like(first), first))
            x = torch.cat([context, x], dim=-1)
            previous.copy_(self.kept(x[..., -self.context:], previous))
        out: torch.Tensor = self.conv(x)
        return out


class StreamingConvTranspose1d(StreamingModule):
    partial: torch.Tensor  # [B, cout, tail]: the overlap-add tail for the next call

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int = 1, bias: bool = True):
        super().__init__()
        self.convtr = nn.ConvTranspose1d(cin, cout, kernel, stride, groups=groups, bias=bias)
        self.tail = kernel - stride
        self.register_buffer("partial", torch.zeros(0), persistent=False)

    def _setup_stream(self, batch: int) -> None:
        w = self.convtr.weight
        cout = w.shape[1] * self.convtr.groups
        self.partial = torch.zeros(batch, cout, self.tail, dtype=w.dtype, device=w.device)

    def _reset_stream(self, rows: torch.Tensor) -> None:
        self.partial.masked_fill_(rows[:, None, None], 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.convtr(x)
        if self.tail == 0:
            return y
        partial = self.partial[:x.shape[0]]  # a batch bucket runs the first B slots
        y[..., :self.tail] += partial
        tail = y[..., -self.tail:]
        if self.convtr.bias is not None:
            tail = tail - self.convtr.bias[:, None]
        partial.copy_(self.kept(tail, partial))
        return y[..., :-self.tail]


class ResBlock(nn.Module):
    """x + conv1(elu(conv_k(elu(x)))): a true skip, hidden width dim // compress."""

    def __init__(self, dim: int, kernel: int, dilation: int, compress: int):
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(nn.ELU(), StreamingConv1d(dim, hidden, kernel, dilation=dilation),
                                   nn.ELU(), StreamingConv1d(hidden, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.block(x)
        return out


def _resblocks(cfg: MimiConfig, dim: int) -> list[nn.Module]:
    return [ResBlock(dim, cfg.residual_kernel_size, cfg.dilation_base ** j, cfg.compress)
            for j in range(cfg.n_residual_layers)]


class SEANetEncoder(nn.Module):
    """[B, 1, samples] -> [B, dimension, samples / hop]."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        mult = 1
        layers: list[nn.Module] = [StreamingConv1d(1, cfg.n_filters, cfg.kernel_size)]
        for ratio in reversed(cfg.ratios):
            layers += _resblocks(cfg, mult * cfg.n_filters)
            layers += [nn.ELU(), StreamingConv1d(mult * cfg.n_filters, 2 * mult * cfg.n_filters, 2 * ratio, ratio)]
            mult *= 2
        layers += [nn.ELU(), StreamingConv1d(mult * cfg.n_filters, cfg.dimension, cfg.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x)
        return out


class SEANetDecoder(nn.Module):
    """[B, dimension, positions] -> [B, 1, positions * hop]."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        mult = 2 ** len(cfg.ratios)
        layers: list[nn.Module] = [StreamingConv1d(cfg.dimension, mult * cfg.n_filters, cfg.kernel_size)]
        for ratio in cfg.ratios:
            layers += [nn.ELU(), StreamingConvTranspose1d(mult * cfg.n_filters, mult * cfg.n_filters // 2,
                                                          2 * ratio, ratio)]
            layers += _resblocks(cfg, mult * cfg.n_filters // 2)
            mult //= 2
        layers += [nn.ELU(), StreamingConv1d(cfg.n_filters, 1, cfg.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x)
        return out

