"""The batched vocoder on a CPU in float32: the codec's batch decode against each clip alone,
windows of several takes decoded in one call (WindowGraphs' rows, run eagerly) against each
window alone, the vocoder's queue (every due window in one drain, order per take, a failing
window failing its own take only), and takes in flight together against the same takes alone."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import torch

from engine import Done, EngineSpec, Sampling, load_engine
from engine.drama3.codec_graphs import Launched, WindowGraphs, decode_window, decode_windows, render_take
from engine.drama3.slots import Slots
from engine.drama3.stream import STREAM_OVERLAP_FRAMES, Window, take_windows, window_lengths
from engine.drama3.vocoder import Vocoder

FIRST_WINDOW = 4
BATCHED_FROM = 10  # frames: low enough that the tiny takes' windows decode batched


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=3, first_window_frames=FIRST_WINDOW))


@pytest.fixture(scope="module")
def codec(engine):
    return engine.codec


@pytest.fixture(scope="module")
def graphs(codec) -> WindowGraphs:
    """The window graphs' code path with 4 rows, run eagerly (a CPU has no graphs)."""
    graphs = WindowGraphs(codec, window_lengths(STREAM_OVERLAP_FRAMES, FIRST_WINDOW), batch=4,
                          batched_from=BATCHED_FROM)
    assert not graphs.graphs.enabled
    return graphs


def random_codes(codec, frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, size, (frames,), generator=g) for size in codec.codebook_sizes])


def test_a_batch_decodes_each_clip_as_alone(codec) -> None:
    """Within float32 rounding: the convolutions' CPU kernels (oneDNN) change with the batch
    size, so a clip in a batch may differ from the clip alone by a few 1e-6 (nothing mixes the
    clips: the embeddings, transformer and upsampling match exactly)."""
    codes = torch.stack([random_codes(codec, 24, seed) for seed in range(5)])  # [5, num_codebooks, 24]
    batch = codec.decode_batch(codes)  # [5, 24 * frame_samples]
    assert batch.shape == (5, 24 * codec.frame_samples)
    for clip, audio in zip(codes, batch):
        assert torch.allclose(audio, codec.decode(clip), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"codes \[batch, 10, frames\]"):
        codec.decode_batch(codes[0])


def test_windows_of_several_takes_in_one_call_equal_each_alone(codec, graphs) -> None:
    """A window decodes the same samples in any row of a call, whatever the other rows hold:
    a row's kernels are the graph's, fixed by its length (so render_take reproduces a
    batched stream sample for sample)."""
    takes = [random_codes(codec, 60 - 5 * k, seed=20 + k) for k in range(5)]
    windows = [(codes, window) for codes in takes
               for window in take_windows(codes.shape[1], STREAM_OVERLAP_FRAMES, FIRST_WINDOW)]
    together = decode_windows(codec, windows, graphs)
    for (codes, window), pcm in zip(windows, together):
        assert np.array_equal(pcm, decode_window(codec, codes, window, graphs)), window
    lengths = [graphs.length_for(window) for _, window in windows]
    assert sum(length is not None and graphs.rows(length) == 4 for length in lengths) > 4  # some calls were full
    for codes in takes:
        mine = np.concatenate([pcm for (c, _), pcm in zip(windows, together) if c is codes])
        assert np.array_equal(mine, render_take(codec, codes, STREAM_OVERLAP_FRAMES, FIRST_WINDOW, graphs))
    with pytest.raises(ValueError, match="at most 4 windows"):
        graphs.pcm_batch(windows[-1:] * 5)


def test_the_queue_drains_every_due_window_in_one_go(codec, graphs) -> None:
    """Windows of three takes submitted while the worker is busy are decoded in one drain,
    each as alone; a window that cannot decode fails its own future only."""
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor)

    def submitted_while_busy(jobs: list[tuple[np.ndarray, Window]]) -> list[Future[np.ndarray]]:
        release = threading.Event()
        executor.submit(release.wait)  # the worker is busy: everything below queues
        futures = [vocoder.submit(frames, window) for frames, window in jobs]
        release.set()
        for future in futures:
            future.exception(timeout=600)
        return futures

    takes = [random_codes(codec, 40, seed=30 + k).numpy() for k in range(3)]
    jobs = [(codes[:, :window.end].copy(), window)
            for window in take_windows(40, STREAM_OVERLAP_FRAMES, FIRST_WINDOW) for codes in takes]
    futures = submitted_while_busy(jobs)
    assert (vocoder.calls, vocoder.windows) == (1, len(jobs))  # one drain took them all
    for (frames, window), future in zip(jobs, futures):
        assert np.array_equal(future.result(), decode_window(codec, torch.from_numpy(frames), window, graphs))
    broken = (np.zeros((3, 20), dtype=np.int64), take_windows(20, 8, None)[0])  # 3 codebooks, not 10
    good, bad = submitted_while_busy([jobs[-1], broken])
    assert np.array_equal(good.result(), futures[-1].result())
    with pytest.raises(RuntimeError):
        bad.result()
    executor.shutdown()


def test_a_drain_hands_each_window_out_as_it_is_decoded(codec, graphs, monkeypatch) -> None:
    """A take's first window (decoded first: the shortest length) is handed out when its call's
    samples are on the host, not after every window of the drain: at 64 takes a drain held tens
    of windows (the calls are launched back to back; here, on a CPU, each lands at once)."""
    calls: list[int] = []
    launch = graphs.launch
    monkeypatch.setattr(graphs, "launch", lambda windows: calls.append(len(windows)) or launch(windows))
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor)
    release = threading.Event()
    executor.submit(release.wait)  # the worker is busy: every window below is in one drain
    takes = [random_codes(codec, 40, seed=40 + k).numpy() for k in range(3)]
    jobs = [(codes[:, :window.end].copy(), window)
            for window in take_windows(40, STREAM_OVERLAP_FRAMES, FIRST_WINDOW) for codes in takes]
    handed: list[int] = []  # the codec calls done when each window's future was set
    futures = [vocoder.submit(frames, window) for frames, window in jobs]
    for future in futures:
        future.add_done_callback(lambda _: handed.append(len(calls)))
    release.set()
    for future in futures:
        future.result(timeout=600)
    executor.shutdown()
    assert vocoder.calls == 1 and len(calls) > 2  # one drain, several codec calls
    assert min(handed) == 1 < len(calls) == max(handed)  # the first windows out after the first call


def test_a_drain_launches_every_call_before_reading_and_hands_out_in_order(codec, graphs, monkeypatch) -> None:
    """A drain's calls are launched back to back and read in launch order: with no call's samples
    on the host until the last is launched (a busy GPU), every window still comes out, in the
    order of its call, with the samples of the window decoded alone."""
    takes = [random_codes(codec, 200, seed=60 + k) for k in range(3)]
    windows = [(codes, window) for codes in takes for window in take_windows(200, STREAM_OVERLAP_FRAMES, FIRST_WINDOW)
               if window.frames]
    alone = [decode_window(codec, codes, window, graphs) for codes, window in windows]
    launched: list[list[int]] = []
    launch = graphs.launch

    def counted(batch):  # the windows of each call, by index
        launched.append([next(i for i, (c, w) in enumerate(windows) if c is codes and w == window)
                         for codes, window in batch])
        return launch(batch)

    monkeypatch.setattr(graphs, "launch", counted)
    monkeypatch.setattr(Launched, "done", lambda self: False)  # nothing lands until the last launch
    order: list[int] = []
    out = decode_windows(codec, windows, graphs, ready=lambda index, pcm: order.append(index))
    assert len(launched) > 2 and order == [index for call in launched for index in call]
    assert all(np.array_equal(pcm, expected) for pcm, expected in zip(out, alone))


def test_a_drain_whose_call_fails_midway_keeps_what_was_handed_out_and_frees_the_graphs(codec, graphs,
                                                                                        monkeypatch) -> None:
    """A call that fails to launch ends the drain with its error (the vocoder then retries window
    by window, test above); the windows handed out before it stand, and the graphs' lock is free."""
    windows = [(random_codes(codec, 200, seed=70), window)
               for window in take_windows(200, STREAM_OVERLAP_FRAMES, FIRST_WINDOW) if window.frames]
    launch, calls = graphs.launch, []

    def failing(batch):
        calls.append(len(batch))
        if len(calls) == 3:
            raise RuntimeError("a third call that cannot launch")
        return launch(batch)

    monkeypatch.setattr(graphs, "launch", failing)
    handed: list[int] = []
    with pytest.raises(RuntimeError, match="third call"):
        decode_windows(codec, windows, graphs, ready=lambda index, pcm: handed.append(index))
    assert handed == [0, 1]  # the first two calls' windows (one each: the shortest lengths)
    assert graphs.lock.acquire(blocking=False)
    graphs.lock.release()


def test_takes_in_flight_together_get_their_pcm_alone(engine, codec, graphs) -> None:
    """Three takes decoding together, their windows vocoded on one worker thread in batches:
    each take's windows come in order and its PCM equals the take alone, and the export."""
    vocoder = ThreadPoolExecutor(max_workers=1)
    slots = Slots(engine.decoder, codec, overlap=STREAM_OVERLAP_FRAMES, first_window=FIRST_WINDOW,
                  executor=vocoder, graphs=graphs)
    prompts = [engine.prompt(text, None, [], Sampling(max_new_tokens=30 + 4 * k, seed=k))
               for k, text in enumerate(["Again, slower.", "Who is there?", "Nobody, nobody at all."])]
    alone = []
    for prompt in prompts:
        events = list(slots.generate(slots.start(prompt)))
        alone.append(np.concatenate([e.pcm for e in events[:-1]]))
    takes = {slots.start(prompt): k for k, prompt in enumerate(prompts)}
    streams: dict[int, list] = {k: [] for k in takes.values()}
    while slots.in_flight:
        for take, events in slots.step():
            streams[takes[take]] += events
    vocoder.shutdown()
    for k, events in streams.items():
        windows, done = events[:-1], events[-1]
        assert isinstance(done, Done) and done.finish_reason == "length"
        assert [w.start_sample for w in windows] == list(np.cumsum([0] + [len(w.pcm) for w in windows[:-1]]))
        pcm = np.concatenate([w.pcm for w in windows])
        assert np.array_equal(pcm, alone[k])
        exported = render_take(codec, torch.from_numpy(done.codes), STREAM_OVERLAP_FRAMES, FIRST_WINDOW, graphs)
        assert np.array_equal(pcm, exported)
