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
}

const KNOWN_KEY = "retake.scenes";

const sceneInfo: Check<SceneInfo> = record<SceneInfo>({
  session_id: str, name: str, created_ms: int, updated_ms: int, deleted_ms: nullable(int), lines: int, takes: int,
  kept: int, seconds: num,
});

export class SceneError extends Error {}

/** The server's `{"error": ...}` sentence, else the status. */
function errorOf(value: unknown, status: number): string {
  return typeof value === "object" && value !== null && typeof (value as { error?: unknown }).error === "string"
    ? (value as { error: string }).error : `HTTP ${status}`;
}

async function call<T>(method: string, path: string, check: Check<T>, body?: unknown): Promise<T> {
  let reply: Response;
  try {
    reply = await fetch(new URL(path, location.href), {
      method, headers: { "Content-Type": "application/json" }, ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
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
                            { sessions: knownScenes().map((session_id) => ({ session_id })) });
  forgetScenes(answer.unknown); // deleted, or not on this server (a deletion's Undo restores by id)
  return answer.sessions;
}

export const renameScene = (sessionId: string, name: string): Promise<SceneInfo> =>
  call("PATCH", `/sessions/${encodeURIComponent(sessionId)}`, sceneInfo, { name });

export async function duplicateScene(sessionId: string): Promise<SceneInfo> {
  const copy = await call("POST", `/sessions/${encodeURIComponent(sessionId)}/duplicate`, sceneInfo, {});
  rememberScene(copy.session_id);
  return copy;
}

export const deleteScene = (sessionId: string): Promise<SceneInfo> =>
  call("DELETE", `/sessions/${encodeURIComponent(sessionId)}`, sceneInfo);

export async function restoreScene(sessionId: string): Promise<SceneInfo> {
  const scene = await call("POST", `/sessions/${encodeURIComponent(sessionId)}/restore`, sceneInfo);
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
    reply = await fetch(url);
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
