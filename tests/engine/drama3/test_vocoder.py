"""The batched vocoder on a CPU in float32: the codec's batch decode against each clip alone,
windows of several takes decoded in one call (WindowGraphs' rows, run eagerly) against each
take's windows alone, the vocoder's queue (every due window drained, the most urgent first, a take's
windows in order through its codec state, a failing window failing its own take only), and takes in
flight together against the same takes alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import torch

from engine import Done, EngineSpec, Sampling, load_engine
from engine.drama3.codec_graphs import Launched, WindowGraphs, decode_window, decode_windows, render_take
from engine.drama3.codec_stream import StreamState
from engine.drama3.pace import Pace
from engine.drama3.slots import Slots
from engine.drama3.stream import Window, first_frames, take_windows, window_frames
from engine.drama3.vocoder import DRAIN_WINDOWS, JOIN_FRAMES, Vocoder

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
    graphs = WindowGraphs(codec, [first_frames(FIRST_WINDOW)], window_frames(FIRST_WINDOW), batch=4,
                          batched_from=BATCHED_FROM)
    assert not graphs.graphs.enabled
    return graphs


def random_codes(codec, frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, size, (frames,), generator=g) for size in codec.codebook_sizes])


def take_jobs(codes: torch.Tensor) -> list[tuple[torch.Tensor, Window, StreamState]]:
    """A take's windows with its codec state (a fresh one)."""
    state = StreamState()
    return [(codes, window, state) for window in take_windows(codes.shape[1], FIRST_WINDOW)]


def alone(codec, graphs, jobs) -> list[np.ndarray]:
    """Each window decoded in a call of its own, every take's through a fresh state of its own, in a
    call of as many rows as the call that decoded it had (its take's state says: `rows`)."""
    fresh: dict[int, StreamState] = {}
    return [decode_window(codec, codes, window, fresh.setdefault(id(state), StreamState()), graphs,
                          dict(state.rows).get(window.end, 1)) for codes, window, state in jobs]


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
    windows = [job for codes in takes for job in take_jobs(codes)]
    together = decode_windows(codec, windows, graphs)
    for (_, window, _), pcm, expected in zip(windows, together, alone(codec, graphs, windows)):
        assert np.array_equal(pcm, expected), window
    keys = [graphs.key_for(window) for _, window, _ in windows]
    assert sum(key is not None and graphs.rows(key) == 4 for key in keys) > 4  # some calls were full
    for codes in takes:
        mine = np.concatenate([pcm for (c, _, _), pcm in zip(windows, together) if c is codes])
        assert np.array_equal(mine, render_take(codec, codes, FIRST_WINDOW, graphs))
    batch = [(codes, window, StreamState()) for codes in takes for window in take_windows(60, FIRST_WINDOW)[:1]]
    with pytest.raises(ValueError, match="at most 1"):  # first windows decode alone
        graphs.pcm_batch(batch[:2])


def test_a_take_s_windows_in_one_drain_decode_in_order_one_call_each(codec, graphs, monkeypatch) -> None:
    """A drain holding several windows of one take (a vocoder behind) decodes them in the order
    given: each in a call of its own, after the one before it, so each follows its take's state;
    windows of other takes next to each other in the order share a call where their graph has
    rows. Two windows of one take in one call, or a window whose state is elsewhere, are refused."""
    takes = [random_codes(codec, 80, seed=50 + k) for k in range(2)]
    calls: list[list[int]] = []
    launch = graphs.launch
    monkeypatch.setattr(graphs, "launch",
                        lambda batch, *rows: calls.append([w.emit for _, w, _ in batch]) or launch(batch, *rows))
    emits = [w.emit for _, w, _ in take_jobs(takes[0]) if w.frames]
    by_take = [job for codes in takes for job in take_jobs(codes)]  # take 0's windows, then take 1's
    by_window = [job for pair in zip(*(take_jobs(codes) for codes in takes)) for job in pair]  # in turns
    for jobs, shared in ((by_take, False), (by_window, True)):
        calls.clear()
        out = decode_windows(codec, jobs, graphs)
        made = list(calls)  # (before `alone`'s calls)
        assert all(np.array_equal(pcm, pcm_alone) for pcm, pcm_alone in zip(out, alone(codec, graphs, jobs)))
        assert bool([call for call in made if len(call) == 2]) == shared and all(len(set(call)) == 1 for call in made)
        assert [call[0] for call in made] == (emits + emits if not shared else sorted(call[0] for call in made))
    state = StreamState()
    first, second = take_windows(80, FIRST_WINDOW)[4:6]  # 32..64 and 64..80: one graph's rows
    with pytest.raises(ValueError, match="one call each"):
        graphs.pcm_batch([(takes[0], first, state), (takes[0], second, state)])
    with pytest.raises(ValueError, match="from frame 32 cannot follow its decoded 0 frames"):
        graphs.pcm_batch([(takes[0], first, state)])


def test_a_call_has_the_fewest_rows_that_hold_its_windows(codec, graphs, monkeypatch) -> None:
    """Windows of one graph share a call of 1, 2 or 4 rows (the graphs' batch is 4), the least
    that hold them: a lone window pays for one row. Windows of one graph apart in the order share
    a call where each take's window before is in an earlier call; the takes' states list the
    rows of the windows decoded with others (the export decodes them in as many)."""
    calls: list[tuple[int, int]] = []  # (windows, rows) of each call
    launch = graphs.launch

    def counted(batch, *rows):
        pcm = launch(batch, *rows)
        asked = max([len(batch), *(r for r in rows if r)])
        calls.append((len(batch), graphs.rows_for(graphs.key_for(batch[0][1]), asked)))
        return pcm

    monkeypatch.setattr(graphs, "launch", counted)
    takes = [take_jobs(random_codes(codec, 80, seed=110 + k)) for k in range(3)]
    assert [w.frames for _, w, _ in takes[0][2:4]] == [10, 12]  # windows from BATCHED_FROM frames
    done = [job for jobs in takes for job in jobs[:2]]  # every take's first two windows (rows 1) first
    out = decode_windows(codec, done, graphs)
    calls.clear()
    order = [takes[0][2], takes[0][3], takes[1][2], takes[1][3], takes[2][2]]  # take 0's two, take 1's, one more
    out += decode_windows(codec, order, graphs)
    assert calls == [(3, 4), (2, 2)]  # 10 frames: three takes in 4 rows; 12 frames: two takes in 2 rows
    assert [takes[k][0][2].rows for k in range(3)] == [[(20, 4), (32, 2)], [(20, 4), (32, 2)], [(20, 4)]]
    calls.clear()
    out += decode_windows(codec, [takes[2][3]], graphs)  # alone: one row, nothing to list
    assert calls == [(1, 1)] and takes[2][0][2].rows == [(20, 4)]
    monkeypatch.undo()
    expected = alone(codec, graphs, [*done, *order, takes[2][3]])
    assert all(np.array_equal(pcm, pcm_alone) for pcm, pcm_alone in zip(out, expected, strict=True))
    with pytest.raises(ValueError, match="at most 4"):
        graphs.rows_for(graphs.key_for(takes[0][2][1]), 5)


def submitted_while_busy(vocoder: Vocoder, executor: ThreadPoolExecutor,
                         jobs: list[tuple[np.ndarray, Window, StreamState, float | None]]) -> list[Future[np.ndarray]]:
    """Submit every job while the vocoder's worker is busy (so all of them queue), then let it drain."""
    release = threading.Event()
    executor.submit(release.wait)
    futures = [vocoder.submit(frames, window, state, deadline) for frames, window, state, deadline in jobs]
    release.set()
    for future in futures:
        future.exception(timeout=600)
    return futures


@pytest.mark.parametrize(("order", "drains"), [("arrival", 1), ("deadline", 2)])
def test_the_queue_drains_every_due_window(codec, graphs, order: str, drains: int) -> None:
    """Windows of three takes submitted while the worker is busy are decoded, each as alone: in
    one drain by arrival, DRAIN_WINDOWS a drain by deadline; a window that cannot decode fails
    its own future only."""
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor, order=order)
    takes = [random_codes(codec, 40, seed=30 + k) for k in range(3)]
    states = [StreamState() for _ in takes]
    jobs = [(codes.numpy()[:, :window.end].copy(), window, state, None)
            for window in take_windows(40, FIRST_WINDOW) for codes, state in zip(takes, states)]
    assert DRAIN_WINDOWS < len(jobs) <= 2 * DRAIN_WINDOWS
    futures = submitted_while_busy(vocoder, executor, jobs)
    assert (vocoder.calls, vocoder.windows) == (drains, len(jobs))
    expected = alone(codec, graphs, [(torch.from_numpy(frames), window, state) for frames, window, state, _ in jobs])
    for future, pcm in zip(futures, expected):
        assert np.array_equal(future.result(), pcm)
    more = random_codes(codec, 30, seed=39)
    good = (more.numpy(), take_windows(30, FIRST_WINDOW)[0], StreamState(), None)
    broken = (np.zeros((3, 20), dtype=np.int64), take_windows(20, None)[0], StreamState(), None)  # 3 codebooks, not 10
    good_future, bad = submitted_while_busy(vocoder, executor, [good, broken])
    assert np.array_equal(good_future.result(), decode_window(codec, more, good[1], StreamState(), graphs))
    with pytest.raises(ValueError, match=r"codes \[batch, 10, frames\]; got \(1, 3, 10\)"):
        bad.result()
    executor.shutdown()
    with pytest.raises(ValueError, match="the vocoder's order is one of deadline, arrival; got 'fifo'"):
        Vocoder(codec, graphs, None, order="fifo")


def test_the_windows_whose_clients_run_dry_soonest_decode_first(codec, graphs) -> None:
    """By deadline: every take's first window first (first audio), then a take far ahead of its
    client (its windows due in seconds) waits while a take whose client is about to run out has
    its windows decoded, whatever came first; a take whose later window is due sooner than its
    earlier one still decodes them in order (each window follows its take's codec state), and
    every window has the samples it has alone."""
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor)
    now = time.perf_counter()
    ahead, short, odd = (random_codes(codec, frames, seed=70 + k) for k, frames in enumerate((120, 40, 40)))
    plans = [(ahead, [now + 10 + k for k in range(8)]),  # submitted first, due last
             (short, [now + 0.05 * k for k in range(8)]),
             (odd, [now + 20, now + 30, now + 1] + [now + 2 + k for k in range(5)])]  # its third due before its second
    jobs, owner = [], []
    for number, (codes, deadlines) in enumerate(plans):
        state = StreamState()
        for window, deadline in zip(take_windows(codes.shape[1], FIRST_WINDOW), deadlines):
            jobs.append((codes.numpy()[:, :window.end].copy(), window, state, deadline))
            owner.append(number)
    finished: list[int] = []  # the jobs in the order their samples came out
    release = threading.Event()
    executor.submit(release.wait)
    futures = [vocoder.submit(frames, window, state, deadline) for frames, window, state, deadline in jobs]
    for index, future in enumerate(futures):
        future.add_done_callback(lambda _, index=index: finished.append(index))
    release.set()
    for future in futures:
        future.result(timeout=600)
    executor.shutdown()
    assert len(jobs) > DRAIN_WINDOWS and vocoder.calls == -(-len(jobs) // DRAIN_WINDOWS)
    assert [owner[index] for index in finished[:3]] == [1, 0, 2]  # the first windows, soonest due first
    assert all(jobs[index][1].emit == 0 for index in finished[:3])
    takes_out = [owner[index] for index in finished[3:]]
    assert takes_out[:owner.count(1) - 1] == [1] * (owner.count(1) - 1)  # the short take's before any other
    # The odd take's third window (due in 1 s) waits for its second (due in 30 s): after the take 10-17 s ahead.
    assert max(place for place, number in enumerate(takes_out) if number == 0) < takes_out.index(2)
    for number in range(3):
        mine = [index for index in finished if owner[index] == number]
        assert mine == sorted(mine)  # each take's windows in its order
    expected = alone(codec, graphs, [(torch.from_numpy(frames), window, state) for frames, window, state, _ in jobs])
    for future, pcm in zip(futures, expected):
        assert np.array_equal(future.result(), pcm)


def test_the_pace_counts_windows_out_after_their_client_ran_dry_and_each_drain(codec, graphs) -> None:
    """A window after a take's first that closed before its client would run dry and came out
    after is the vocoder's gap (late); one that closed after its client ran dry is the decode's
    (dry); a first window is neither (its wait is first audio's); each drain is timed."""
    pace = Pace()
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor, pace)
    codes = random_codes(codec, 40, seed=90)
    windows = take_windows(40, FIRST_WINDOW)[:4]
    state, now = StreamState(), time.perf_counter()
    due = now + 1.0  # the third window's client runs dry in a second; the worker starts after that
    executor.submit(lambda: time.sleep(max(0.0, due - time.perf_counter()) + 0.05))
    # closed with its client dry (due before it closed), due in a second (out after it), due in an hour
    futures = [vocoder.submit(codes.numpy()[:, :window.end].copy(), window, state, deadline)
               for window, deadline in zip(windows, (now - 1, now - 1, due, now + 3600))]
    for future in futures:
        future.result(timeout=600)
    executor.shutdown()
    assert (pace.dry, pace.late, len(pace.window_s)) == (1, 1, 4) and len(pace.drain_s) == vocoder.calls
    assert all(seconds > 0 for seconds in pace.drain_s)
    assert pace.report() is None  # no step ran: no line, and the counts start again
    pace.step(0.01, decoding=1, prefilled=0, held=False)
    pace.window(0.01, late=True)
    pace.drain(0.01)
    assert ("1 windows (0 closed early, 0 joined to the next) in 1 drains, closed to audio p50 10.0 ms, p95 10.0 ms, "
            "1 made late") in (pace.report() or "")


def test_a_drain_hands_each_window_out_as_it_is_decoded(codec, graphs, monkeypatch) -> None:
    """A take's first window (decoded first: the shortest length) is handed out when its call's
    samples are on the host, not after every window of the drain: at 64 takes a drain held tens
    of windows (the calls are launched back to back; here, on a CPU, each lands at once)."""
    calls: list[int] = []
    launch = graphs.launch
    monkeypatch.setattr(graphs, "launch", lambda windows, *rows: calls.append(len(windows)) or launch(windows, *rows))
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor)
    release = threading.Event()
    executor.submit(release.wait)  # the worker is busy: every window below is in one drain
    takes = [random_codes(codec, 40, seed=40 + k).numpy() for k in range(3)]
    states = [StreamState() for _ in takes]
    jobs = [(codes[:, :window.end].copy(), window, state)
            for window in take_windows(40, FIRST_WINDOW) for codes, state in zip(takes, states)][:DRAIN_WINDOWS]
    handed: list[int] = []  # the codec calls done when each window's future was set
    futures = [vocoder.submit(frames, window, state) for frames, window, state in jobs]
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
    windows = [job for codes in takes for job in take_jobs(codes) if job[1].frames]
    launched: list[list[int]] = []
    launch = graphs.launch

    def counted(batch):  # the windows of each call, by index
        launched.append([next(i for i, (c, w, _) in enumerate(windows) if c is codes and w == window)
                         for codes, window, _ in batch])
        return launch(batch)

    monkeypatch.setattr(graphs, "launch", counted)
    monkeypatch.setattr(Launched, "done", lambda self: False)  # nothing lands until the last launch
    order: list[int] = []
    out = decode_windows(codec, windows, graphs, ready=lambda index, pcm: order.append(index))
    assert len(launched) > 2 and order == [index for call in launched for index in call]
    monkeypatch.undo()
    assert all(np.array_equal(pcm, pcm_alone) for pcm, pcm_alone in zip(out, alone(codec, graphs, windows)))


def test_a_drain_whose_call_fails_midway_keeps_what_was_handed_out_and_frees_the_graphs(codec, graphs,
                                                                                        monkeypatch) -> None:
    """A call that fails to launch ends the drain with its error (the vocoder then retries window
    by window, test above); the windows launched before it are handed out (their take's state
    has moved on past them), the one that failed left its state where it was, and the graphs'
    lock is free."""
    windows = [job for job in take_jobs(random_codes(codec, 200, seed=70)) if job[1].frames]
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
    assert handed == [0, 1]  # the first two calls' windows (one each: a take's windows, in order)
    assert windows[0][2].frames == windows[2][1].emit  # the third window may be tried again
    assert graphs.lock.acquire(blocking=False)
    graphs.lock.release()


def test_takes_in_flight_together_get_their_pcm_alone(engine, codec, graphs) -> None:
    """Three takes decoding together, their windows vocoded on one worker thread in batches:
    each take's windows come in order and its PCM is the take alone's to rounding (a call of
    several rows runs other kernels than one of one row: oneDNN's convolutions follow the batch),
    and the export's, sample for sample, with the rows its Done lists."""
    vocoder = ThreadPoolExecutor(max_workers=1)
    slots = Slots(engine.decoder, codec, first_window=FIRST_WINDOW, executor=vocoder, graphs=graphs)
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
        assert np.abs(pcm.astype(np.int32) - alone[k]).max() <= 2  # float32 rounding, in int16 steps
        exported = render_take(codec, torch.from_numpy(done.codes), FIRST_WINDOW, graphs, done.cuts, done.joined,
                               done.rows)
        assert np.array_equal(pcm, exported)
    assert any(done.rows for done in (events[-1] for events in streams.values()))  # some calls held several


def test_a_take_s_queued_windows_join_in_one_call_and_its_export_replays_them(codec, graphs, monkeypatch) -> None:
    """With `join`, a take's windows queued together (a vocoder behind) decode in one codec call,
    up to JOIN_FRAMES frames, never with the take's first window: each window still gets exactly
    its own samples, the take's state records where windows joined, and the export with those
    `joined` ends is the stream sample for sample (without them, the same to rounding)."""
    calls: list[int] = []
    launch = graphs.launch
    monkeypatch.setattr(graphs, "launch",
                        lambda batch, *rows: calls.append(sum(w.frames for _, w, _ in batch)) or launch(batch, *rows))
    codes = random_codes(codec, 150, seed=95)
    windows = take_windows(150, FIRST_WINDOW)  # 4, 4, 2, 10, 12, 32, 64, 22 frames
    state, pace = StreamState(), Pace()
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor, pace, join=True)
    futures = submitted_while_busy(vocoder, executor, [(codes.numpy()[:, :w.end].copy(), w, state, None)
                                                       for w in windows])
    executor.shutdown()
    assert vocoder.windows == len(windows) and calls[0] == FIRST_WINDOW  # the first window alone
    assert len(calls) < len(windows) and max(calls) <= JOIN_FRAMES
    assert state.joined and all(end in [w.end for w in windows] for end in state.joined)
    assert pace.joined == len(windows) - len(calls)
    pcm = [future.result() for future in futures]
    assert [len(p) for p in pcm] == [w.frames * codec.frame_samples for w in windows]
    stream = np.concatenate(pcm)
    assert np.array_equal(stream, render_take(codec, codes, FIRST_WINDOW, graphs, joined=state.joined))
    apart = render_take(codec, codes, FIRST_WINDOW, graphs).astype(np.int32)
    assert np.abs(stream.astype(np.int32) - apart).max() <= 2  # float32 rounding, in int16 steps


def test_takes_with_joined_windows_report_them_and_export_as_streamed(engine, codec, graphs) -> None:
    """Takes decoding while the vocoder's worker is held up: their windows queue and join; each
    take's Done lists where (`joined`), and the export of its codes with them is its stream
    sample for sample."""
    executor = ThreadPoolExecutor(max_workers=1)
    slots = Slots(engine.decoder, codec, first_window=FIRST_WINDOW, executor=executor, graphs=graphs,
                  vocoder_join=True)
    release = threading.Event()
    executor.submit(release.wait)
    prompts = [engine.prompt(text, None, [], Sampling(max_new_tokens=40, seed=k))
               for k, text in enumerate(["Again, slower.", "Who is there?"])]
    takes = {slots.start(prompt): k for k, prompt in enumerate(prompts)}
    streams: dict[int, list] = {k: [] for k in takes.values()}
    steps = 0
    while slots.in_flight:
        steps += 1
        if steps == 30:  # every take's windows of the first 30 steps queued meanwhile
            release.set()
        for take, events in slots.step():
            streams[takes[take]] += events
    executor.shutdown()
    for events in streams.values():
        windows, done = events[:-1], events[-1]
        assert isinstance(done, Done) and done.joined
        pcm = np.concatenate([w.pcm for w in windows])
        exported = render_take(codec, torch.from_numpy(done.codes), FIRST_WINDOW, graphs, done.cuts, done.joined,
                               done.rows)
        assert np.array_equal(pcm, exported)
