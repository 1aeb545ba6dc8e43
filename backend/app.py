"""The Starlette app: routes, and a lifespan that loads and warms the engine before serving.

Routes: `/ws` (directing sessions, backend/directing/ws.py), `POST /v1/audio/speech`
(backend/directing/speech.py), `/v1/audio/voices` (saved voices, backend/directing/voices.py),
`GET /sessions/{session_id}/takes/{take_id}.wav` (a take's kept audio, backend/directing/export.py),
`/sessions` (the scenes: list, new, rename, duplicate, delete, restore, and a scene's WAV, stems
and subtitles; backend/directing/scenes.py),
`/converse` (live
conversations, backend/conversation/ws.py), `/api/chat` (the same conversations in the Moshi
protocol of the official PersonaPlex and moshi clients, backend/conversation/moshi.py),
`/health`, `/metrics`, the studio's built files at `/`, and `POST /auth` (sets the token
cookie the studio uses). Every request and socket passes admission first
(backend/admission.py: host, origin, token, body size), a middleware around all routes, so
routes never check credentials themselves.

The lifespan runs before uvicorn accepts connections: it opens the store (finishing takes a
previous run left unfinished), starts the engine loop thread, which loads the engine and
runs its warm-up, and logs what it measured. On shutdown the loop stops after uvicorn has
closed the sockets (with 1012, "service restart": clients reconnect and resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from backend.admission import TOKEN_COOKIE, Admission, bearer
from backend.conversation.info import conversation_info
from backend.conversation.loop import ConversationLoop
from backend.conversation.moshi import moshi_socket
from backend.conversation.ws import conversation_socket
from backend.directing.export import export_take
from backend.directing.loop import EngineLoop
from backend.directing.scenes import create_scene, duplicate_scene, list_scenes, restore_scene, scene, scene_file
from backend.directing.speech import speech
from backend.directing.voices import delete_voice, voices
from backend.directing.ws import directing_socket
from backend.metrics import Metrics
from backend.pauses import LoopWatch
from backend.settings import Settings
from backend.state import EngineInfo, ServerState
from backend.store import Store
from engine import Drama3Engine
from engine.personaplex import PersonaPlex

if TYPE_CHECKING:
    from engine.drama3.mixed import MixedSteps

log = logging.getLogger("retake")

NOT_BUILT = """<!doctype html><meta charset="utf-8"><title>Retake</title>
<h1>Retake is running, but the studio is not built</h1>
<p>Run <code>npm run build</code> in the repository (or <code>scripts/setup</code>), then reload this page.</p>
<p>The server itself works: <a href="/health">/health</a>, <code>/ws</code>, <code>POST /v1/audio/speech</code>.</p>
"""


def engine_loader(settings: Settings) -> Callable[[], Drama3Engine]:
    def load() -> Drama3Engine:
        from engine import EngineSpec, load_engine

        return load_engine(EngineSpec(checkpoint=settings.checkpoint, device=settings.device,
                                      first_window_frames=settings.first_window_frames, slots=settings.slots,
                                      threads=settings.threads, random_weights=settings.random_weights,
                                      prefix_cache_gib=settings.prefix_cache_gib,
                                      prefix_cache_host_gib=settings.prefix_cache_host_gib,
                                      prefill_group=settings.prefill_group, mixed_step=settings.mixed_step,
                                      mixed_group=settings.mixed_group,
                                      early_windows=settings.early_windows, vocoder_order=settings.vocoder_order,
                                      warms_yield=settings.warms_yield, keep_warms=settings.keep_warms,
                                      kernels=settings.kernels,
                                      compile_prefill=settings.compile_prefill,
                                      vocoder_compile=settings.vocoder_compile))

    return load


def start_conversation_loop(settings: Settings) -> ConversationLoop:
    """Load the PersonaPlex engine for `/converse` on its own thread (raises what loading raised)."""
    def load() -> PersonaPlex:
        checkpoint = None if settings.conversation == "demo" else settings.conversation
        if settings.conversation_random is not None:  # released size: random weights made on the GPU
            from engine.device import pick_device
            from engine.personaplex.random_weights import random_engine, random_parts

            parts = random_parts(settings.conversation_random, pick_device(settings.device))
            return random_engine(parts, slots=settings.conversation_slots, compiled=settings.conversation_compiled)
        device = "cpu" if checkpoint is None and settings.device == "auto" else settings.device
        return PersonaPlex.load(checkpoint, device=device, slots=settings.conversation_slots,
                                compiled=settings.conversation_compiled)

    conversations = ConversationLoop(load)
    try:
        conversations.start()
    except BaseException:
        conversations.stop()
        raise
    return conversations


async def auth(request: Request) -> Response:
    """`POST /auth` with `Authorization: Bearer TOKEN` (admission checked it): the token as an
    HttpOnly, SameSite=Strict cookie, which browsers send on the studio's socket and fetches."""
    state: ServerState = request.app.state.retake
    token = bearer(dict(request.headers))
    if state.settings.token is None or token is None:
        return JSONResponse({"cookie": False})
    response = JSONResponse({"cookie": True})
    response.set_cookie(TOKEN_COOKIE, token, max_age=30 * 86400, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


async def health(request: Request) -> Response:
    """For people and for the balancer: 200 once warm (uvicorn listens only then), 503 while draining."""
    state: ServerState = request.app.state.retake
    return JSONResponse({"status": "draining" if state.draining else "ok", "engine": state.engine.name,
                         "demo_weights": state.engine.demo_weights, "sessions": state.sockets,
                         "queue": state.engine_loop.depth, "converse": state.conversations is not None,
                         "replica": state.store.replica.id, "pid": os.getpid()},
                        status_code=503 if state.draining else 200)


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.retake
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")


async def voices_route(request: Request) -> Response:
    return await (delete_voice(request) if request.method == "DELETE" else voices(request))


def prefix_cache_line(warm: Mapping[str, object], slots: int) -> str:
    """What the prefix cache holds, in snapshots a prefill can resume from: each keeps every
    DeltaNet layer's state (~64 MiB at full size) beside its rows. A director needs about two at
    once (the history's and the next line's warm), so fewer than two a slot means warms evicted
    before their takes come with every slot in use (stop 55's H100: 5.15 GiB, ~82 for 59 slots)."""
    def number(key: str) -> float:
        value = warm.get(key)
        return float(value) if isinstance(value, int | float) else 0.0

    gib, host, states = number("prefix_cache_gib"), number("prefix_cache_host_gib"), number("prefix_cache_states_mib")
    line = f"{gib:g} GiB for snapshots of prompt prefixes ({host:g} GiB of host memory for evicted ones)"
    if not states:
        return line
    held = int((gib + host) * 1024 / states)
    line += f"; ~{held:,} to resume from ({states:g} MiB of DeltaNet states each, beside their rows)"
    if held < 2 * slots:
        line += (f": under two for each of the {slots} slots, so with every slot directing the next lines' warms "
                 "may be evicted before their takes come (--prefix-cache-host-gib keeps evicted ones in host memory)")
    return line


def mixed_steps_line(mixed: MixedSteps) -> str:
    """What decode steps carry of the waiting prompts (engine/drama3/mixed.py)."""
    if not mixed.enabled:
        return "off; a prompt's chunks run between the decode steps (--mixed-step)"
    line = f"a waiting prompt's next {max(mixed.sizes)} rows ride each decode step"
    if not mixed.grouped:
        return line + ", one prompt a step (--mixed-step groups: up to 8 together)"
    most = min(mixed.groups.most, max(prompts for prompts, _ in mixed.shapes))
    shapes = " or ".join(f"{prompts} x {rows}" for prompts, rows in mixed.shapes)
    return line + f", or the next chunks of up to {most} prompts together ({shapes} rows)"


def log_ready(engine_loop: EngineLoop) -> None:
    """The seed's warm-up line: decode step time and peak memory, and a plain word about demo weights."""
    engine, warm = engine_loop.engine, engine_loop.warm_up
    assert engine is not None
    step, peak = warm.get("decode_step_ms"), warm.get("peak_memory_gib")
    log.info("engine %s ready on %s after a %ss warm-up take: one decode step %s ms, %d slot%s, peak memory %s",
             engine.name, engine.device, warm.get("warm_up_s", "?"), "?" if step is None else step, engine.slots,
             "" if engine.slots == 1 else "s", "n/a (CPU)" if peak is None else f"{peak} GiB")
    log.info("slots: %s", engine.slots_why)
    if engine.prefix_cache_stats() is None:
        log.info("prefix cache: off; every take prefills its whole prompt")
    else:
        log.info("prefix cache: %s", prefix_cache_line(warm, engine.slots))
        keep = engine.decoder.prefix is not None and engine.decoder.prefix.keep_warms
        log.info("prefix cache order: %s", "least recently used, but a warm's snapshot last until its take restores "
                 "it (--keep-warms off: least recently used)" if keep else "least recently used (--keep-warms off)")
    group = engine.prefill_group
    log.info("prefill groups: %s", f"the next chunks of up to {group} waiting prompts run as one" if group > 1
             else "off; each waiting prompt's chunks run alone (--prefill-group)")
    log.info("mixed steps: %s", mixed_steps_line(engine.decoder.mixed))
    log.info("early windows: %s", "on; a window closes early where a take's client would run out of audio"
             if engine.early_windows else "off; windows close at the schedule's ends only (--early-windows)")
    log.info("vocoder order: %s", "deadline; first windows, then the windows whose clients run out of audio soonest"
             if engine.vocoder_order == "deadline" else "arrival; first windows first, then as they came")
    log.info("warms yield: %s", "on; the next lines' warms wait while the vocoder has a window due"
             if engine.warms_yield else "off; warms ride the steps the playing takes allow (--warms-yield)")
    if engine.window_graphs is not None and engine.window_graphs.compiled:
        log.info("vocoder compiled: the window graphs replay an Inductor-compiled decode (--vocoder-compile off: "
                 "op by op)")
    if isinstance(fast := warm.get("fast_path"), list) and fast:  # on CUDA: what runs fused or compiled (fast.py)
        log.info("fast path: %s", ", ".join(fast))
    if engine.demo_weights:
        log.warning("DEMO WEIGHTS (RANDOM): %s; its audio is noise", engine.weights)


async def not_built(request: Request) -> Response:
    return HTMLResponse(NOT_BUILT)


def start_engine_loop(settings: Settings, load: Callable[[], Drama3Engine] | None = None) -> EngineLoop:
    """Start the engine thread; returns once the engine is loaded and warm (raises what loading raised)."""
    engine_loop = EngineLoop(load or engine_loader(settings), settings.limits.max_queue)
    try:
        engine_loop.start()
    except BaseException:
        engine_loop.stop()
        raise
    return engine_loop


def build_app(settings: Settings, engine_loop: EngineLoop | None = None,
              conversations: ConversationLoop | None = None) -> Starlette:
    """The app. With `engine_loop` (already started) the caller owns it, and it outlives the app
    (`retake serve` starts it first to report loading errors in one line; tests restart the
    server around one engine); without it the lifespan starts and stops one."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = Store(settings.database)
        if store.interrupted:
            log.info("%d takes were unfinished when the server last stopped; they are marked as errors",
                     store.interrupted)
        owned = engine_loop is None
        try:
            running = engine_loop if engine_loop is not None else await asyncio.to_thread(start_engine_loop, settings)
        except BaseException:
            store.close()
            raise
        engine = running.engine
        assert engine is not None
        info = EngineInfo(engine.name, engine.sample_rate, engine.frame_samples, bool(engine.demo_weights))
        served = settings.with_engine_limits(dict(engine.limits))
        talking = conversations
        if talking is None and settings.conversation is not None:
            try:
                talking = await asyncio.to_thread(start_conversation_loop, settings)
            except BaseException:
                if owned:
                    running.stop()
                store.close()
                raise
            assert talking.engine is not None
            log.info("conversations on /converse: PersonaPlex on %s, %d slots%s", talking.engine.device,
                     talking.engine.slots, "; DEMO WEIGHTS, its audio is noise" if talking.engine.demo_weights else "")
        state = ServerState(served, store, running, info, Metrics(lambda: running.depth, lambda: 0),
                            conversations=talking)
        state.metrics.sessions = lambda: state.sockets
        state.metrics.draining = lambda: state.draining
        if (engine := running.engine) is not None:
            state.metrics.prefix_cache = engine.prefix_cache_stats
            state.metrics.warms = lambda: dict(running.warms)
        if (live := talking) is not None:
            state.metrics.conversations = lambda: live.active
            state.metrics.system_prompts = live.system_prompts
            # Drama 3's prefix cache took its budget from the memory free at its warm-up, before
            # PersonaPlex's rings were made: its snapshots would have run the GPU out of memory.
            gib = await state.call(lambda drama: drama.fit_prefix_cache())
            log.info("prefix cache: %.2f GiB now that PersonaPlex holds its memory", gib)
        app.state.retake = state
        if owned:
            log_ready(running)
        stalls = LoopWatch()  # a held event loop logged with what held it (pauses.py)
        stalls.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            stalls.stop()
            state.closing = True
            if owned:
                running.stop()
            if talking is not None and conversations is None:
                talking.stop()
            state.db.close()  # the writes already asked for finish first
            store.close()

    routes: list[Route | WebSocketRoute | Mount] = [
        WebSocketRoute("/ws", directing_socket),
        WebSocketRoute("/converse", conversation_socket),
        WebSocketRoute("/api/chat", moshi_socket),
        Route("/health", health),
        Route("/converse/info", conversation_info),
        Route("/metrics", metrics),
        Route("/auth", auth, methods=["POST"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/audio/voices", voices_route, methods=["GET", "POST"]),
        Route("/v1/audio/voices/{voice}", voices_route, methods=["DELETE"]),
        Route("/sessions/{session_id}/takes/{take_id}.wav", export_take),
        Route("/sessions", create_scene, methods=["POST"]),
        Route("/sessions/list", list_scenes, methods=["POST"]),
        Route("/sessions/{session_id}", scene, methods=["PATCH", "DELETE"]),
        Route("/sessions/{session_id}/restore", restore_scene, methods=["POST"]),
        Route("/sessions/{session_id}/duplicate", duplicate_scene, methods=["POST"]),
        Route("/sessions/{session_id}/scene.wav", scene_file),
        Route("/sessions/{session_id}/scene.srt", scene_file),
    ]
    if (settings.static_dir / "index.html").is_file():
        routes.append(Mount("/", StaticFiles(directory=settings.static_dir, html=True)))
    else:
        routes.append(Route("/", not_built))
    middleware = [Middleware(Admission, settings=settings)]
    if settings.allow_origins:  # pages on those origins may read the API's answers too
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(settings.allow_origins),
                                     allow_methods=["GET", "POST"], allow_credentials="*" not in settings.allow_origins,
                                     allow_headers=["Authorization", "Content-Type", "Retake-Session-Key"]))
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
