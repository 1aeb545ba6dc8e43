"""Streaming windows: the schedule, and streamed audio against a whole-take decode."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.drama3.codec import load_codec
from engine.drama3.codec_graphs import WindowGraphs, decode_window, render_take
from engine.drama3.codec_tiny import write_tiny_codec
from engine.drama3.stream import (
    STREAM_OVERLAP_FRAMES,
    StreamSchedule,
    take_windows,
    window_ends,
    window_lengths,
    window_pcm,
)
from engine.errors import RequestError
from engine.pcm import pcm16

TAKE_FRAMES = 480  # past 320 frames, so the last windows' context is cut at 320



@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory):
    directory: Path = tmp_path_factory.mktemp("codec")
    write_tiny_codec(directory, seed=0)
    return load_codec(directory, "cpu")


def random_codes(codec, frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, size, (frames,), generator=g) for size in codec.codebook_sizes])


@pytest.fixture(scope="module")
def take(codec) -> tuple[torch.Tensor, np.ndarray]:
    """A take's codes and its whole-take decode as PCM16."""
    codes = random_codes(codec, TAKE_FRAMES, seed=11)
    return codes, pcm16(codec.decode(codes)).numpy()


def snr_db(reference: np.ndarray, streamed: np.ndarray) -> float:
    reference, streamed = reference.astype(np.float64), streamed.astype(np.float64)
    return float(10 * np.log10((reference**2).sum() / max(((reference - streamed) ** 2).sum(), 1e-12)))


# ─── The schedule ─────────────────────────────────────────────────────────────


def test_window_ends_follow_the_seed() -> None:
    assert list(itertools.islice(window_ends(), 9)) == [10, 20, 32, 64, 128, 192, 256, 320, 384]
    assert list(itertools.islice(window_ends(4), 6)) == [4, 10, 20, 32, 64, 128]
    assert list(itertools.islice(window_ends(15), 4)) == [15, 20, 32, 64]
    assert list(itertools.islice(window_ends(10), 4)) == [10, 20, 32, 64]


@pytest.mark.parametrize(("first_window", "ends"), [
    (None, [10, 20, 32, 64, 128, 192, 256]),
    (1, [1, 2, 4, 10, 20, 32, 64]),  # doubles up to 5 frames, then the seed's ends
    (2, [2, 4, 10, 20, 32, 64, 128]),
    (3, [3, 10, 20, 32, 64, 128, 192]),  # 6 would pass 5
    (4, [4, 10, 20, 32, 64, 128, 192]),
    (5, [5, 10, 20, 32, 64, 128, 192]),
    (12, [12, 20, 32, 64, 128, 192, 256]),
])
def test_a_small_first_window_ramps_up_to_the_seed(first_window: int | None, ends: list[int]) -> None:
    assert list(itertools.islice(window_ends(first_window), len(ends))) == ends


@pytest.mark.parametrize("first_window", [1, 2, 3, 4, 5])
def test_the_ramp_decodes_no_more_frames_than_were_sent(first_window: int) -> None:
    """Before the seed's first end, each window's new frames are at most the frames sent before it."""
    ramp = list(itertools.takewhile(lambda end: end < 10, window_ends(first_window)))
    assert ramp[0] == first_window
    for sent, end in itertools.pairwise(ramp):
        assert end - sent <= sent
    assert 2 * ramp[-1] > 5  # the ramp stops only where a doubled end would pass half of 10


@pytest.mark.parametrize("first_window", [0, -1])
def test_window_ends_refuse_an_empty_first_window(first_window: int) -> None:
    with pytest.raises(ValueError, match="first window"):
        window_ends(first_window)


@pytest.mark.parametrize("frames", [0, 1, 2, 3, 4, 5, 9, 10, 11, 20, 64, 65, 200, 500])
@pytest.mark.parametrize(("overlap", "first_window"), [(320, None), (32, None), (0, None), (320, 3), (5, 40),
                                                       (320, 1), (0, 1), (2, 1), (320, 2)])
def test_windows_tile_the_take_exactly(frames: int, overlap: int, first_window: int | None) -> None:
    windows = take_windows(frames, overlap, first_window)
    assert windows[0].emit == 0 and windows[-1].end == frames
    assert [w.last for w in windows] == [False] * (len(windows) - 1) + [True]
    for before, after in itertools.pairwise(windows):
        assert after.emit == before.end  # no gap, no overlap
    for w in windows:
        assert w.start == max(0, w.emit - overlap) and w.emit <= w.end
    assert sum(w.frames for w in windows) == frames
    scheduled = set(itertools.takewhile(lambda end: end <= frames, window_ends(first_window)))
    assert {w.end for w in windows[:-1]} == scheduled
    assert (windows[-1].frames == 0) == (frames in scheduled or frames == 0)


def test_the_generation_loop_gets_the_same_windows_however_often_it_asks() -> None:
    expected = take_windows(300, 320, 4)
    for every in (1, 7, 300):
        schedule, windows = StreamSchedule(320, first_window=4), []
        for frames in range(every, 300 + every, every):
            frames = min(frames, 300)
            while (window := schedule.due(frames)) is not None:
                windows.append(window)
        windows.append(schedule.final(300))
        assert windows == expected


@pytest.mark.parametrize(("overlap", "first_window"), [(-1, None), (1.5, None), (True, None), (32, 0), (32, "4")])
def test_bad_stream_settings_are_refused(overlap, first_window) -> None:
    with pytest.raises(RequestError, match=r"overlap|first window"):
        StreamSchedule(overlap, first_window)


# ─── Streamed audio ───────────────────────────────────────────────────────────


def test_streamed_take_equals_a_whole_take_decode_at_320_frames(codec, take) -> None:
    codes, whole = take
    streamed = render_take(codec, codes, overlap=320)
    assert streamed.dtype == np.int16 and streamed.shape == whole.shape == (TAKE_FRAMES * 2048,)
    assert np.abs(whole.astype(np.int32)).mean() > 1000  # real audio, not silence
    assert snr_db(whole, streamed) >= 45
    # Where the context was cut (frames 384..480), too.
    cut = next(w for w in take_windows(TAKE_FRAMES, 320) if w.start > 0).emit * 2048
    assert cut < whole.size and snr_db(whole[cut:], streamed[cut:]) >= 45


def test_short_context_breaks_the_equality(codec, take) -> None:
    """The tiny codec's transformers reach far back, like the release's: 32 frames of
    context (SGLang Omni's default) leave the stream far from the whole take."""
    codes, whole = take
    streamed = render_take(codec, codes, overlap=32)
    assert streamed.shape == whole.shape
    assert snr_db(whole, streamed) < 25


def test_windows_decoded_from_the_start_are_the_whole_take(codec, take) -> None:
    codes, whole = take
    window = take_windows(TAKE_FRAMES, 320)[3]  # frames 32..64, context from frame 0
    assert window.start == 0
    pcm = decode_window(codec, codes, window)
    assert pcm.shape == (window.frames * 2048,)
    assert np.abs(pcm.astype(np.int32) - whole[window.emit * 2048: window.end * 2048]).max() <= 1


@pytest.mark.parametrize(("first_window", "first_starts"), [(3, [0, 3, 10]), (1, [0, 1, 2, 4, 10])])
def test_render_take_is_what_the_stream_carried(codec, first_window: int, first_starts: list[int]) -> None:
    """A stream driven frame by frame from a growing codes buffer, with a small first
    window, and the export of the final codes: the same PCM16, sample for sample."""
    frames = 150
    codes = random_codes(codec, frames, seed=12)
    schedule, buffer, streamed, starts = StreamSchedule(overlap=40, first_window=first_window), codes[:, :0], [], []
    for produced in range(1, frames + 1):
        buffer = codes[:, :produced]  # what exists so far
        while (window := schedule.due(produced)) is not None:
            streamed.append(window_pcm(codec, buffer, window).numpy())
            starts.append(window.emit * 2048)
    final = schedule.final(frames)
    streamed.append(decode_window(codec, buffer, final))
    starts.append(final.emit * 2048)
    assert starts[:len(first_starts)] == [frame * 2048 for frame in first_starts]
    assert [s + p.size for s, p in zip(starts, streamed)][:-1] == starts[1:]
    exported = render_take(codec, codes, overlap=40, first_window=first_window)
    assert np.array_equal(np.concatenate(streamed), exported)
    whole = pcm16(codec.decode(codes)).numpy()
    assert exported.shape == whole.shape


def test_empty_take_renders_no_samples(codec) -> None:
    assert render_take(codec, torch.zeros((10, 0), dtype=torch.long)).shape == (0,)


# ─── Window lengths and their graphs ──────────────────────────────────────────


@pytest.mark.parametrize(("overlap", "first_window"), [(320, 4), (320, None), (32, None), (0, 4),
                                                       (0, None), (320, 1), (32, 1), (0, 1), (0, 2)])
def test_window_lengths_are_every_length_the_windows_take(overlap: int, first_window: int | None) -> None:
    lengths = window_lengths(overlap, first_window)
    windows = take_windows(2000, overlap, first_window)
    scheduled = {w.end - w.start for w in windows[:-1]}  # the last window is whatever is left
    assert scheduled == set(lengths) and len(lengths) == len(set(lengths))
    assert all((w.end - w.start) <= max(lengths) for w in windows)
    assert window_lengths(320, 4) == [4, 10, 20, 32, 64, 128, 192, 256, 320, 384]
    assert window_lengths(320, 1) == [1, 2, 4, 10, 20, 32, 64, 128, 192, 256, 320, 384]
    assert window_lengths(0, None) == [10, 12, 32, 64]  # 10 twice (0-10, 10-20) ends no list early


@pytest.mark.parametrize("first_window", [4, 1])
def test_a_window_padded_to_a_longer_graph_keeps_its_samples(codec, take, first_window: int) -> None:
    """WindowGraphs' path (codes padded with zeros up to the next captured length, PCM16 of
    the window's frames kept), run eagerly on a CPU: the codec is causal, so it gives the
    window's own samples (to a rounding step) for every window of a take, the last included."""
    codes, _ = take
    graphs = WindowGraphs(codec, window_lengths(STREAM_OVERLAP_FRAMES, first_window))
    assert not graphs.graphs.enabled  # a CPU: the graphed windows' code runs eagerly
    padded = 0
    for window in take_windows(TAKE_FRAMES - 3, STREAM_OVERLAP_FRAMES, first_window):
        if window.frames == 0:
            continue
        padded += graphs.graphs.bucket_for(window.end - window.start) > window.end - window.start
        assert graphs.length_for(window) is not None  # every window of the stream has its graph
        got = graphs.pcm(codes, window)
        expected = window_pcm(codec, codes, window).numpy()
        assert got.shape == expected.shape and np.abs(got.astype(int) - expected).max() <= 1
    assert padded >= 1
    # Past the first lengths the graphs run their convolutions on a tail: the new frames, at
    # most, and the convolutions' context (codec.py decode_tail).
    assert graphs.kept[384] == 64 + codec.conv_context and graphs.kept[first_window] == first_window
