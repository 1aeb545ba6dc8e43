"""`retake converse`: PersonaPlex over a recorded user track, offline.

The user's recording is fed one 80 ms frame per tick, exactly as a live conversation would
be (system prompt first, then the lockstep); the agent's audio is written to a WAV of the
same length as the input (as the reference's offline tool does) and its text to an
optional transcript. The timings go to stdout as one JSON line (with every tick's
duration), everything else to stderr. A bad request exits 2 with a one-line message
(backend/cli.py turns a `RequestError` into that).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

NAME = "converse"
HELP = "run a PersonaPlex conversation over a recorded user track and write the agent's side"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", type=Path, required=True, metavar="USER.wav",
                        help="the user's side of the conversation (WAV/FLAC, any rate; mixed to mono, 24 kHz)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="AGENT.wav",
                        help="the WAV file to write (24 kHz mono, 16-bit, as long as the input)")
    parser.add_argument("--transcript-out", type=Path, metavar="FILE", help="also write the agent's text")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="a PersonaPlex checkpoint directory or cached Hugging Face repo id "
                             "(default: the tiny random-weight demo)")
    parser.add_argument("--voice", default=None, metavar="NAME",
                        help="a voice of the checkpoint (e.g. NATF2), or a .pt bundle or audio clip path")
    parser.add_argument("--persona", default=None, metavar="TEXT",
                        help="the system prompt text (default: the reference's wise and friendly teacher)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (1 is fastest for the tiny demo model)")
    sampling = parser.add_argument_group("sampling (defaults: the reference's)")
    sampling.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    sampling.add_argument("--text-temperature", type=float, default=0.7)
    sampling.add_argument("--text-top-k", type=int, default=25)
    sampling.add_argument("--audio-temperature", type=float, default=0.8)
    sampling.add_argument("--audio-top-k", type=int, default=250)
    sampling.add_argument("--seed", type=int, default=None, help="make the conversation reproducible")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile
    import torch

    from engine import pcm16
    from engine.errors import RequestError
    from engine.personaplex.engine import DEFAULT_PERSONA, PersonaPlex
    from engine.personaplex.sampling import Sampling
    from engine.personaplex.voices import frames_of, read_audio

    if args.threads is not None:
        if args.threads < 1:
            raise RequestError("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    if not args.input.is_file():
        raise RequestError(f"--input {args.input} does not exist")
    sampling = Sampling(text_temperature=args.text_temperature, text_top_k=args.text_top_k,
                        audio_temperature=args.audio_temperature, audio_top_k=args.audio_top_k,
                        greedy=args.greedy, seed=args.seed).checked()
    started = time.perf_counter()
    engine = PersonaPlex.load(args.checkpoint, device=args.device, slots=1, sampling=sampling)
    load_ms = (time.perf_counter() - started) * 1000
    if engine.demo_weights:
        print("retake converse: demo checkpoint with random weights: the agent's audio is noise",
              file=sys.stderr)
    user = read_audio(args.input, engine.sample_rate)
    if user.size == 0:
        raise RequestError(f"--input {args.input} holds no audio")
    persona = DEFAULT_PERSONA if args.persona is None else args.persona
    voice = engine.voice() if args.voice is None else engine.voice(args.voice)

    started = time.perf_counter()
    engine.open(persona=persona, voice=voice)
    prefill_ms = (time.perf_counter() - started) * 1000
    audio, pieces, ticks = [], [], []
    parts = {"encode_ms": 0.0, "model_ms": 0.0, "decode_ms": 0.0}
    for frame in frames_of(user, engine.frame_size):
        out = engine.step(frame)[0]
        assert out is not None  # a live slot speaks every tick
        audio.append(out.pcm)
        if out.text is not None:
            pieces.append(out.text)
        ticks.append(engine.timings["tick_ms"])
        for name in parts:
            parts[name] += engine.timings[name]

    agent = np.concatenate(audio)[:user.size]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(args.output, pcm16(agent), engine.sample_rate, subtype="PCM_16")
    text = "".join(pieces).strip()
    if args.transcript_out is not None:
        args.transcript_out.parent.mkdir(parents=True, exist_ok=True)
        args.transcript_out.write_text(text + "\n", encoding="utf-8")
    frame_ms = engine.frame_size / engine.sample_rate * 1000
    mean = sum(ticks) / len(ticks)
    print(json.dumps({
        "frames": len(ticks), "seconds": round(user.size / engine.sample_rate, 3), "device": str(engine.device),
        "demo_weights": engine.demo_weights, "voice": None if voice is None else voice.name,
        "load_ms": round(load_ms, 1), "prefill_ms": round(prefill_ms, 1),
        "tick_ms_mean": round(mean, 2), "tick_ms_p50": round(_percentile(ticks, 0.5), 2),
        "tick_ms_p95": round(_percentile(ticks, 0.95), 2), "tick_ms_max": round(max(ticks), 2),
        **{f"{name}_mean": round(total / len(ticks), 2) for name, total in parts.items()},
        "realtime_factor": round(mean / frame_ms, 3), "text_pieces": len(pieces),
        "tick_ms": [round(t, 2) for t in ticks],
    }))
    return 0
