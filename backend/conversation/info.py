"""`GET /converse/info`: what the conversation page needs before a conversation starts.

Design choices:
- The page shows the server's voices, its default voice and persona, the persona's length
  limit and the demo-weights banner as soon as it loads, instead of learning them from the
  first `converse.ready` or from a refusal (docs/protocol.md §9).
- It answers on a server without a conversation engine too (`converse: false`), so the page
  can say so before the microphone is asked for. The token is checked as on the other HTTP
  routes: the voices are the deployment's.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backend.conversation.protocol import MAX_PERSONA_CHARS
from backend.state import ServerState
from engine.personaplex import DEFAULT_PERSONA
from engine.personaplex.engine import MAX_CLIP_SECONDS


async def conversation_info(request: Request) -> Response:
    state: ServerState = request.app.state.retake
    conversations = state.conversations
    if conversations is None or conversations.engine is None:
        return JSONResponse({"converse": False})
    engine = conversations.engine
    return JSONResponse({
        "converse": True, "voices": conversations.voices, "voice": conversations.default_voice,
        "persona": DEFAULT_PERSONA, "max_persona_chars": MAX_PERSONA_CHARS, "max_clip_seconds": MAX_CLIP_SECONDS,
        "sample_rate": engine.sample_rate, "frame_samples": engine.frame_size,
        "demo_weights": bool(engine.demo_weights),
    })
