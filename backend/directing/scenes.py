"""The scenes a director keeps: `/sessions` (docs/protocol.md §8.2). A scene is a directing
session; these routes list, create, rename, duplicate, delete and restore them, and export one
whole (backend/directing/scene_export.py).

Design choices:
- The list is of the scenes the client names (`POST /sessions/list` with their ids): the
  server keeps every scene, but which ones a director works on is the director's (the studio
  keeps the ids it opened), so one server serves several directors without showing each the
  others' scenes.
- Deleting keeps everything (`deleted_ms`): the scene leaves the list and does not open, and
  `POST /sessions/{id}/restore` brings it back whole. So deleting needs no confirmation and is
  undone from the notice that follows it.
- A scene's duration is its kept takes' length (what the scene export holds), in seconds at
  the engine's rate.
- A scene is reached with its key, as on the socket (docs/protocol.md §11): the routes of one
  scene take it in the `Retake-Session-Key` header, the list takes each scene's id with its
  key, and a scene made here (new or a duplicate) gets a key, in the 201 answer only. A wrong
  key reads as an unknown scene (404), so neither ids nor names can be probed.
- Bodies are small JSON objects; a field of the wrong type or length is a 400 that names it.
- The store is called on the store thread (backend/store_thread.py), never the event loop.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backend import json_input
from backend.directing import protocol as p
from backend.directing.export import SESSION_KEY_HEADER
from backend.directing.scene_export import export_scene
from backend.state import ServerState
from backend.store import SceneSummary

MAX_NAME_CHARS = 128
MAX_LISTED = 1000
DELETED = "this scene was deleted; restore it (the studio's Undo, or POST /sessions/{id}/restore) to open it"


def scene_json(scene: SceneSummary, sample_rate: int, key: str | None = None) -> dict[str, Any]:
    """A scene as the routes answer it; `session_key` only when the scene was just made (else null)."""
    return {"session_id": scene.session_id, "name": scene.name, "created_ms": scene.created_ms,
            "updated_ms": scene.updated_ms, "deleted_ms": scene.deleted_ms, "lines": scene.lines,
            "takes": scene.takes, "kept": scene.kept, "seconds": round(scene.kept_samples / sample_rate, 2),
            "session_key": key}


def bad(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def body_of(request: Request) -> dict[str, Any] | JSONResponse:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json_input.loads(raw)
    except ValueError as error:
        return bad(f"the body must be a JSON object: {error}")
    return body if isinstance(body, dict) else bad("the body must be a JSON object")


def name_of(body: dict[str, Any], default: str | None = None) -> str | JSONResponse:
    name = body.get("name", default)
    if not isinstance(name, str) or len(name.strip()) > MAX_NAME_CHARS or "\n" in name:
        return bad(f"name must be a single line of at most {MAX_NAME_CHARS} characters")
    return name.strip()


async def summary(state: ServerState, session_id: str, key: str | None = None) -> JSONResponse:
    found = await state.db.run(state.store.scenes, [session_id])
    if not found:
        return bad(f"no scene {session_id[:64]!r}", 404)
    return JSONResponse(scene_json(found[0], state.engine.sample_rate, key))


async def keyed(state: ServerState, request: Request) -> str | JSONResponse:
    """The scene of the path, if the request holds its key (deleted or not); else a 401 or 404."""
    session_id: str = request.path_params["session_id"]
    key = request.headers.get(SESSION_KEY_HEADER)
    if key is None:
        return bad(f"send the scene's key (session.ready's session_key) in the {SESSION_KEY_HEADER} header", 401)
    if await state.db.run(state.store.session_key, session_id, key) != "ok":  # as unknown: no hint it exists
        return bad(f"no scene {session_id[:64]!r} with this key", 404)
    return session_id


async def list_scenes(request: Request) -> Response:
    """POST /sessions/list {"sessions": [{"session_id", "session_key"}, ...]}: those scenes that exist, are
    not deleted and open with that key."""
    state: ServerState = request.app.state.retake
    body = await body_of(request)
    if isinstance(body, JSONResponse):
        return body
    wanted = body.get("sessions", [])
    if not isinstance(wanted, list) or len(wanted) > MAX_LISTED or not all(
            isinstance(item, dict) and isinstance(item.get("session_id"), str)
            and isinstance(item.get("session_key"), str) for item in wanted):
        return bad(f'sessions must be a list of at most {MAX_LISTED} {{"session_id", "session_key"}} objects')
    ids = [item["session_id"][:128] for item in wanted]

    def scenes() -> list[SceneSummary]:  # (on the store thread)
        opened = {item["session_id"][:128] for item in wanted
                  if state.store.session_key(item["session_id"][:128], item["session_key"][:128]) == "ok"}
        return [s for s in state.store.scenes([i for i in ids if i in opened]) if s.deleted_ms is None]

    found = await state.db.run(scenes)
    listed = {s.session_id for s in found}
    return JSONResponse({"sessions": [scene_json(s, state.engine.sample_rate) for s in found],
                         "unknown": [i for i in ids if i not in listed]})


async def create_scene(request: Request) -> Response:
    """POST /sessions {"name"?}: a new, empty scene."""
    state: ServerState = request.app.state.retake
    body = await body_of(request)
    if isinstance(body, JSONResponse):
        return body
    name = name_of(body, "")
    if isinstance(name, JSONResponse):
        return name

    def create() -> tuple[str, str | None]:  # (on the store thread)
        session_id = state.store.create_session()
        key = state.store.new_session_key(session_id)
        state.store.rename_scene(session_id, name)
        return session_id, key

    session_id, key = await state.db.run(create)
    response = await summary(state, session_id, key)
    response.status_code = 201
    return response


async def scene(request: Request) -> Response:
    """PATCH /sessions/{id} {"name"}: rename; DELETE /sessions/{id}: delete (restorable)."""
    state: ServerState = request.app.state.retake
    session_id = await keyed(state, request)
    if isinstance(session_id, JSONResponse):
        return session_id
    if request.method == "DELETE":
        await state.db.run(state.store.delete_scene, session_id)
        holder = state.sessions.get(session_id)
        if holder is not None:  # the page that holds it learns it is gone
            holder.outbox.message(p.Error("scene_deleted", DELETED, None, None, None))
            holder.outbox.close(1000, "scene deleted")
            holder.detach()
        return await summary(state, session_id)
    body = await body_of(request)
    if isinstance(body, JSONResponse):
        return body
    if "name" not in body:
        return bad("give the scene's new name: {\"name\": ...}")
    name = name_of(body)
    if isinstance(name, JSONResponse):
        return name
    await state.db.run(state.store.rename_scene, session_id, name)
    return await summary(state, session_id)


async def restore_scene(request: Request) -> Response:
    """POST /sessions/{id}/restore: bring a deleted scene back."""
    state: ServerState = request.app.state.retake
    session_id = await keyed(state, request)
    if isinstance(session_id, JSONResponse):
        return session_id
    await state.db.run(state.store.delete_scene, session_id, deleted=False)
    return await summary(state, session_id)


async def scene_file(request: Request) -> Response:
    """GET /sessions/{id}/scene.wav (?gap_ms, ?character) or scene.srt (backend/directing/scene_export.py)."""
    state: ServerState = request.app.state.retake
    session_id = await keyed(state, request)
    if isinstance(session_id, JSONResponse):
        return session_id
    if await state.db.run(state.store.scene_deleted, session_id):
        return bad(DELETED, 409)
    return await export_scene(request, state, session_id, request.url.path.rsplit(".", 1)[-1])


async def duplicate_scene(request: Request) -> Response:
    """POST /sessions/{id}/duplicate {"name"?}: a copy of the scene (default name: "<name> (copy)")."""
    state: ServerState = request.app.state.retake
    session_id = await keyed(state, request)
    if isinstance(session_id, JSONResponse):
        return session_id
    body = await body_of(request)
    if isinstance(body, JSONResponse):
        return body
    original = await state.db.run(state.store.scene_name, session_id)
    name = name_of(body, f"{original or 'Untitled scene'} (copy)"[:MAX_NAME_CHARS])
    if isinstance(name, JSONResponse):
        return name

    def duplicate() -> tuple[str, str | None]:  # (on the store thread)
        copy_id = state.store.create_session()
        key = state.store.new_session_key(copy_id)
        state.store.duplicate_scene(session_id, copy_id, name)
        return copy_id, key

    copy_id, key = await state.db.run(duplicate)
    response = await summary(state, copy_id, key)
    response.status_code = 201
    return response
