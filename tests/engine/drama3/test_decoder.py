"""Takes on the tiny checkpoint: reproducibility, stop rules (end of speech, the click
frame, length, deadline, cancel, non-finite logits), chunked prefill, and incremental
decoding against a teacher-forced prefill of the same frames."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import engine.drama3.prefill as prefill_module
from engine import AudioWindow, Done, EngineSpec, HistoryTurn, Sampling, load_engine
from engine.drama3.sampler import ras_window_of


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu"))


def run(engine, prompt, **kwargs) -> tuple[list[AudioWindow], Done]:
    events = list(engine.generate(prompt, **kwargs))
    assert all(isinstance(e, AudioWindow) for e in events[:-1]) and isinstance(events[-1], Done)
    windows, done = events[:-1], events[-1]
    # Windows are contiguous, end with exactly one last window, and carry every committed frame.
    assert [w.last for w in windows] == [False] * (len(windows) - 1) + [True]
    assert [w.start_sample for w in windows] == list(np.cumsum([0] + [len(w.pcm) for w in windows[:-1]]))
    assert sum(w.frames for w in windows) == done.timings["frames"] == done.codes.shape[1]
    assert sum(len(w.pcm) for w in windows) == done.codes.shape[1] * engine.frame_samples
    return windows, done


def pcm_of(windows: list[AudioWindow]) -> np.ndarray:
    return np.concatenate([w.pcm for w in windows])


def test_a_seed_reproduces_a_take(tiny):
    prompt = tiny.prompt("Once more, with feeling.", None, [], Sampling(max_new_tokens=12, seed=5))
    first, done = run(tiny, prompt)
    again, done_again = run(tiny, prompt)
    assert done.finish_reason == "length" and done.codes.shape == (10, 12)
    assert np.array_equal(done.codes, done_again.codes)
    assert np.array_equal(pcm_of(first), pcm_of(again))
    assert np.array_equal(pcm_of(first), tiny.vocode_take(done.codes))  # the stream is the take's render
    other = run(tiny, tiny.prompt("Once more, with feeling.", None, [], Sampling(max_new_tokens=12, seed=6)))[1]
    assert not np.array_equal(done.codes, other.codes)
    assert set(done.timings) >= {"prompt_rows", "prompt_ms", "restore_ms", "prefill_ms", "first_audio_ms", "frames",
                                 "decode_frames_per_s", "total_ms"}
    assert done.timings["prompt_rows"] == len(prompt.rows)
    assert 0 <= done.timings["restore_ms"] <= done.timings["prefill_ms"] + 0.05  # within start to prefilled (rounded)


def test_cancel_ends_the_take_within_one_step(tiny):
    polls = []

    def cancelled() -> bool:
        polls.append(time.monotonic())
        return len(polls) == 6  # polled before the prefill and before each step: four steps run

    prompt = tiny.prompt("Cut!", None, [], Sampling(max_new_tokens=100, seed=0))
    _, done = run(tiny, prompt, cancelled=cancelled)
    assert done.finish_reason == "cancelled" and done.error is None
    assert len(polls) == 6 and done.codes.shape[1] == 4


def test_deadline_ends_the_take_within_one_step(tiny):
    polls = []

    def watch() -> bool:
        polls.append(time.monotonic())
        return False

    prompt = tiny.prompt("Quickly now.", None, [], Sampling(max_new_tokens=1200, seed=0))
    deadline = time.monotonic() + 0.5
    _, done = run(tiny, prompt, deadline=deadline, cancelled=watch)
    assert done.finish_reason == "deadline"
    # Every step began before the deadline; the poll that saw it passed was the last one
    # (polls: one before the prefill, one before each step).
    assert all(t <= deadline for t in polls[:-1]) and done.codes.shape[1] == len(polls) - 2
    late = run(tiny, prompt, deadline=time.monotonic() - 1)[1]
    assert late.finish_reason == "deadline" and late.codes.shape[1] == 0


class ScriptedLogits:
    """Greedy-decodable candidate logits: step i strongly prefers token script[i] (or is NaN)."""

    def __init__(self, engine, script: list[int | None]) -> None:
        self.ids = engine.model.candidate_ids.tolist()
        self.script, self.calls = script, 0

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(hidden.shape[0], len(self.ids))
        token = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if token is None:
            return logits.fill_(math.nan)
        logits[:, self.ids.index(token)] = 100.0  # both RAS draws pick it too
        return logits


@pytest.mark.parametrize("script, kept, reason", [
    ("A B 0 E", "A B", "stop"),  # <|semantic:0|> right before end of speech: dropped (a click)
    ("A 0 C E", "A 0 C", "stop"),  # held one step, then released
    ("0 0 E", "0", "stop"),
    ("E", "", "stop"),
    ("A 0", "A 0", "length"),  # a held frame at the frame limit is kept
    ("A B N", "A B", "error"),  # non-finite logits stop the take
])
def test_stop_rules(tiny, monkeypatch, script, kept, reason):
    start, eos = tiny.config.semantic_start_token_id, tiny.config.eos_token_id
    token = {"A": start + 7, "B": start + 9, "C": start + 11, "0": start, "E": eos, "N": None}
    scripted = ScriptedLogits(tiny, [token[t] for t in script.split()])
    monkeypatch.setattr(tiny.model, "candidate_logits", scripted)
    prompt = tiny.prompt("Scripted.", None, [], Sampling(temperature=0, max_new_tokens=2 if reason == "length" else 20))
    windows, done = run(tiny, prompt)
    assert done.finish_reason == reason
    assert done.codes[0].tolist() == [token[t] - start for t in kept.split()]
    assert (done.error is not None) == (reason == "error")
    assert np.array_equal(pcm_of(windows), tiny.vocode_take(done.codes))


def test_chunked_prefill_equals_one_chunk(tiny, monkeypatch):
    codes = torch.randint(0, 1024, (10, 1000), generator=torch.Generator().manual_seed(0)).numpy()
    prompt = tiny.prompt("After a long take.", None, [HistoryTurn("Long.", codes)], Sampling(max_new_tokens=3, seed=1))
    assert len(prompt.rows) > 2 * prefill_module.EAGER_CHUNK_ROWS
    chunked = run(tiny, prompt)[1]
    hidden = tiny.decoder.hidden.clone()
    monkeypatch.setattr(prefill_module, "EAGER_CHUNK_ROWS", 10_000)
    whole = run(tiny, prompt)[1]
    torch.testing.assert_close(tiny.decoder.hidden, hidden, rtol=1e-4, atol=1e-4)
    assert np.array_equal(chunked.codes, whole.codes)


@torch.inference_mode()
def test_decoding_equals_a_teacher_forced_prefill_of_the_same_frames(tiny):
    """Step k frames from a prompt, then prefill prompt + those frames: the backbone state
    must agree, and with the same random state the next frame must be the same."""
    decoder = tiny.decoder
    prompt = tiny.prompt("Teacher forcing.", None, [], Sampling(max_new_tokens=20, seed=3))
    decoder.prefill(prompt, 0)
    frames = []
    for k in range(6):
        decoder.advance(decoder.kv_len(len(prompt.rows) - 1 + k))
        frames.append(decoder.frame[:1].clone())
    hidden, counter = decoder.hidden[0].clone(), decoder.counter[0].clone()
    decoder.advance(decoder.kv_len(len(prompt.rows) + 5))
    next_frame = decoder.frame[0].clone()

    rows = torch.cat((prompt.rows, *frames))
    forced = type(prompt)(rows=rows, history_used=0, sampling=prompt.sampling)
    decoder.prefill(forced, 0)
    torch.testing.assert_close(decoder.hidden[0], hidden, rtol=1e-4, atol=1e-4)
    assert torch.equal(decoder.ras_window[:1], ras_window_of(rows))
    decoder.counter[0] = counter  # the same draws: seed and frame counter
    decoder.advance(decoder.kv_len(len(rows) - 1))
    assert torch.equal(decoder.frame[0], next_frame)
    decoder.release(0)



def test_a_decoder_whose_attention_reads_its_own_rows_has_one_kv_bucket(tiny_checkpoint):
    """With `cache_attention` in every attention layer (the GPU's default) a step costs the same in
    any KV bucket, so the decoder keeps one (the whole cache) instead of 512, 1,024, ...; with it in
    only some layers, every bucket."""
    from engine.drama3.backbone import GatedAttention
    from engine.drama3.checkpoint import load_model
    from engine.drama3.decoder import Decoder, graph_kv_buckets
    from engine.drama3.fast import cache_decode
    from engine.drama3.tower import TowerAttention

    model, _, _ = load_model(tiny_checkpoint, device="cpu", dtype=torch.float32)
    assert Decoder(model, 3000).graphs[1].buckets == graph_kv_buckets(3000) == [512, 1024, 2048, 3000]
    layers = [m for m in model.modules() if isinstance(m, (GatedAttention, TowerAttention))]
    for layer in layers[:-1]:
        vars(layer)["attend_cache"] = cache_decode(layer)
    assert Decoder(model, 3000).graphs[1].buckets == [512, 1024, 2048, 3000]
    vars(layers[-1])["attend_cache"] = cache_decode(layers[-1])
    decoder = Decoder(model, 3000)
    assert decoder.graphs[1].buckets == decoder.feeds[1].buckets == [3000]
