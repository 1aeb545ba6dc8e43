"""On a GPU: a window's PCM16 replayed from the CUDA graph of its length (codec_graphs.py)
equals the same padded window decoded eagerly (the convolutions on the graph's kept frames),
sample for sample, and the unpadded window to
rounding, for every window of a take (the last, padded one included), with the tiny codec
and with a random codec of the release's size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.drama3.codec import CodecConfig, load_codec, ready
from engine.drama3.codec_graphs import WindowGraphs
from engine.drama3.codec_tiny import random_codec
from engine.drama3.stream import STREAM_OVERLAP_FRAMES, take_windows, window_lengths, window_pcm
from engine.pcm import pcm16

pytestmark = pytest.mark.gpu


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    reference, other = reference.astype(np.float64), other.astype(np.float64)
    return float(10 * np.log10((reference**2).sum() / max(((reference - other) ** 2).sum(), 1e-12)))


def tail(codec, graphs: WindowGraphs, padded: torch.Tensor, windows: list, length: int) -> list[np.ndarray]:
    """What the graph of `length` computes for padded codes [rows, N, length], eagerly: the
    convolutions on its kept frames (codec.decode_tail), each window's new samples."""
    fs, kept = codec.frame_samples, graphs.kept[length]
    starts = [graphs.start_for(window, length) for window in windows]
    starts += [0] * (len(padded) - len(starts))  # the unused rows
    if kept == length:
        audio = codec.decode_batch(padded)
    else:
        audio = codec.decode_tail(padded, torch.tensor(starts, device=padded.device), kept)
    pcm = pcm16(audio).cpu().numpy()  # [rows, kept * fs]
    return [pcm[row, (w.emit - w.start - start) * fs:(w.end - w.start - start) * fs]
            for row, (w, start) in enumerate(zip(windows, starts))]


@pytest.mark.parametrize("size", ["tiny", "release"])
def test_window_graphs_equal_eager_windows(tiny_checkpoint, size: str) -> None:
    codec = load_codec(tiny_checkpoint, "cuda") if size == "tiny" else \
        ready(random_codec(CodecConfig.from_dict(), seed=0, device="cuda"), "cuda")
    frames = 500
    g = torch.Generator().manual_seed(4)
    codes = torch.stack([torch.randint(0, n, (frames,), generator=g) for n in codec.codebook_sizes]).cuda()
    graphs = WindowGraphs(codec, window_lengths(STREAM_OVERLAP_FRAMES, 4))
    with torch.inference_mode():
        graphs.capture()
        assert not graphs.graphs.eager, graphs.graphs.eager
        assert set(graphs.graphs.graphs) == set(window_lengths(STREAM_OVERLAP_FRAMES, 4))
        for window in take_windows(frames - 5, STREAM_OVERLAP_FRAMES, 4):
            if window.frames == 0:
                continue
            assert graphs.runs(window)
            replayed = graphs.pcm(codes, window)
            length, span = graphs.graphs.bucket_for(window.end - window.start), window.end - window.start
            padded = torch.zeros((1, codec.num_codebooks, length), dtype=torch.long, device="cuda")
            padded[0, :, :span] = codes[:, window.start:window.end]
            eager = tail(codec, graphs, padded, [window], length)[0]
            assert np.array_equal(replayed, eager), window
            plain = window_pcm(codec, codes, window).cpu().numpy()
            assert snr_db(plain, replayed) > 30, (window, snr_db(plain, replayed))


@pytest.mark.parametrize("size", ["tiny", "release"])
def test_batched_window_graphs_equal_each_window_alone(tiny_checkpoint, size: str) -> None:
    """Windows of four takes decoded together in the graphs of 4 rows (the long lengths): each
    row equals the same window decoded alone in that graph (other rows zero) sample for sample,
    whatever its row and its neighbours (so render_take reproduces a batched stream), and
    equals the padded batch decoded eagerly."""
    codec = load_codec(tiny_checkpoint, "cuda") if size == "tiny" else \
        ready(random_codec(CodecConfig.from_dict(), seed=0, device="cuda"), "cuda")
    lengths = window_lengths(STREAM_OVERLAP_FRAMES, 4)
    graphs = WindowGraphs(codec, lengths, batch=4)
    g = torch.Generator().manual_seed(5)
    takes = [torch.stack([torch.randint(0, n, (500,), generator=g) for n in codec.codebook_sizes]).cuda()
             for _ in range(5)]
    with torch.inference_mode():
        graphs.capture()
        assert not graphs.graphs.eager, graphs.graphs.eager
        by_length: dict[int, list] = {}
        for cut, codes in enumerate(takes):  # each take ends elsewhere: its last window pads differently
            for window in take_windows(500 - 7 * cut, STREAM_OVERLAP_FRAMES, 4):
                if (length := graphs.length_for(window)) is not None:
                    by_length.setdefault(length, []).append((codes, window))
        batched_lengths = [length for length in by_length if graphs.rows(length) == 4]
        assert batched_lengths and max(batched_lengths) == max(lengths)
        for length, windows in by_length.items():
            rows = graphs.rows(length)
            for start in range(0, len(windows), rows):
                group = windows[start:start + rows][::-1 if start % 2 else 1]  # rows in both orders
                together = graphs.pcm_batch(group)
                padded = torch.zeros((rows, codec.num_codebooks, length), dtype=torch.long, device="cuda")
                for row, (codes, window) in enumerate(group):
                    padded[row, :, :window.end - window.start] = codes[:, window.start:window.end]
                eager = tail(codec, graphs, padded, [window for _, window in group], length)
                for row, ((codes, window), pcm) in enumerate(zip(group, together)):
                    alone = graphs.pcm(codes, window)
                    assert np.array_equal(pcm, alone), (length, row, window)
                    assert np.array_equal(pcm, eager[row]), (length, row)


def test_the_decoders_snakes_in_one_pass_match_the_layer_at_the_release_size() -> None:
    """`ready` fuses every Snake of the decoder (engine/kernels/snake.py): the window decodes
    as with the layers' own arithmetic, to float16 rounding carried through 25 random-weight
    convolutions (on an H100: 52 dB, max 88 of 32,767; each Snake's own values agree to one
    rounding in test_snake.py, and a mere reordering of the convolutions' sums moved this PCM
    by as much, max 112, stop 37)."""
    from engine.drama3.codec_layers import Snake

    codec = ready(random_codec(CodecConfig.from_dict(), seed=0, device="cuda"), "cuda")
    snakes = [m for m in codec.decoder.modules() if isinstance(m, Snake)]
    assert snakes and all(m.inverse is not None for m in snakes)
    g = torch.Generator().manual_seed(7)
    codes = torch.stack([torch.randint(0, n, (384,), generator=g) for n in codec.codebook_sizes]).cuda()
    with torch.inference_mode():
        fused = pcm16(codec.decode_tail(codes[None], 310, 74)).cpu().numpy()
        for m in snakes:
            m.inverse = None
        plain = pcm16(codec.decode_tail(codes[None], 310, 74)).cpu().numpy()
    from engine.kernels.fallback import failures

    assert "codec snake" not in failures()
    assert snr_db(plain, fused) > 40, snr_db(plain, fused)
