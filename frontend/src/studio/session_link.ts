/**
 * Which session the studio opens, and what this browser keeps of it: the page's URL
 * (`?session=ID#key=KEY`, `?new`), localStorage (the last session, its key, its draft).
 *
 * Design choices:
 * - The session's id is in the URL and in localStorage; its key in the URL's fragment, which
 *   browsers never send to a server, and in localStorage (scenes.ts), so a reload, a reconnect
 *   or the same URL in another browser resumes the scene, and the id alone (in export URLs and
 *   server logs) opens nothing.
 * - The browser keeps only what the server does not: script edits not yet confirmed (a draft,
 *   sent on the next session.ready), the selection, and the latencies this page heard.
 */
import { readStoredScene, type StoredScene } from "./scene";
import { sceneKey as storedSceneKey } from "./scenes";

const SESSION_KEY = "retake.session";
const SESSION_PARAM = "session";
const NEW_PARAM = "new";
const KEY_PARAM = "key";
const draftKey = (sessionId: string): string => `retake.script.${sessionId}`;

/** The session the URL asks for (`?session=`), or null. */
export const requestedSession = (): string | null => new URLSearchParams(location.search).get(SESSION_PARAM);

/** `?new` in the URL: open a new scene, not the browser's last one. */
export const wantsNewScene = (): boolean => new URLSearchParams(location.search).has(NEW_PARAM);

/** The session this browser opened last. */
export const lastSession = (): string | null => localStorage.getItem(SESSION_KEY);

export function rememberLastSession(sessionId: string | null): void {
  if (sessionId === null) localStorage.removeItem(SESSION_KEY);
  else localStorage.setItem(SESSION_KEY, sessionId);
}

/** The session's key: from the URL's fragment (a link to the scene) or this browser's storage. */
export function sessionKeyOf(sessionId: string): string | null {
  const fromUrl = new URLSearchParams(location.hash.slice(1)).get(KEY_PARAM);
  if (fromUrl !== null && new URLSearchParams(location.search).get(SESSION_PARAM) === sessionId) return fromUrl;
  return storedSceneKey(sessionId);
}

/** Store what the browser keeps of the scene. */
export function storeScene(sessionId: string, scene: StoredScene): void {
  localStorage.setItem(draftKey(sessionId), JSON.stringify(scene));
}

export function loadScene(sessionId: string): StoredScene | null {
  const text = localStorage.getItem(draftKey(sessionId));
  if (text === null) return null;
  try {
    return readStoredScene(JSON.parse(text));
  } catch {
    return null;
  }
}

/** Put the session in the address bar (its key after #), so the URL opens this scene in any browser. */
export function showSessionInUrl(sessionId: string, key: string | null): void {
  const url = new URL(location.href);
  const hash = new URLSearchParams(url.hash.slice(1));
  if (url.searchParams.get(SESSION_PARAM) === sessionId && hash.get(KEY_PARAM) === key && !url.searchParams.has(NEW_PARAM)) {
    return;
  }
  url.searchParams.delete(NEW_PARAM);
  url.searchParams.set(SESSION_PARAM, sessionId);
  if (key === null) hash.delete(KEY_PARAM);
  else hash.set(KEY_PARAM, key);
  url.hash = hash.toString();
  history.replaceState(history.state, "", url);
}
