"""Streaming windows: the schedule, and streamed audio (each window after its take's codec
state) against a whole-take decode."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.drama3.codec import load_codec
from engine.drama3.codec_graphs import WindowGraphs, decode_window, render_take
from engine.drama3.codec_stream import StreamState, window_pcm
from engine.drama3.codec_tiny import write_tiny_codec
from engine.drama3.stream import (
    StreamSchedule,
    Window,
    first_frames,
    take_windows,
    window_ends,
    window_frames,
)
from engine.errors import RequestError
from engine.pcm import pcm16

TAKE_FRAMES = 480  # past 320 frames: the seed cut each window's context there



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
@pytest.mark.parametrize("first_window", [None, 1, 2, 3, 40])
def test_windows_tile_the_take_exactly(frames: int, first_window: int | None) -> None:
    windows = take_windows(frames, first_window)
    assert windows[0].emit == 0 and windows[-1].end == frames
    assert [w.last for w in windows] == [False] * (len(windows) - 1) + [True]
    for before, after in itertools.pairwise(windows):
        assert after.emit == before.end  # no gap, no overlap
    assert all(w.emit <= w.end for w in windows)
    assert sum(w.frames for w in windows) == frames
    scheduled = set(itertools.takewhile(lambda end: end <= frames, window_ends(first_window)))
    assert {w.end for w in windows[:-1]} == scheduled
    assert (windows[-1].frames == 0) == (frames in scheduled or frames == 0)


def test_the_generation_loop_gets_the_same_windows_however_often_it_asks() -> None:
    expected = take_windows(300, 4)
    for every in (1, 7, 300):
        schedule, windows = StreamSchedule(first_window=4), []
        for frames in range(every, 300 + every, every):
            frames = min(frames, 300)
            while (window := schedule.due(frames)) is not None:
                windows.append(window)
        windows.append(schedule.final(300))
        assert windows == expected


@pytest.mark.parametrize("first_window", [0, -1, 1.5, True, "4"])
def test_bad_stream_settings_are_refused(first_window) -> None:
    with pytest.raises(RequestError, match="first window must be a whole number of frames >= 1"):
        StreamSchedule(first_window)


# ─── Streamed audio ───────────────────────────────────────────────────────────


def test_a_streamed_take_is_the_whole_take_decode(codec, take) -> None:
    """Each window after its take's codec state: the whole take's samples, to a rounding step,
    from the first window to past 320 frames (where the seed's windows cut their context)."""
    codes, whole = take
    streamed = render_take(codec, codes, first_window=1)
    assert streamed.dtype == np.int16 and streamed.shape == whole.shape == (TAKE_FRAMES * 2048,)
    assert np.abs(whole.astype(np.int32)).mean() > 1000  # real audio, not silence
    assert np.abs(streamed.astype(np.int32) - whole).max() <= 1
    assert snr_db(whole, streamed) >= 80  # the seed's 320 frames of context: ~48 dB on this codec


def test_the_state_carries_what_the_context_did(codec, take) -> None:
    """The tiny codec's transformers reach far back, like the release's: a window decoded after
    a fresh state (as if its take began there) is far from the whole take, and 32 frames of
    context (SGLang Omni's default) are too."""
    codes, whole = take
    window = take_windows(TAKE_FRAMES)[6]  # frames 256..320
    alone = StreamState()
    alone.frames = window.emit  # a state that has seen none of the take's frames
    pcm = window_pcm(codec, codes, window, alone).numpy()
    assert snr_db(whole[window.emit * 2048:window.end * 2048], pcm) < 25
    cut = codec.decode_tail(codes[None, :, window.emit - 32:window.end], 32 - codec.conv_context,
                            window.frames + codec.conv_context)
    assert snr_db(whole[window.emit * 2048:window.end * 2048],
                  pcm16(cut[0, codec.conv_context * 2048:]).numpy()) < 25


def test_a_window_decodes_once_and_in_order(codec, take) -> None:
    codes, _ = take
    first, second, third = take_windows(TAKE_FRAMES, 1)[:3]
    state = StreamState()
    with pytest.raises(ValueError, match="from frame 1 cannot follow its decoded 0 frames"):
        window_pcm(codec, codes, second, state)
    window_pcm(codec, codes, first, state)
    window_pcm(codec, codes, second, state)
    with pytest.raises(ValueError, match="windows decode once each, in order"):
        window_pcm(codec, codes, second, state)
    assert state.frames == third.emit


def test_a_window_cut_early_leaves_the_schedule_s_ends() -> None:
    schedule = StreamSchedule(first_window=1)
    assert schedule.due(1) == Window(0, 1) and schedule.due(2) == Window(1, 2)
    assert schedule.cut(2) is None  # nothing new
    assert schedule.cut(3) == Window(2, 3) and schedule.next_end == 4  # the next end stays
    assert schedule.cut(4) is None and schedule.due(4) == Window(3, 4)  # an end is `due`'s
    assert schedule.cut(7) == Window(4, 7) and schedule.due(10) == Window(7, 10)
    assert schedule.cuts == [3, 7]
    assert take_windows(12, 1, cuts=[3, 7]) == [Window(0, 1), Window(1, 2), Window(2, 3), Window(3, 4),
                                                Window(4, 7), Window(7, 10), Window(10, 12, last=True)]
    assert take_windows(5, 1, cuts=[3, 7]) == [Window(0, 1), Window(1, 2), Window(2, 3), Window(3, 4),
                                               Window(4, 5, last=True)]  # (a cut past the take's end: none)


@pytest.mark.parametrize(("first_window", "first_starts", "cuts"), [
    (3, [0, 3, 10], []), (1, [0, 1, 2, 4, 10], []),
    (1, [0, 1, 2, 3, 4, 6, 9, 10, 13], [3, 6, 9, 13, 33, 34, 90]),  # windows closed early (take.py)
])
def test_render_take_is_what_the_stream_carried(codec, first_window: int, first_starts: list[int],
                                                cuts: list[int]) -> None:
    """A stream driven frame by frame from a growing codes buffer, with a small first
    window (and windows cut early, as a take whose client runs short does), and the export
    of the final codes (with those cuts): the same PCM16, sample for sample."""
    frames = 150
    codes = random_codes(codec, frames, seed=12)
    schedule, buffer, streamed, starts = StreamSchedule(first_window=first_window), codes[:, :0], [], []
    state = StreamState()
    for produced in range(1, frames + 1):
        buffer = codes[:, :produced]  # what exists so far
        while (window := schedule.due(produced)) is not None:
            streamed.append(window_pcm(codec, buffer, window, state).numpy())
            starts.append(window.emit * 2048)
        if produced in cuts and (window := schedule.cut(produced)) is not None:
            streamed.append(window_pcm(codec, buffer, window, state).numpy())
            starts.append(window.emit * 2048)
    final = schedule.final(frames)
    streamed.append(decode_window(codec, buffer, final, state))
    starts.append(final.emit * 2048)
    assert starts[:len(first_starts)] == [frame * 2048 for frame in first_starts]
    assert [s + p.size for s, p in zip(starts, streamed)][:-1] == starts[1:]
    assert schedule.cuts == [cut for cut in cuts if cut not in (4, 10, 20, 32, 64, 128)]
    exported = render_take(codec, codes, first_window=first_window, cuts=schedule.cuts)
    assert np.array_equal(np.concatenate(streamed), exported)
    whole = pcm16(codec.decode(codes)).numpy()
    assert exported.shape == whole.shape


def test_empty_take_renders_no_samples(codec) -> None:
    assert render_take(codec, torch.zeros((10, 0), dtype=torch.long)).shape == (0,)


# ─── Window frame counts and their graphs ─────────────────────────────────────


@pytest.mark.parametrize("first_window", [4, None, 1, 2, 3, 12])
def test_window_frames_are_every_count_the_later_windows_take(first_window: int | None) -> None:
    windows = take_windows(2000, first_window)
    assert windows[0].frames == first_frames(first_window)
    counts = window_frames(first_window)
    assert {w.frames for w in windows[1:-1]} == set(counts) and len(counts) == len(set(counts))
    assert all(w.frames <= max(counts) for w in windows[1:])  # the last window is whatever is left
    assert window_frames(1) == [1, 2, 6, 10, 12, 32, 64] and first_frames(1) == 1
    assert window_frames(None) == [10, 12, 32, 64] and first_frames() == 10  # 10 twice (0-10, 10-20)


@pytest.mark.parametrize("first_window, longest_fastest", [(4, False), (1, False), (1, True)])
def test_a_window_padded_to_a_longer_graph_keeps_its_samples(codec, take, first_window: int,
                                                            longest_fastest: bool) -> None:
    """WindowGraphs' path (codes padded with zeros up to a captured count: the next one, or the
    largest where its graph replayed fastest, the state moved on by the real frames, PCM16 of
    the window's frames kept), run eagerly on a CPU: the codec is causal, so it gives the
    window's own samples (to a rounding step) for every window of a take, the last included,
    and leaves the take's state where the window does."""
    codes, _ = take
    graphs = WindowGraphs(codec, [first_frames(first_window)], window_frames(first_window))
    assert not graphs.graphs.enabled  # a CPU: the graphed windows' code runs eagerly
    if longest_fastest:  # as if the capture's timing found the 64-frame graph the fastest
        graphs.graphs.replay_ms = {n: 1.0 if n == max(graphs.frames) else 2.0 for n in graphs.frames}
        assert graphs.key_for(Window(emit=1, end=3, last=False)) == (codec.conv_context, max(graphs.frames))
    padded, through, alone = 0, StreamState(), StreamState()
    for window in take_windows(TAKE_FRAMES - 3, first_window):
        if window.frames == 0:
            continue
        key = graphs.key_for(window)
        assert key is not None  # every window of the stream has its graph
        padded += key[1] > window.frames
        got = graphs.pcm((codes, window, through))
        expected = window_pcm(codec, codes, window, alone).numpy()
        assert got.shape == expected.shape and np.abs(got.astype(int) - expected).max() <= 1
        assert through.frames == alone.frames == window.end
    assert padded >= 1
    assert through.codec is not None and alone.codec is not None
    assert torch.allclose(through.codec.keys, alone.codec.keys, atol=1e-5)
    assert torch.equal(through.codec.frames, alone.codec.frames)
