"""A whole scene as files: `GET /sessions/{session_id}/scene.wav` (the kept take of every line, in
script order, with a gap of silence between them), the same with `?character=ID` (one
character's stem: that character's takes where they fall in the scene, silence elsewhere), and
`GET /sessions/{session_id}/scene.srt` (who says what, when: subtitles on the same timeline).

Design choices:
- One timeline for all three: take i starts after the takes before it and i gaps, so every stem
  is as long as the scene and the stems added together are the scene, sample for sample, and the
  subtitles' times are where the words are in each.
- The audio is each take's kept audio (backend/directing/export.py's `take_pcm`: instant; a take
  without kept audio is vocoded from its codes on the engine thread), exactly what the studio
  played and what a take's own export holds.
- A take says who said it (`character_id`); a stem is by that, so a line given to another
  character after its take was kept still has its take in the stem of who spoke it. Without a
  cast there is one speaker and no stems.
- Query fields are checked like the socket's: a bad one is a 400 that says what to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backend.directing.export import take_pcm, wav_bytes
from backend.directing.loop import QueueFull
from backend.state import ServerState
from backend.store import StoredTake

DEFAULT_GAP_MS = 300  # the studio's default
MAX_GAP_MS = 10_000


@dataclass(frozen=True)
class Cue:
    """A kept take on the scene's timeline."""

    take: StoredTake
    speaker: str  # the character's name; "" without a cast
    start: int  # samples from the scene's start
    pcm: np.ndarray  # int16 [samples]


def gap_of(request: Request) -> int | JSONResponse:
    raw = request.query_params.get("gap_ms", str(DEFAULT_GAP_MS))
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_GAP_MS:
        return JSONResponse({"error": f"gap_ms must be a whole number of milliseconds from 0 to {MAX_GAP_MS}"},
                            status_code=400)
    return int(raw)


async def timeline(state: ServerState, session_id: str, gap_ms: int) -> list[Cue]:
    """The script's kept takes, in script order, where each starts (raises QueueFull)."""
    store = state.store

    def read() -> tuple[dict[str, str], dict[int, StoredTake], list[int]]:  # (on the store thread)
        return ({m.character_id: m.name for m in store.cast(session_id)},
                {t.take_id: t for t in store.takes(session_id)}, store.kept_history(session_id))

    names, takes, kept = await state.db.run(read)
    gap = round(gap_ms / 1000 * state.engine.sample_rate)
    cues, start = [], 0
    for take_id in kept:
        take = takes[take_id]
        pcm = await take_pcm(state, take)
        cues.append(Cue(take, names.get(take.character_id or "", ""), start, pcm))
        start += pcm.size + gap
    return cues


def mix(cues: list[Cue], keep: set[int] | None = None) -> np.ndarray:
    """The timeline as samples [N]: every cue, or only the takes in `keep` (silence elsewhere)."""
    end = max((c.start + c.pcm.size for c in cues), default=0)
    out = np.zeros(end, dtype=np.int16)
    for cue in cues:
        if keep is None or cue.take.take_id in keep:
            out[cue.start:cue.start + cue.pcm.size] = cue.pcm
    return out


def srt_time(sample: int, sample_rate: int) -> str:
    ms = round(sample * 1000 / sample_rate)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def subtitles(cues: list[Cue], sample_rate: int) -> str:
    """SubRip: one cue per kept take, `Name: text` when the scene has a cast."""
    blocks = []
    for number, cue in enumerate(cues, 1):
        said = f"{cue.speaker}: {cue.take.text}" if cue.speaker else cue.take.text
        blocks.append(f"{number}\n{srt_time(cue.start, sample_rate)} --> "
                      f"{srt_time(cue.start + cue.pcm.size, sample_rate)}\n{said}\n")
    return "\n".join(blocks)


def file_stem(name: str, session_id: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:48]
    return slug or f"scene-{session_id[:8]}"


async def export_scene(request: Request, state: ServerState, session_id: str, kind: str) -> Response:
    """scene.wav (with `character`, a stem) or scene.srt; the caller checked the scene may be read."""
    gap_ms = gap_of(request)
    if isinstance(gap_ms, JSONResponse):
        return gap_ms
    character = request.query_params.get("character")
    cast = {m.character_id: m.name for m in await state.db.run(state.store.cast, session_id)}
    if character is not None and (kind != "wav" or character not in cast):
        known = ", ".join(cast) or "none: the scene has no cast"
        return JSONResponse({"error": f"character must be a character_id of the scene's cast ({known[:512]}), "
                                      "and only for scene.wav"}, status_code=400)
    try:
        cues = await timeline(state, session_id, gap_ms)
    except QueueFull as error:
        return JSONResponse({"error": str(error)}, status_code=503, headers={"Retry-After": str(error.retry_after_s)})
    stem = file_stem(await state.db.run(state.store.scene_name, session_id), session_id)
    if kind == "srt":
        return Response(subtitles(cues, state.engine.sample_rate), media_type="application/x-subrip",
                        headers={"Content-Disposition": f'attachment; filename="{stem}.srt"'})
    keep = None if character is None else {c.take.take_id for c in cues if c.take.character_id == character}
    if character is not None:
        stem = f"{stem}-{file_stem(cast[character], character)}"
    return Response(wav_bytes(mix(cues, keep), state.engine.sample_rate), media_type="audio/wav",
                    headers={"Content-Disposition": f'attachment; filename="{stem}.wav"'})
