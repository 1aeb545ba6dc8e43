"""On a GPU: a window's PCM16 replayed from the CUDA graph of its frame count (codec_graphs.py)
equals the same padded window decoded eagerly from the same codec state, sample for sample,
for every window of a take (the last, padded one included); the streamed take is the
whole-take decode to float16 rounding, and the same after the graphs
are captured again; with the tiny codec and a random codec of the release's size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.drama3.codec import CodecConfig, load_codec, ready
from engine.drama3.codec_graphs import WindowGraphs, decode_windows, render_take
from engine.drama3.codec_stream import StreamState, decode_next, new_state
from engine.drama3.codec_tiny import random_codec
from engine.drama3.stream import Window, first_frames, take_windows, window_frames
from engine.pcm import pcm16

pytestmark = pytest.mark.gpu
DEVICE = "cuda"  # (the tests' logic runs on a CPU too, eagerly, with DEVICE = "cpu")


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    reference, other = reference.astype(np.float64), other.astype(np.float64)
    return float(10 * np.log10((reference**2).sum() / max(((reference - other) ** 2).sum(), 1e-12)))


def load(tiny_checkpoint, size: str):
    return load_codec(tiny_checkpoint, DEVICE) if size == "tiny" else \
        ready(random_codec(CodecConfig.from_dict(), seed=0, device=DEVICE), DEVICE)


def random_takes(codec, count: int, frames: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.stack([torch.randint(0, n, (frames,), generator=g) for n in codec.codebook_sizes]).to(DEVICE)
            for _ in range(count)]


def padded_eagerly(codec, graphs: WindowGraphs, take: torch.Tensor, window: Window, stream: StreamState) -> np.ndarray:
    """What the graph of the window's key computes, eagerly: its codes padded to the graph's frame
    count, from a copy of its take's state; the window's new samples."""
    key = graphs.key_for(window)
    assert key is not None
    context, frames = key
    codes = torch.zeros((1, codec.num_codebooks, frames), dtype=torch.long, device=DEVICE)
    codes[0, :, :window.frames] = take[:, window.emit:window.end]
    count = torch.full((1,), window.frames, dtype=torch.long, device=DEVICE)
    state = new_state(codec, 1)
    if stream.codec is not None:
        state.copy_(stream.codec, into=0, row=0)
    pcm = pcm16(decode_next(codec, codes, state, count, context)).cpu().numpy()  # [1, (context + frames) * fs]
    first = min(window.emit, context) * codec.frame_samples
    return pcm[0, first:first + window.frames * codec.frame_samples]


@pytest.mark.parametrize("size", ["tiny", "release"])
def test_window_graphs_equal_eager_windows_and_the_stream_the_whole_take(tiny_checkpoint, size: str) -> None:
    codec = load(tiny_checkpoint, size)
    frames = 500
    codes = random_takes(codec, 1, frames, seed=4)[0]
    graphs = WindowGraphs(codec, [first_frames(4)], window_frames(4))
    stream = StreamState()
    with torch.inference_mode():
        graphs.capture()
        assert not graphs.graphs.eager and not graphs.firsts.eager, (graphs.graphs.eager, graphs.firsts.eager)
        assert graphs.count_captured == len(window_frames(4)) + 1 or DEVICE == "cpu"
        for window in take_windows(frames - 5, 4):
            if window.frames == 0:
                continue
            assert graphs.runs(window) or DEVICE == "cpu"
            eager = padded_eagerly(codec, graphs, codes, window, stream)
            replayed = graphs.pcm((codes, window, stream))
            assert np.array_equal(replayed, eager), window
        assert stream.frames == frames - 5
        streamed = render_take(codec, codes, 4, graphs)
        whole = pcm16(codec.decode(codes)).cpu().numpy()
        # Captured again with the static buffers holding the last window's count and state (as an
        # engine warmed up again after takes: stop 41's device-side assert), the same stream.
        graphs.capture()
        assert np.array_equal(render_take(codec, codes, 4, graphs), streamed)
    # The decoder runs in float16: the windows' convolutions and the whole take's round
    # differently (the seed's 320 frames of context gave 47.7 dB with random release weights).
    assert streamed.shape == whole.shape and snr_db(whole, streamed) > 40, snr_db(whole, streamed)


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


def test_each_graph_call_reports_its_time_on_the_gpu(tiny_checkpoint) -> None:
    """`decode_windows(..., timed=)` (the vocoder's pace line): one time per graph call, from its
    copies in to its samples' copy out, as long as the replay at least; the samples the same."""
    codec = load(tiny_checkpoint, "tiny")
    codes = random_takes(codec, 1, 120, seed=6)[0]
    graphs = WindowGraphs(codec, [first_frames(1)], window_frames(1))
    times: list[float] = []
    with torch.inference_mode():
        graphs.capture()
        windows = [(codes, window, StreamState()) for window in take_windows(100, 1)[:1]]
        stream = windows[0][2]
        windows += [(codes, window, stream) for window in take_windows(100, 1)[1:] if window.frames]
        timed = decode_windows(codec, windows, graphs, timed=times.append)
        again = StreamState()
        plain = decode_windows(codec, [(c, w, again) for c, w, _ in windows], graphs)
    assert len(times) == len(windows) and all(0 < ms < 1000 for ms in times), times
    assert all(np.array_equal(a, b) for a, b in zip(timed, plain))
