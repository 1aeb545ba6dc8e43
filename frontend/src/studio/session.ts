/**
 * The session this page holds: which one it opens, what session.ready restores, and what
 * happens when the session is lost (unknown to the server, taken over, deleted).
 *
 * Design choices:
 * - `session.open` sends the id the URL asks for, else this browser's last one (none with
 *   `?new`), with its key (session_link.ts). Once ready, the URL shows the session and its key.
 * - session.ready restores the whole scene (the server holds it); this browser's draft of
 *   unconfirmed script edits is read once per page, at the first session.ready, and sent.
 * - A session the server does not know (a new data directory, a mistyped URL) becomes a new
 *   one holding the script the page shows; one taken over by another tab, or deleted, stops
 *   this page until the director reclaims or restores it (the banner's buttons).
 */
import type { ServerMessageOf } from "./protocol";
import { rememberScene, rememberSceneKey, restoreScene } from "./scenes";
import {
  lastSession, loadScene, rememberLastSession, requestedSession, sessionKeyOf, showSessionInUrl, wantsNewScene,
} from "./session_link";
import type { Studio } from "./studio";

export const OFFLINE = "offline: the studio is reconnecting to the server; try again once it is back";

export class StudioSession {
  /** The socket has a session open (session.ready came on this connection). */
  live = false;
  takenOver = false;
  /** The scene this page holds was deleted (scene_deleted): the banner offers to restore it. */
  sceneDeleted = false;
  /** The session the URL asked for, tried once before the one in localStorage. */
  private requested = requestedSession();
  /** `?new` in the URL: open a new scene, not the browser's last one. */
  private wantsNew = wantsNewScene();
  /** The browser's stored draft is read into the scene once per page, at its first session.ready. */
  private draftRead = false;

  constructor(private readonly studio: Studio) {}

  get id(): string | null {
    return this.studio.ready?.session_id ?? this.requested ?? lastSession();
  }

  open(): void {
    this.live = false;
    const id = this.requested ?? (this.wantsNew ? null : lastSession());
    const key = id === null ? null : sessionKeyOf(id);
    this.studio.socket.send({ type: "session.open", ...(id !== null ? { session_id: id } : {}),
                              ...(key !== null ? { session_key: key } : {}), ref: this.studio.nextRef("session") });
  }

  ready(ready: ServerMessageOf<"session.ready">): void {
    const studio = this.studio;
    const stored = this.draftRead ? null : loadScene(ready.session_id);
    this.draftRead = true;
    const key = ready.session_key ?? sessionKeyOf(ready.session_id);
    this.requested = ready.session_id;
    this.wantsNew = false;
    this.sceneDeleted = false;
    rememberLastSession(ready.session_id);
    if (key !== null) rememberSceneKey(ready.session_id, key);
    rememberScene(ready.session_id);
    showSessionInUrl(ready.session_id, key);
    studio.ready = ready;
    this.live = true;
    studio.voice = ready.voice;
    if (ready.voice !== null) studio.voices.set(ready.voice.voice_id, ready.voice);
    for (const member of ready.cast) if (member.voice !== null) studio.voices.set(member.voice.voice_id, member.voice);
    studio.scene.applyReady(ready, stored);
    studio.playback.forgetMissing();
    if (studio.scene.lines.length === 0) studio.scene.addLine("");
    studio.flushScript(); // what was edited offline, or not confirmed before the socket dropped
    studio.saveScene();
    studio.errors.delete("session");
    for (const [target, message] of studio.errors) if (message === OFFLINE) studio.errors.delete(target);
    studio.onChange("session");
    studio.onChange("script");
    studio.onChange("voice");
    void studio.audio.loadWaveforms();
  }

  /** An error about the session itself: handled here (true), or an error to show (false). */
  refused(error: ServerMessageOf<"error">): boolean {
    const studio = this.studio;
    if (error.code === "unknown_session") {
      // The server does not know the session (a new data directory, a mistyped URL): start a
      // fresh one and write the script the page shows into it.
      const old = this.requested ?? lastSession();
      const stored = this.draftRead || old === null ? null : loadScene(old);
      this.draftRead = true;
      if (stored !== null) studio.scene.script.resync([], stored.draft);
      studio.scene.script.rebase();
      this.requested = null;
      rememberLastSession(null);
      this.open();
      return true;
    }
    if (error.code === "session_taken_over") {
      this.takenOver = true;
      studio.onChange("session");
    }
    if (error.code === "scene_deleted") {
      // The socket closes (1000) and does not reconnect: the banner offers Restore.
      this.sceneDeleted = true;
      studio.onChange("session");
      return true;
    }
    return false;
  }

  /** Bring back the deleted scene this page held, and open it again. */
  async restore(): Promise<void> {
    const id = this.id;
    if (id === null) return;
    try {
      await restoreScene(id);
    } catch (error) {
      return this.studio.setError("session", `the scene could not be restored: ${(error as Error).message}`);
    }
    this.sceneDeleted = false;
    this.studio.socket.connect();
    this.studio.onChange("session");
  }

  /** Reconnect after another tab took the session over. */
  reclaim(): void {
    this.takenOver = false;
    this.studio.socket.connect();
    this.studio.onChange("session");
  }
}
