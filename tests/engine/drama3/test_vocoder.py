"""The vocoder on a CPU in float32: the codec's batch decode against each clip alone, windows
of several takes decoded in one drain (WindowGraphs' code, run eagerly) against each take's
windows alone, the vocoder's queue (every due window drained, the most urgent first as each
call launches, a take's windows in order through its codec state, a failing window failing its
own take only), and takes in flight together against the same takes alone."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import torch

from engine import AudioWindow, Done, EngineSpec, Sampling, load_engine
from engine.drama3.codec_graphs import IN_FLIGHT, Launched, WindowGraphs, decode_window, decode_windows, render_take
from engine.drama3.codec_stream import StreamState
from engine.drama3.pace import Pace
from engine.drama3.slots import Slots
from engine.drama3.stream import Window, first_frames, take_windows, window_frames
from engine.drama3.vocoder import DRAIN_WINDOWS, Vocoder

FIRST_WINDOW = 4


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=3, first_window_frames=FIRST_WINDOW))


@pytest.fixture(scope="module")
def codec(engine):
    return engine.codec


@pytest.fixture(scope="module")
def graphs(codec) -> WindowGraphs:
    """The window graphs' code path, run eagerly (a CPU has no graphs)."""
    graphs = WindowGraphs(codec, [first_frames(FIRST_WINDOW)], window_frames(FIRST_WINDOW))
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
    """Each window decoded in a call of its own, every take's through a fresh state of its own."""
    fresh: dict[int, StreamState] = {}
    return [decode_window(codec, codes, window, fresh.setdefault(id(state), StreamState()), graphs)
            for codes, window, state in jobs]


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


def test_windows_of_several_takes_in_one_drain_equal_each_take_alone(codec, graphs) -> None:
    """Windows of several takes decoded in one drain, their takes' windows in turns, have the
    samples of each take's windows decoded alone and of each take's export (render_take); a
    window that does not start where its take's state ends is refused."""
    takes = [random_codes(codec, 60 - 5 * k, seed=20 + k) for k in range(5)]
    jobs = [take_jobs(codes) for codes in takes]
    windows = [job for turn in zip(*jobs) for job in turn]
    together = decode_windows(codec, windows, graphs)
    for (_, window, _), pcm, expected in zip(windows, together, alone(codec, graphs, windows), strict=True):
        assert np.array_equal(pcm, expected), window
    for codes in takes:
        mine = np.concatenate([pcm for (c, _, _), pcm in zip(windows, together) if c is codes])
        assert np.array_equal(mine, render_take(codec, codes[:, :len(mine) // codec.frame_samples], FIRST_WINDOW,
                                                graphs))
    later = take_windows(80, FIRST_WINDOW)[4]  # 32..64: its state has decoded nothing
    with pytest.raises(ValueError, match="from frame 32 cannot follow its decoded 0 frames"):
        graphs.pcm((takes[0], later, StreamState()))


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


@pytest.mark.parametrize("order", ["arrival", "deadline"])
def test_the_queue_drains_every_due_window(codec, graphs, order: str) -> None:
    """Windows of three takes submitted while the worker is busy are decoded, each as alone,
    DRAIN_WINDOWS a drain; a window that cannot decode fails its own future only."""
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor, order=order)
    takes = [random_codes(codec, 40, seed=30 + k) for k in range(3)]
    states = [StreamState() for _ in takes]
    jobs = [(codes.numpy()[:, :window.end].copy(), window, state, None)
            for window in take_windows(40, FIRST_WINDOW) for codes, state in zip(takes, states)]
    assert DRAIN_WINDOWS < len(jobs) <= 2 * DRAIN_WINDOWS
    futures = submitted_while_busy(vocoder, executor, jobs)
    assert (vocoder.drains, vocoder.windows) == (2, len(jobs))
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
    assert len(jobs) > DRAIN_WINDOWS and vocoder.drains == -(-len(jobs) // DRAIN_WINDOWS)
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
    assert (pace.dry, pace.late, len(pace.window_s)) == (1, 1, 4) and len(pace.drain_s) == vocoder.drains
    assert all(seconds > 0 for seconds in pace.drain_s)
    assert pace.report() is None  # no step ran: no line, and the counts start again
    pace.step(0.01, decoding=1, prefilled=0, held=False)
    pace.window(0.01, late=True)
    pace.drain(0.01)
    assert ("1 windows (0 closed early) in 1 drains, closed to audio p50 10.0 ms, p95 10.0 ms, "
            "1 made late") in (pace.report() or "")


def test_a_drain_hands_each_window_out_as_it_is_decoded(codec, graphs, monkeypatch) -> None:
    """A take's first window (decoded first: the shortest length) is handed out when its call's
    samples are on the host, not after every window of the drain: at 64 takes a drain held tens
    of windows (here, on a CPU, each call lands at once)."""
    calls: list[int] = []
    launch = graphs.launch
    monkeypatch.setattr(graphs, "launch", lambda job: calls.append(1) or launch(job))
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
    assert vocoder.drains == 1 and len(calls) > 2  # one drain, several codec calls
    assert min(handed) == 1 < len(calls) == max(handed)  # the first windows out after the first call


def test_a_drain_keeps_in_flight_calls_and_picks_each_window_as_its_call_can_launch(codec, graphs,
                                                                                     monkeypatch) -> None:
    """A drain's calls are read in launch order, at most IN_FLIGHT launched and not yet read: with
    no call's samples on the host until it is read (a busy GPU), each window is taken from its
    source only once a call has room, and every window comes out, in launch order, with the
    samples of the window decoded alone."""
    takes = [random_codes(codec, 200, seed=60 + k) for k in range(3)]
    windows = [job for codes in takes for job in take_jobs(codes) if job[1].frames]
    launched: list[int] = []
    handed: list[int] = []
    launch = graphs.launch
    monkeypatch.setattr(graphs, "launch", lambda job: launched.append(next(
        i for i, (c, w, _) in enumerate(windows) if c is job[0] and w == job[1])) or launch(job))
    monkeypatch.setattr(Launched, "done", lambda self: False)  # nothing lands until it is read
    in_flight: list[int] = []  # calls launched and not read when each window was taken

    def source():
        for job in windows:
            in_flight.append(len(launched) - len(handed))
            yield job

    out = decode_windows(codec, source(), graphs, ready=lambda index, pcm: handed.append(index))
    assert handed == launched == list(range(len(windows)))
    assert in_flight[0] == 0 and max(in_flight) == IN_FLIGHT - 1 and len(windows) > IN_FLIGHT
    monkeypatch.undo()
    assert all(np.array_equal(pcm, pcm_alone) for pcm, pcm_alone in zip(out, alone(codec, graphs, windows)))


def test_a_first_window_queued_during_a_drain_goes_next(codec, graphs, monkeypatch) -> None:
    """A take's first window submitted while a drain decodes another take's later windows is
    decoded with the next call that launches, not after the drain's other windows (before stop
    53 a drain took its windows at once: a first window queued just after waited for all of
    them)."""
    executor = ThreadPoolExecutor(max_workers=1)
    vocoder = Vocoder(codec, graphs, executor)
    playing, new = random_codes(codec, 200, seed=80), random_codes(codec, 20, seed=81)
    first = (new.numpy()[:, :FIRST_WINDOW].copy(), take_windows(20, FIRST_WINDOW)[0], StreamState())
    launched: list[int] = []
    launch = graphs.launch

    def counted(job):
        launched.append(job[1].frames if job[2] is not first[2] else -1)  # -1: the new take's first window
        if len(launched) == 2:  # the playing take's second window launches: a director asks for a take
            vocoder.submit(*first)
        return launch(job)

    monkeypatch.setattr(graphs, "launch", counted)
    jobs = [(playing.numpy()[:, :window.end].copy(), window, StreamState(), None)
            for window in take_windows(200, FIRST_WINDOW)]
    state = jobs[0][2]
    jobs = [(frames, window, state, deadline) for frames, window, _, deadline in jobs][:DRAIN_WINDOWS]
    submitted_while_busy(vocoder, executor, jobs)
    executor.shutdown()
    assert launched.index(-1) == 2 and len(launched) == len(jobs) + 1  # next, ahead of the drain's 5 others


def test_a_drain_whose_call_fails_midway_keeps_what_was_handed_out_and_frees_the_graphs(codec, graphs,
                                                                                        monkeypatch) -> None:
    """A call that fails to launch ends the drain with its error (the vocoder then retries window
    by window, test above); the windows launched before it are handed out (their take's state
    has moved on past them), the one that failed left its state where it was, and the graphs'
    lock is free."""
    windows = [job for job in take_jobs(random_codes(codec, 200, seed=70)) if job[1].frames]
    launch, calls = graphs.launch, []

    def failing(job):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a third call that cannot launch")
        return launch(job)

    monkeypatch.setattr(graphs, "launch", failing)
    handed: list[int] = []
    with pytest.raises(RuntimeError, match="third call"):
        decode_windows(codec, windows, graphs, ready=lambda index, pcm: handed.append(index))
    assert handed == [0, 1]  # the first two calls' windows (one each: a take's windows, in order)
    assert windows[0][2].frames == windows[2][1].emit  # the third window may be tried again
    assert graphs.lock.acquire(blocking=False)
    graphs.lock.release()


def test_takes_in_flight_together_get_their_pcm_alone(engine, codec, graphs) -> None:
    """Three takes decoding together, their windows vocoded on one worker thread: each take's
    windows come in order and its PCM is the take alone's and the export's, sample for sample."""
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
        assert np.array_equal(pcm, alone[k])
        assert np.array_equal(pcm, render_take(codec, torch.from_numpy(done.codes), FIRST_WINDOW, graphs, done.cuts))


def test_windows_vocoded_while_a_step_runs_go_out_then_once_and_in_order(engine, codec, graphs) -> None:
    """A window the vocoder finishes while the step's status is awaited goes to `hand` then
    (slots.py `hand_ready`), not again at the step's end; with every step handing out so, each
    take's stream is still in order, whole, and the take alone's, and the pace counts them."""
    vocoder = ThreadPoolExecutor(max_workers=1)
    slots = Slots(engine.decoder, codec, first_window=FIRST_WINDOW, executor=vocoder, graphs=graphs)
    prompt = engine.prompt("Heard while it decodes.", None, [], Sampling(max_new_tokens=24, seed=3))
    alone = np.concatenate([e.pcm for e in list(slots.generate(slots.start(prompt)))[:-1]])
    gate = threading.Event()
    vocoder.submit(gate.wait)  # the worker is held: windows queue, none is decoded
    take, events, handed = slots.start(prompt), [], []
    while not take.windows.pending:
        events += [e for _, out in slots.step() for e in out]
    assert events == []  # the first window waits in the vocoder's queue
    gate.set()
    take.windows.pending[0][2].result()  # decoded: on the host, not handed out
    slots.hand_ready(handed.extend)
    assert [(t, [len(e.pcm) for e in out]) for t, out in handed] == [(take, [FIRST_WINDOW * codec.frame_samples])]
    slots.hand_ready(handed.extend)  # nothing decoded since: nothing more
    assert len(handed) == 1
    stream = [e for _, out in handed for e in out]
    while slots.in_flight:
        returned = slots.step(hand=handed.extend)
        stream += [e for _, out in handed[1:] for e in out]  # (handed during the step: before its events)
        stream += [e for _, out in returned for e in out]
        del handed[1:]
    vocoder.shutdown()
    windows, done = stream[:-1], stream[-1]
    assert isinstance(done, Done) and done.finish_reason == "length"
    assert [w.start_sample for w in windows] == list(np.cumsum([0] + [len(w.pcm) for w in windows[:-1]]))
    assert np.array_equal(np.concatenate([w.pcm for w in windows]), alone)
    report = slots.pace.report()
    assert report is not None and re.search(r"handed out p50 [\d.]+ ms, p95 [\d.]+ ms after their audio, "
                                            r"[1-9]\d* while a step ran", report)


def test_a_closed_takes_last_windows_go_out_while_a_step_runs_and_its_done_after(engine, codec, graphs) -> None:
    """A take that ended (its slot free) while its last windows were still vocoding: they go to
    `hand` while another take's step runs, and its Done comes after the step, last."""
    vocoder = ThreadPoolExecutor(max_workers=1)
    slots = Slots(engine.decoder, codec, first_window=FIRST_WINDOW, executor=vocoder, graphs=graphs)
    gate = threading.Event()
    vocoder.submit(gate.wait)  # the worker is held: every window waits on the host's side
    short = slots.start(engine.prompt("Short.", None, [], Sampling(max_new_tokens=6, seed=1)))
    long = slots.start(engine.prompt("Long enough to keep stepping.", None, [], Sampling(max_new_tokens=40, seed=2)))
    while short.decoding:
        assert all(t is not short for t, _ in slots.step())  # (nothing of it is out: the worker is held)
    assert short in slots.closing and long.decoding and short.windows.pending
    gate.set()
    for _, _, future, _ in list(short.windows.pending):
        future.result()
    handed: list = []
    slots.hand_ready(handed.extend)
    last = [e for t, out in handed if t is short for e in out]
    assert last and all(isinstance(e, AudioWindow) for e in last) and last[-1].last
    after = [e for t, out in slots.step() if t is short for e in out]
    assert len(after) == 1 and isinstance(after[0], Done) and after[0].finish_reason == "length"
    assert not short.windows.pending and short not in slots.closing
    while slots.in_flight:
        slots.step()
    vocoder.shutdown()
