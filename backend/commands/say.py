"""`retake say`: one Drama 3 take from the command line, written to a WAV file.

The take goes through the same engine contract as the studio (`engine.prompt`, then
`engine.generate`); the WAV holds exactly the streamed windows, in order. The timings
go to stdout as one JSON line, everything else to stderr. A bad request exits 2 with a
one-line message (backend/cli.py turns a `RequestError` into that).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

NAME = "say"
HELP = "speak one line with Drama 3 and write the take to a WAV file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", metavar="TEXT", help="the line to speak")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="TAKE.wav",
                        help="the WAV file to write (44.1 kHz mono, 16-bit)")
    parser.add_argument("--codes-out", type=Path, metavar="TAKE.npy",
                        help="also write the take's frames as int64 [frames, 11] (main token, 10 codes)")
    parser.add_argument("--checkpoint", type=Path, metavar="DIR",
                        help="a Drama 3 checkpoint directory (default: the tiny random-weight demo)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: half the cores, see EngineSpec.threads)")
    voice = parser.add_argument_group("voice (references or a character, not both)")
    voice.add_argument("--reference", type=Path, action="append", default=[], metavar="CLIP",
                       help="a WAV/FLAC clip of the voice; repeatable, each with --reference-text")
    voice.add_argument("--reference-text", action="append", default=[], metavar="TEXT",
                       help="what is said in the matching --reference clip")
    voice.add_argument("--character", metavar="NAME", help="a described character's name")
    voice.add_argument("--description", metavar="TEXT", help="the character's description (with --character)")
    voice.add_argument("--scene", metavar="TEXT", help="the scene (optional, with --character)")
    parser.add_argument("--history", nargs=2, action="append", default=[], metavar=("TEXT", "CODES.npy"),
                        help="an earlier take, oldest first: its text and its --codes-out file; repeatable")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=None, help="0 is greedy (default 1.0)")
    sampling.add_argument("--top-p", type=float, default=None, help="default 0.9")
    sampling.add_argument("--top-k", type=int, default=None, help="default 30")
    sampling.add_argument("--max-new-tokens", type=int, default=None, help="frames at most (default and cap 1200)")
    sampling.add_argument("--seed", type=int, default=None, help="make the take reproducible")


def read_history_codes(path: Path) -> NDArray[np.int64]:
    """A take's codes [10, frames] from a `--codes-out` file [frames, 11]."""
    import numpy as np

    from engine.errors import RequestError

    try:
        frames = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else "it is not a .npy file as --codes-out writes"
        raise RequestError(f"cannot read history codes {path}: {reason}") from error
    if frames.ndim != 2 or frames.shape[1] != 11 or not np.issubdtype(frames.dtype, np.integer):
        raise RequestError(f"history codes {path} must be an integer [frames, 11] array as --codes-out writes; "
                         f"got {frames.dtype} {frames.shape}")
    return np.ascontiguousarray(frames[:, 1:].T, dtype=np.int64)


def run(args: argparse.Namespace) -> int:
    from engine.errors import RequestError

    if len(args.reference) != len(args.reference_text):
        raise RequestError("give one --reference-text for each --reference clip")
    if (args.description or args.scene) and not args.character:
        raise RequestError("--description and --scene describe a --character; add --character NAME")
    if args.character and args.description is None:
        raise RequestError("--character needs --description")
    if args.character and args.reference:
        raise RequestError("give either --reference clips or a --character, not both")

    import numpy as np
    import soundfile as sf

    from engine import AudioWindow, Character, Done, EngineSpec, HistoryTurn, Reference, Sampling, load_engine
    from engine.drama3.prompt import checked_character
    from engine.drama3.text import check_text

    # Everything the user can get wrong is checked before the model loads.
    sampling = Sampling.from_fields({"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                                     "max_new_tokens": args.max_new_tokens, "seed": args.seed})
    check_text(args.text, "text")
    for index, transcript in enumerate(args.reference_text):
        check_text(transcript, f"references.{index}.text")
    for index, (text, _) in enumerate(args.history):
        check_text(text, f"history.{index}.text")
    character = Character(args.character, args.description, args.scene) if args.character else None
    if character is not None:
        character = checked_character(character)
    history = [HistoryTurn(text, read_history_codes(Path(path))) for text, path in args.history]
    clips = []
    for clip in args.reference:
        try:
            clips.append(clip.read_bytes())
        except OSError as error:
            raise RequestError(f"cannot read reference clip {clip}: {error.strerror}") from error
    engine = load_engine(EngineSpec(checkpoint=args.checkpoint, device=args.device, threads=args.threads or None))
    if engine.demo_weights:
        print("retake say: the tiny demo checkpoint has random weights; its audio is noise", file=sys.stderr)
    voice: Character | list[Reference] = character if character is not None else [
        Reference(engine.encode_reference(audio), transcript) for audio, transcript in zip(clips, args.reference_text)]
    # The checkpoint may hold fewer frames than the engine's default: its limit is the cap (and the default).
    sampling = Sampling.from_fields({"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                                     "max_new_tokens": args.max_new_tokens, "seed": args.seed},
                                    max_new_tokens=int(engine.limits["max_new_tokens"]))
    prompt = engine.prompt(args.text, voice or None, history, sampling)

    pieces: list[np.ndarray] = []
    done: Done | None = None
    for event in engine.generate(prompt):
        if isinstance(event, AudioWindow):
            pieces.append(event.pcm)
        else:
            done = event
    assert done is not None  # generate always ends with Done
    pcm = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    sf.write(args.output, pcm, engine.sample_rate, subtype="PCM_16")
    if args.codes_out is not None:
        codes = done.codes  # [10, frames]
        frames = np.concatenate((codes[:1] + engine.semantic_start, codes)).T  # [frames, 11]
        np.save(args.codes_out, frames.astype(np.int64))
    print(json.dumps({"finish_reason": done.finish_reason, **done.timings,
                      "audio_s": round(len(pcm) / engine.sample_rate, 3)}), flush=True)
    if done.finish_reason == "error":
        print(f"retake say: the take failed: {done.error}", file=sys.stderr)
        return 1
    return 0
