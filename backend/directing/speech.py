"""`POST /v1/audio/speech`: OpenAI's speech API (backend/directing/speech_options.py: response and
stream formats, voice, instructions, speed) over the seed's request body
(backend/directing/speech_request.py).

- A complete response (no `stream_format`, no `stream: true`): the whole take, encoded in
  `response_format` (mp3 by default) once it is done, with complete headers.
- Streamed, `stream_format: "audio"`: the take encoded as it is made, each window's bytes sent
  as soon as the encoder gives them (backend/audio_formats.py); `X-Sample-Rate` says the rate.
- Streamed, `stream_format: "sse"`: `speech.audio.delta` events with the same bytes in
  base64, then `speech.audio.done` with the finish reason and usage (prompt rows in, frames
  out).

The take runs on the engine loop like a directing take (same queue, deadline and cancel on
disconnect, also while a complete response is still being made). The response starts only
when the first audio or the end of the take is there, so a request the engine refuses is an
HTTP 400, not a broken stream. The silence guard runs for complete responses only: streamed
audio cannot be taken back. Encoding runs on a worker thread, window by window in order, so
the event loop never waits for an encoder.

The prompt is built on the engine thread at each attempt: the clips encoded
(`engine.encode_reference`, cached, so a retry does not encode them again), then
`engine.prompt`; its `prompt_ms` counts both.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from backend import json_input
from backend.audio_formats import Encoder
from backend.clips import checked_clip
from backend.directing.jobs import TakeJob, TakeOutcome
from backend.directing.loop import QueueFull
from backend.directing.protocol import Limits
from backend.directing.speech_options import SpeechOptions, parse_speech_options, with_voice
from backend.directing.speech_request import Clip, SpeechRequest, parse_speech_request
from backend.directing.voices import find_voice
from backend.metrics import Metrics
from backend.state import ServerState
from engine import AudioWindow, Drama3Engine, HistoryTurn, Prompt, Reference, RequestError, Sampling


def openai_error(message: str, status_code: int = 400, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status_code < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status_code, headers=headers)


class SpeechSink:
    """Collects a take's events in an asyncio queue for the response, and counts its outcome (also when
    the client left and nobody reads it)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.events: asyncio.Queue[bytes | TakeOutcome] = asyncio.Queue()
        self.retried = False

    def started(self, attempt: int, sampling: Sampling) -> None:
        pass

    def history(self, used: int) -> None:
        pass

    def window(self, attempt: int, window: AudioWindow) -> None:
        self.events.put_nowait(np.ascontiguousarray(window.pcm, dtype="<i2").tobytes())

    def retry(self, attempt: int, message: str) -> None:
        self.retried = True
        self.events.put_nowait(b"")  # marker: drop what was collected so far

    def done(self, outcome: TakeOutcome) -> None:
        self.metrics.take_done(outcome.finish_reason, outcome.timings)
        self.events.put_nowait(outcome)


def speech_prompt(engine: Drama3Engine, request: SpeechRequest, sampling: Sampling,
                  max_rows: int | None = None) -> Prompt:
    """The take's prompt: the request's clips encoded (cached by the engine), then laid out
    within `max_rows` (the server's limit; None: the engine's)."""
    started = time.perf_counter()
    voice = [Reference(engine.encode_reference(clip.audio), clip.text) for clip in request.references]
    history = [HistoryTurn(clip.text, engine.encode_reference(clip.audio)) for clip in request.history]
    prompt = engine.prompt(request.text, request.character or voice or None, history, sampling, max_rows=max_rows)
    return dataclasses.replace(prompt, prompt_ms=(time.perf_counter() - started) * 1000)


async def checked_clips(request: SpeechRequest, limits: Limits, frame_seconds: float) -> SpeechRequest:
    """The request with its clips checked and made clean (backend/clips.py), each at most
    `limits.max_reference_seconds` and all together no more audio than a prompt holds
    (`limits.max_prompt_rows` frames of `frame_seconds`)."""
    budget = limits.max_prompt_rows * frame_seconds
    clips: list[Clip] = []
    for index, clip in enumerate([*request.references, *request.history]):
        audio, seconds = await checked_clip(clip.audio, min(limits.max_reference_seconds, budget),
                                            f"references.{index}.data")
        budget -= seconds
        clips.append(Clip(audio, clip.text))
    voices = len(request.references)
    return dataclasses.replace(request, references=clips[:voices], history=clips[voices:])


async def speech(request: Request) -> Response:
    state: ServerState = request.app.state.retake
    if request.headers.get("content-type", "").split(";", 1)[0].strip().lower() != "application/json":
        return openai_error("send the body as JSON, with Content-Type: application/json", 415)
    try:
        body = json_input.loads(await request.body())
    except ValueError as error:
        return openai_error(f"the body must be JSON: {error}")
    try:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        options = parse_speech_options(body)
        parsed = with_voice(parse_speech_request(body, state.settings.limits), options.instructions,
                            await state.db.run(find_voice, state, options.voice))
        frame_seconds = state.engine.frame_samples / state.engine.sample_rate
        parsed = await checked_clips(parsed, state.settings.limits, frame_seconds)
    except RequestError as error:
        return openai_error(str(error))
    stream = options.streamed
    sampling = parsed.sampling
    if sampling.seed is None:
        sampling = dataclasses.replace(sampling, seed=secrets.randbelow(2**31))
    max_rows = state.settings.limits.max_prompt_rows

    def build_prompt(engine: Drama3Engine, attempt_sampling: Sampling) -> Prompt:
        return speech_prompt(engine, parsed, attempt_sampling, max_rows)

    sink = SpeechSink(state.metrics)
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + state.settings.limits.default_deadline_ms / 1000
    guard = None if stream or state.settings.silence.retries == 0 else state.settings.silence
    job = TakeJob(build_prompt, sampling, sink, loop, deadline, guard, chars=len(parsed.text))
    try:
        state.engine_loop.submit(job)
    except QueueFull as error:
        return openai_error(str(error), 503, {"Retry-After": str(error.retry_after_s)})

    def stop() -> None:
        job.cancel()
        state.engine_loop.withdraw(job)

    # Uvicorn does not cancel a handler whose client went away, so until the response starts we
    # watch for the disconnect ourselves; a streamed response then watches for it on its own (two
    # listeners would split the messages, hence the watcher ends whenever this handler returns).
    gone = asyncio.create_task(_disconnected(request))
    gone.add_done_callback(lambda task: None if task.cancelled() or task.exception() else stop())
    try:
        try:
            first = await sink.events.get()
        except asyncio.CancelledError:
            stop()
            raise
        if isinstance(first, TakeOutcome) and first.finish_reason == "error":
            return openai_error(first.error or "the take failed")
        if not stream:
            return await _complete(state, sink, first, options, stop)
    finally:
        gone.cancel()
    encoder = Encoder(options.response_format, state.engine.sample_rate, streamed=True, native=options.native)
    chunks = _encoded(_chunks(sink, first, stop), encoder)
    if options.stream_format == "audio":
        return StreamingResponse(_raw(chunks), media_type=encoder.media_type, headers=_headers(encoder))
    return StreamingResponse(_sse(chunks), media_type="text/event-stream", headers=_headers(encoder))


def _headers(encoder: Encoder) -> dict[str, str]:
    """The rate the audio is encoded at (Opus 48 kHz, pcm 24 kHz); for raw PCM, all it takes to play it."""
    rate = str(encoder.rate)
    if encoder.format.name == "pcm":
        return {"X-Sample-Rate": rate, "X-Channels": "1", "X-Bit-Depth": "16"}
    return {"X-Sample-Rate": rate}


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (the body was read already, so only the disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _complete(state: ServerState, sink: SpeechSink, first: bytes | TakeOutcome, options: SpeechOptions,
                    stop: Callable[[], None]) -> Response:
    pieces: list[bytes] = []
    event = first
    try:
        while not isinstance(event, TakeOutcome):
            if event == b"":
                pieces.clear()  # a silence-guard retry: the take starts over
            else:
                pieces.append(event)
            event = await sink.events.get()
    except asyncio.CancelledError:
        stop()
        raise
    if event.finish_reason == "error" and not pieces:
        return openai_error(event.error or "the take failed")
    encoder = Encoder(options.response_format, state.engine.sample_rate, streamed=False, native=options.native)
    pcm = np.frombuffer(b"".join(pieces), dtype="<i2")  # [samples]
    data = await asyncio.to_thread(lambda: encoder.write(pcm) + encoder.close())
    return Response(data, media_type=encoder.media_type,
                    headers={"X-Finish-Reason": event.finish_reason, **_headers(encoder)})


async def _chunks(sink: SpeechSink, first: bytes | TakeOutcome,
                  stop: Callable[[], None]) -> AsyncIterator[bytes | TakeOutcome]:
    """PCM chunks then the outcome; stops the take if the client goes away."""
    event = first
    finished = False
    try:
        while True:
            yield event
            if isinstance(event, TakeOutcome):
                finished = True
                return
            event = await sink.events.get()
    finally:
        if not finished:
            stop()


async def _encoded(chunks: AsyncIterator[bytes | TakeOutcome],
                   encoder: Encoder) -> AsyncIterator[bytes | TakeOutcome]:
    """The PCM chunks encoded, as they come (what the encoder holds back comes with a later chunk or at the
    end), then the outcome."""
    async for event in chunks:
        if isinstance(event, TakeOutcome):
            if tail := await asyncio.to_thread(encoder.close):
                yield tail
            yield event
            return
        if event and (data := await asyncio.to_thread(encoder.write, np.frombuffer(event, dtype="<i2"))):
            yield data


async def _raw(chunks: AsyncIterator[bytes | TakeOutcome]) -> AsyncIterator[bytes]:
    async for event in chunks:
        if isinstance(event, bytes) and event:
            yield event


async def _sse(chunks: AsyncIterator[bytes | TakeOutcome]) -> AsyncIterator[str]:
    async for event in chunks:
        if isinstance(event, bytes):
            if event:
                yield "data: " + json.dumps({"type": "speech.audio.delta",
                                             "audio": base64.b64encode(event).decode("ascii")}) + "\n\n"
            continue
        if event.finish_reason == "error":
            error = {"message": event.error or "the take failed", "type": "server_error", "param": None,
                     "code": None}
            yield "data: " + json.dumps({"type": "error", "error": error}) + "\n\n"
            return
        rows, frames = int(event.timings.get("prompt_rows") or 0), int(event.timings.get("frames") or 0)
        usage = {"input_tokens": rows, "output_tokens": frames, "total_tokens": rows + frames}
        yield "data: " + json.dumps({"type": "speech.audio.done", "finish_reason": event.finish_reason,
                                     "usage": usage}) + "\n\n"
