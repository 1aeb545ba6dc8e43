/**
 * The scenes of this browser, through the server's `/sessions` routes (docs/protocol.md §8.2):
 * listed with their names, dates and durations; new, renamed, duplicated, deleted and restored.
 *
 * Design choices:
 * - The server keeps every scene; which ones are this director's is this browser's list of the
 *   scene ids it opened or made (localStorage), which the list asks the server about. A scene
 *   the server does not list (deleted, or never on this server) leaves the browser's list; a
 *   deletion's Undo restores it by id.
 * - A scene opens by URL (`?session=ID`); a new one is `?new`, which opens a session without an
 *   id (the server makes one). Opening is a page load: the studio's state is one scene's.
 * - A scene is reached with its key (docs/protocol.md §11), kept in localStorage beside its id
 *   (`retake.key.ID`): the list sends each id with its key, the other routes send the key in
 *   the `Retake-Session-Key` header; a duplicate's key comes in its answer, once.
 * - Answers are checked field by field, like the socket's messages (shared/wire.ts).
 */
import { int, list, nullable, num, record, str, type Check } from "../shared/wire";

export interface SceneInfo {
  session_id: string;
  name: string;
  created_ms: number;
  updated_ms: number;
  deleted_ms: number | null;
  lines: number;
  takes: number;
  kept: number;
  seconds: number;
  /** The key of a scene just made (a duplicate); null otherwise. */
  session_key: string | null;
}

const KNOWN_KEY = "retake.scenes";
const KEY_HEADER = "Retake-Session-Key";
const keyName = (sessionId: string): string => `retake.key.${sessionId}`;

/** The scene's key, as this browser holds it (null: none). */
export const sceneKey = (sessionId: string): string | null => localStorage.getItem(keyName(sessionId));

export function rememberSceneKey(sessionId: string, key: string): void {
  localStorage.setItem(keyName(sessionId), key);
}

const sceneInfo: Check<SceneInfo> = record<SceneInfo>({
  session_id: str, name: str, created_ms: int, updated_ms: int, deleted_ms: nullable(int), lines: int, takes: int,
  kept: int, seconds: num, session_key: nullable(str),
});

export class SceneError extends Error {}

/** The server's `{"error": ...}` sentence, else the status. */
function errorOf(value: unknown, status: number): string {
  return typeof value === "object" && value !== null && typeof (value as { error?: unknown }).error === "string"
    ? (value as { error: string }).error : `HTTP ${status}`;
}

async function call<T>(method: string, path: string, check: Check<T>, body?: unknown, key?: string | null): Promise<T> {
  let reply: Response;
  const headers: Record<string, string> = { "Content-Type": "application/json" };
  if (key !== undefined) headers[KEY_HEADER] = key ?? "";
  try {
    reply = await fetch(new URL(path, location.href), {
      method, headers, ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
  } catch {
    throw new SceneError("the server cannot be reached");
  }
  const text = await reply.text();
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new SceneError(`the server answered ${reply.status} without JSON`);
  }
  if (!reply.ok) throw new SceneError(errorOf(value, reply.status));
  return check(value, "answer");
}

/** The scene ids this browser knows, the last opened first. */
export function knownScenes(): string[] {
  try {
    const ids: unknown = JSON.parse(localStorage.getItem(KNOWN_KEY) ?? "[]");
    return Array.isArray(ids) ? ids.filter((id): id is string => typeof id === "string") : [];
  } catch {
    return [];
  }
}

export function rememberScene(sessionId: string): void {
  localStorage.setItem(KNOWN_KEY, JSON.stringify([sessionId, ...knownScenes().filter((id) => id !== sessionId)].slice(0, 1000)));
}

export function forgetScenes(ids: readonly string[]): void {
  localStorage.setItem(KNOWN_KEY, JSON.stringify(knownScenes().filter((id) => !ids.includes(id))));
}

/** This browser's scenes that the server has and that are not deleted, the last changed first. */
export async function listScenes(): Promise<SceneInfo[]> {
  const answer = await call("POST", "/sessions/list", record({ sessions: list(sceneInfo), unknown: list(str) }),
                            { sessions: knownScenes().map((session_id) => ({ session_id, session_key: sceneKey(session_id) ?? "" })) });
  forgetScenes(answer.unknown); // deleted, or not on this server (a deletion's Undo restores by id)
  return answer.sessions;
}

export const renameScene = (sessionId: string, name: string): Promise<SceneInfo> =>
  call("PATCH", `/sessions/${encodeURIComponent(sessionId)}`, sceneInfo, { name }, sceneKey(sessionId));

export async function duplicateScene(sessionId: string): Promise<SceneInfo> {
  const copy = await call("POST", `/sessions/${encodeURIComponent(sessionId)}/duplicate`, sceneInfo, {}, sceneKey(sessionId));
  if (copy.session_key !== null) rememberSceneKey(copy.session_id, copy.session_key);
  rememberScene(copy.session_id);
  return copy;
}

export const deleteScene = (sessionId: string): Promise<SceneInfo> =>
  call("DELETE", `/sessions/${encodeURIComponent(sessionId)}`, sceneInfo, undefined, sceneKey(sessionId));

export async function restoreScene(sessionId: string): Promise<SceneInfo> {
  const scene = await call("POST", `/sessions/${encodeURIComponent(sessionId)}/restore`, sceneInfo, undefined, sceneKey(sessionId));
  rememberScene(sessionId);
  return scene;
}

/**
 * The server's export of a whole scene: `wav` (with `characterId`, that character's stem) or
 * `srt` (subtitles), with `gapMs` of silence between the kept takes; the file's name is the
 * server's (Content-Disposition).
 */
export async function sceneFile(sessionId: string, kind: "wav" | "srt", gapMs: number,
                                characterId?: string): Promise<{ name: string; data: ArrayBuffer }> {
  const url = new URL(`/sessions/${encodeURIComponent(sessionId)}/scene.${kind}`, location.href);
  url.searchParams.set("gap_ms", String(gapMs));
  if (characterId !== undefined) url.searchParams.set("character", characterId);
  let reply: Response;
  try {
    reply = await fetch(url, { headers: { [KEY_HEADER]: sceneKey(sessionId) ?? "" } });
  } catch {
    throw new SceneError("the server cannot be reached");
  }
  if (!reply.ok) {
    let value: unknown = null;
    try {
      value = JSON.parse(await reply.text());
    } catch { /* not JSON: the status says it */ }
    throw new SceneError(errorOf(value, reply.status));
  }
  const name = /filename="([^"]+)"/.exec(reply.headers.get("Content-Disposition") ?? "")?.[1] ?? `scene.${kind}`;
  return { name, data: await reply.arrayBuffer() };
}

/** The URL that opens a scene (or a new one). */
export function sceneUrl(sessionId: string | null): string {
  const url = new URL(location.href);
  url.search = sessionId === null ? "?new" : `?session=${encodeURIComponent(sessionId)}`;
  url.hash = "";
  return url.href;
}
