"""Ticks that cost what their conversations cost: batch buckets, per-slot seeded draws, system prompts
read in chunks between ticks, the float8 ring, and an engine that frees what it holds."""

from __future__ import annotations

import gc
import re
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex import engine as engine_module
from engine.personaplex.engine import Frame, PersonaPlex
from engine.personaplex.memory import slot_bytes
from engine.personaplex.ring import FP8
from engine.personaplex.sampling import Sampling

GREEDY = Sampling(greedy=True)


def user(ticks: int, slots: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.3, 0.3, (ticks, slots, 1920)).astype(np.float32)


def assert_same(ours: list[Frame | None], reference: list[Frame | None], atol: float = 1e-5) -> None:
    assert len(ours) == len(reference)
    for i, (a, b) in enumerate(zip(ours, reference)):
        assert a is not None and b is not None, i
        assert np.array_equal(a.tokens, b.tokens), i
        np.testing.assert_allclose(a.pcm, b.pcm, atol=atol)


@torch.no_grad()
def test_a_seeded_conversation_draws_the_same_in_any_slot_of_any_bucket(personaplex_checkpoint: Path):
    """Sampled, not greedy: the draws are keyed by the slot's seed and step, not by its row or batch."""
    big = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=4, sampling=Sampling(seed=1))
    alone = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=Sampling(seed=1))
    big.start(0, persona="Hello", seed=11)
    big.start(3, persona="Your name is Jane.", seed=7)  # in bucket 4, beside another conversation
    audio = user(8, 4, seed=0)
    frames = [big.step(a) for a in audio]
    assert big.timings["bucket"] == 4
    assert frames[0][3] is None and frames[1][3] is not None  # two prompts: one read before each tick
    alone.start(0, persona="Your name is Jane.", seed=7)
    assert_same([f[3] for f in frames[1:]], [alone.step(a[3])[0] for a in audio[1:]])
    alone.start(0, persona="Your name is Jane.", seed=8)
    again = [alone.step(a[3])[0] for a in audio[1:]]
    assert any(not np.array_equal(a.tokens, f[3].tokens) for a, f in zip(again, frames[1:]))  # another seed


@torch.no_grad()
def test_a_tick_runs_the_smallest_bucket_holding_the_slots_in_use(personaplex_checkpoint: Path):
    big = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=8, sampling=GREEDY)
    alone = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=GREEDY)
    assert big.ticks.buckets == [1, 2, 4, 8]
    big.start(0, persona="Hello")
    audio = user(12, 8, seed=1)
    buckets, talk = [], []
    for tick, a in enumerate(audio):
        if tick == 3:
            big.start(5, persona="Hi")
        if tick == 7:
            big.release(5)
        frames = big.step(a)
        buckets.append(big.timings["bucket"])
        talk.append(frames[0])
        assert (frames[5] is not None) == (3 <= tick < 7)
        assert all(f is None for b, f in enumerate(frames) if b not in (0, 5))
    assert buckets == [1, 1, 1, 8, 8, 8, 8, 1, 1, 1, 1, 1]
    alone.start(0, persona="Hello")
    assert_same(talk, [alone.step(a[0])[0] for a in audio])  # slot 0 never noticed
    assert int(big.lockstep.local[5]) == 0 and not big.lockstep.active[5]  # released: fresh and waiting


@torch.no_grad()
def test_a_prompt_read_in_chunks_equals_one_read_at_once(personaplex_checkpoint: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    whole = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=GREEDY)
    whole.start(0, persona="You enjoy having a good conversation.", voice="NATF2")
    audio = user(6, 2, seed=2)
    reference = [whole.step(a[1])[0] for a in audio]
    assert reference[0] is not None
    for chunk in (1, 7):
        monkeypatch.setattr(engine_module, "PROMPT_CHUNK", chunk)
        engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=GREEDY)
        engine.start(0, persona="Hello")
        engine.start(1, persona="Hello")  # replaced before it is read: the last start wins
        while engine.prefilling(0):  # the oldest prompt first, a chunk before each tick
            engine.step(user(1, 2, seed=3)[0])
        engine.start(1, persona="You enjoy having a good conversation.", voice="NATF2")
        positions = engine.prompts[1].plan.positions
        waited = []
        while engine.prefilling(1):
            waited.append(engine.step(audio[0]))
            assert waited[-1][0] is not None  # slot 0 keeps its tick meanwhile
        assert len(waited) == -(-positions // chunk)  # a chunk before each tick
        assert all(frames[1] is None for frames in waited[:-1])  # live in the tick its last chunk is read
        assert_same([waited[-1][1], *(engine.step(a)[1] for a in audio[1:])], reference)


@torch.no_grad()
def test_a_float8_ring_takes_a_byte_a_number_and_follows_the_full_precision_one(
        personaplex_checkpoint: Path):
    """The same inputs through Helium with each ring: the hidden states stay close over a call that
    wraps the ring (float8 keeps 3 mantissa bits of each key and value, scaled per head vector)."""
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=GREEDY)
    temporal, cfg = engine.lockstep.temporal, engine.cfg.lm
    x = torch.randn(2, cfg.context + 20, cfg.dim, generator=torch.Generator().manual_seed(5))
    runs, memory = [], []
    for kv in ("model", "float8"):
        engine_module.configure_rings(temporal, kv, False, engine.device)
        temporal.setup_streams(2)
        runs.append(torch.cat([temporal(x[:, t:t + 1], torch.full((2, 1), t))[0] for t in range(x.shape[1])], 1))
        memory.append(slot_bytes(engine.cfg, temporal))
        assert temporal.transformer.layers[0].self_attn.keys.dtype == (FP8 if kv == "float8" else torch.float32)
    vectors = cfg.num_layers * 2 * cfg.context * cfg.num_heads  # key and value vectors per slot
    head = cfg.dim // cfg.num_heads
    codec = memory[0] - vectors * head * 4
    assert memory[1] - codec == vectors * (head + 4)  # float32 -> a byte a number and a float32 scale a vector
    error = ((runs[1] - runs[0]).norm(dim=-1) / runs[0].norm(dim=-1)).max()
    assert 0 < error < 2**-4, error  # below float8 e4m3's rounding of a single number


def test_a_closed_engine_is_freed(personaplex_checkpoint: Path):
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=GREEDY)
    engine.open(persona="Hello")
    engine.step(user(1, 2, seed=6)[0])
    ring = engine.lockstep.temporal.transformer.layers[0].self_attn
    gone = weakref.ref(engine)
    engine.close()
    assert ring.keys.numel() == 0 and ring.values.numel() == 0
    del engine
    gc.collect()
    assert gone() is None


def test_the_bench_times_every_size_in_one_process(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    import json

    from backend.cli import main

    out, profile = tmp_path / "bench.json", tmp_path / "profile.txt"
    assert main(["bench", "personaplex", "--slots", "1", "3", "--ticks", "2", "--warmup", "1", "--greedy",
                 "--device", "cpu", "--json", str(out), "--profile", str(profile)]) == 0
    printed = capsys.readouterr().out
    assert "history full" in printed and "per conversation" in printed
    report = json.loads(out.read_text())
    assert [r["slots"] for r in report["rows"]] == [1, 3]
    for row in report["rows"]:
        assert row["gpu_ms_mean"] > 0 and row["encode_ms_mean"] > 0 and row["model_ms_mean"] > 0
        assert row["kv_gib_per_conversation"] > 0 and row["history"] == "full"
        assert row["join_ms"] > 0 and row["join_chunks"] >= 1  # a persona of its own: read, chunk by chunk
        assert row["half_heard_ms"] > 0  # ticks hearing every other conversation
    # The first and the last size's tick, part by part: Mimi's convolutions in encode and decode.
    text = profile.read_text()
    assert re.findall(r"^# (\w+), (\d+ conversations?):", text, re.M) == [
        (name, n) for n in ("1 conversation", "3 conversations") for name in ("encode", "model", "decode")]
    # The model's table opens with its own parts' time: Helium and the depformer.
    split = re.findall(r"^# parts \(ms of CPU time\): helium ([\d.]+), depformer ([\d.]+), other [\d.]+\n# model, ",
                       text, re.M)
    assert len(split) == 2 and all(float(helium) > 0 and float(depformer) > 0 for helium, depformer in split)
    parts = text.strip().split("\n\n# ")  # per size: encode, model, decode, then a joining prompt's chunk
    assert "conv1d" in parts[0] and "conv" in parts[2] and "conv1d" in parts[4]
    assert re.findall(r"^# one system prompt chunk, (\d+ conversations?)", text, re.M) == [
        "1 conversation", "3 conversations"]
    assert "aten::linear" in parts[3] and "conv1d" not in parts[3]  # Helium reads the prompt; Mimi has no part


def test_a_bench_stopped_at_a_later_size_keeps_the_sizes_it_timed(tmp_path: Path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "bench.json"
    bench = subprocess.Popen([sys.executable, "-m", "backend.cli", "bench", "personaplex", "--slots", "1", "2",
                              "--ticks", "8", "--warmup", "0", "--greedy", "--device", "cpu", "--json", str(out)],
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not out.exists() and bench.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    bench.send_signal(signal.SIGINT)  # the 2-slot engine is being built or timed: 8 ticks take seconds
    code = bench.wait(timeout=120)
    report = json.loads(out.read_text())
    if report.get("partial"):  # stopped while the 2-slot size was built or timed
        assert code != 0 and [r["slots"] for r in report["rows"]] == [1]
    else:  # on an idle machine the 2-slot size may end before the signal: the whole report then
        assert [r["slots"] for r in report["rows"]] == [1, 2]
    assert report["rows"][0]["gpu_ms_mean"] > 0


def test_the_bench_skips_a_slot_count_whose_state_does_not_fit_and_times_the_others(
        capsys: pytest.CaptureFixture[str], tmp_path: Path):
    """As 128 conversations on an H100: a size whose state is over the memory (`--memory-gib` here, the
    GPU's free memory on CUDA) gets a row saying why, the others are timed, and the bench exits 0."""
    import json

    from backend.cli import main
    from engine.personaplex.random_weights import random_parts

    parts = random_parts("tiny", torch.device("cpu"))
    gib = 2.5 * 1.1 * slot_bytes(parts.cfg, parts.temporal) / 2**30  # 2 slots' state and its 10% fit, not 3
    out, profile = tmp_path / "bench.json", tmp_path / "profile.txt"
    assert main(["bench", "personaplex", "--slots", "1", "4", "2", "--ticks", "2", "--warmup", "1", "--greedy",
                 "--device", "cpu", "--no-compare", "--memory-gib", str(gib), "--json", str(out),
                 "--profile", str(profile)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["slots"] for r in rows] == [1, 4, 2]
    assert rows[0]["gpu_ms_mean"] > 0 and rows[2]["gpu_ms_mean"] > 0
    assert rows[1] == {"slots": 4, "skipped": rows[1]["skipped"]}
    assert rows[1]["skipped"].startswith("4 PersonaPlex slots need ") and "use at most 2 slots" in rows[1]["skipped"]
    assert f"    4 skipped: {rows[1]['skipped']}" in printed
    # the first and the last size timed are profiled
    assert re.findall(r"^# one system prompt chunk, (\d+ conversations?)", profile.read_text(), re.M) == [
        "1 conversation", "2 conversations"]
    # Nothing fits: refused as the server refuses slots, before any engine is built.
    assert main(["bench", "personaplex", "--slots", "4", "--device", "cpu", "--memory-gib", str(gib)]) == 2
    assert "no slot count fits: 4 PersonaPlex slots need" in capsys.readouterr().err


def test_the_bench_refuses_a_slot_count_below_one_before_any_work(capsys: pytest.CaptureFixture[str]):
    from backend.cli import main

    assert main(["bench", "personaplex", "--slots", "1", "0", "--device", "cpu"]) == 2
    assert "slots must be an integer >= 1; got 0" in capsys.readouterr().err


@torch.no_grad()
def test_open_reads_the_prompt_a_few_rows_at_a_time_as_all_at_once(personaplex_checkpoint: Path,
                                                                  monkeypatch: pytest.MonkeyPatch):
    """`open` in groups of OPEN_ROWS rows (2 here, over 3 slots: a last group of one) gives every slot
    the state that reading all of them at once gives: the same ticks after it."""
    runs = []
    for rows in (16, 2):
        monkeypatch.setattr(engine_module, "OPEN_ROWS", rows)
        engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=3, sampling=GREEDY)
        engine.open(persona="Your name is Jane.")
        assert engine.live == {0, 1, 2}
        runs.append([engine.step(pcm) for pcm in user(6, 3, seed=4)])
    for once, grouped in zip(*runs):
        assert_same(grouped, once)
