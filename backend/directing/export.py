"""A take as a WAV file: `GET /sessions/{session_id}/takes/{take_id}.wav`, from its kept audio.

Design choices:
- An ended take keeps the audio that streamed (backend/directing/live_take.py), so its export
  is that audio: instant, and never competing with live takes for the engine. A take without
  kept audio (stored by an older Retake, or one a stopped server interrupted) is vocoded from
  its stored codes on the engine thread between two decode steps (a `CallJob`), which equals
  the streamed samples too.
- A full engine queue is HTTP 503 with `Retry-After`, as on `/v1/audio/speech`.
- The URL names the session but does not open it: the session's key goes in the
  `Retake-Session-Key` header (a header, so no access log or shared link holds it). Without it
  the answer is 401; with another key, 404 as for a take that does not exist.
"""

from __future__ import annotations

import io
import wave

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backend.directing.loop import QueueFull
from backend.state import ServerState
from backend.store import StoredTake

SESSION_KEY_HEADER = "Retake-Session-Key"


def wav_bytes(pcm: np.ndarray, sample_rate: int) -> bytes:
    """16-bit mono WAV of int16 samples [N]."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
    return buffer.getvalue()


async def take_pcm(state: ServerState, take: StoredTake) -> np.ndarray:
    """An ended take's audio, int16 [samples]: its kept audio, else vocoded from its codes (QueueFull
    when the engine's queue is full). Counted in /metrics by where it came from."""
    kept = await state.db.run(state.store.take_audio, take.take_id)
    codes = None if kept is not None else await state.db.run(state.store.take_codes, take.take_id)
    state.metrics.exports["kept" if kept is not None or codes is None else "vocoded"] += 1
    if codes is not None:
        return await state.call(lambda engine: engine.vocode_take(codes))
    return np.zeros(0, dtype=np.int16) if kept is None else kept[0]


async def export_take(request: Request) -> Response:
    state: ServerState = request.app.state.retake
    session_id, raw_id = request.path_params["session_id"], request.path_params["take_id"]
    key = request.headers.get(SESSION_KEY_HEADER)
    if key is None:
        return JSONResponse({"error": f"send the session's key (session.ready's session_key) in the "
                                      f"{SESSION_KEY_HEADER} header"}, status_code=401)
    if await state.db.run(state.store.session_key, session_id, key) != "ok":  # as unknown: no hint it exists
        return JSONResponse({"error": f"no take {raw_id[:16]} in session {session_id[:64]} with this key"},
                            status_code=404)
    # isascii: str.isdigit also accepts digits int() refuses, such as the superscript "²"
    number = raw_id.isascii() and raw_id.isdigit() and len(raw_id) < 11
    take = await state.db.run(state.store.take, session_id, int(raw_id)) if number else None
    if take is None:
        return JSONResponse({"error": f"no take {raw_id[:16]} in session {session_id[:64]} with this key"},
                            status_code=404)
    if take.state != "done":
        return JSONResponse({"error": f"take {take.take_id} is still {take.state}"}, status_code=409)
    try:
        pcm = await take_pcm(state, take)
    except QueueFull as error:
        return JSONResponse({"error": str(error)}, status_code=503, headers={"Retry-After": str(error.retry_after_s)})
    filename = f"take-{take.take_id}.wav"
    return Response(wav_bytes(pcm, state.engine.sample_rate), media_type="audio/wav",
                    headers={"Content-Disposition": f'attachment; filename="{filename}"'})
