/**
 * The studio's controller: joins the socket, the scene, the session and the playback, and offers the
 * directing actions (take, cancel, keep, drop, play, stop, voice, export) to the UI.
 *
 * - Every `session.open` sends the session's id and key (session_link.ts: the URL and this
 *   browser's storage). The server holds the whole scene, the script included; the browser
 *   keeps only script edits not yet confirmed (an offline draft, sent on the next
 *   session.ready) and what only this page measured.
 * - Script edits go out at once, except text, which goes a moment after typing stops (and
 *   before any take of the line, so the take and the script agree).
 * - Every message that can fail gets a `ref`; an `error` with that ref is shown next to the
 *   control that sent it (a line, the voice panel, a take), others in the status bar.
 * - What plays (a take, A/B, the scene run) is `playback` (playback.ts); a take asked for
 *   from this page plays as it streams.
 * - Offline (the socket is not open with a session): directing actions are refused with a
 *   line of words, the UI disables them and shows a banner; takes that were queued or
 *   streaming are marked interrupted (the server ends them: cancelled when the socket drops,
 *   an error when it restarts), and the player ends the take it was waiting on instead of
 *   rebuffering forever. The socket reconnects by itself and session.ready restores the
 *   scene, so nothing needs a reload.
 * - The UI reads state from here and is told what changed through `onChange`.
 */
import type { PlayerReport } from "../audio/player";
import { Playback } from "./playback";
import {
  takeStart, type CastVoiceSpec, type ClientMessage, type SamplingSpec,
  type ServerMessage, type ServerMessageOf, type VoiceInfo,
} from "./protocol";
import { Scene, type Take } from "./scene";
import { OFFLINE, StudioSession } from "./session";
import { sessionKeyOf, storeScene } from "./session_link";
import { StudioSocket, type ConnectionState } from "./socket";
import { TakeAudio, type WavFile } from "./take_audio";
import { UndoStack, type UndoEntry } from "./undo";

export type Change = "script" | "takes" | "connection" | "voice" | "errors" | "meter" | "session";
/** Where an error is shown: `line:<id>`, `take:<id>`, `voice`, or `session`. */
export type ErrorTarget = string;

/** Text edits wait this long after the last keystroke before they are sent. */
const TEXT_DEBOUNCE_MS = 400;
/** Take audio the page holds at most (~11 minutes at 44.1 kHz, 60 MB); see Scene.trimAudio. */
const AUDIO_BUDGET_SAMPLES = 30_000_000;

export class Studio {
  readonly scene = new Scene();
  readonly audio = new TakeAudio(this.scene, () => this.sampleRate, () => this.onChange("takes"),
                                 (take, message) => this.setError(`take:${take.id}`, message),
                                 () => (this.ready === null ? null : sessionKeyOf(this.ready.session_id)));
  readonly playback: Playback;
  /** The session this page holds (session.ts): opened, resumed, lost, restored. */
  readonly session = new StudioSession(this);
  readonly socket: StudioSocket;
  ready: ServerMessageOf<"session.ready"> | null = null;
  connection: { state: ConnectionState; detail: string } = { state: "connecting", detail: "" };
  voice: VoiceInfo | null = null;
  readonly errors = new Map<ErrorTarget, string>();
  sampling: SamplingSpec = {};
  /** Whether new takes are capped by their line's length (the server's length guard; on by default). */
  lengthGuard = true;
  /** A cast.set or cast.delete is on its way (the cast panel waits for the `cast` reply). */
  castPending = false;
  /** Sampling fields that hold a value the server would refuse (the panel shows each at its field). */
  readonly samplingErrors = new Map<keyof SamplingSpec, string>();
  /** A take the script view scrolls into view once it is drawn (one asked for from this page). */
  revealTakeId: number | null = null;
  /** Every voice this page has seen, by id, to say which voice a take spoke with. */
  readonly voices = new Map<number, VoiceInfo>();
  /** The take Space plays: the one clicked last, else the selected line's latest. */
  selectedTakeId: number | null = null;
  /** The take last asked for from this page, with its first-audio latency once heard. */
  lastLatencyMs: number | null = null;
  /** The last destructive actions, to undo (undo.ts); `notice` is the latest, shown with its Undo button. */
  readonly undoStack = new UndoStack();
  notice: { text: string; undo: boolean; at: number } | null = null;
  /** Takes that were queued or streaming when the connection went. */
  readonly interrupted = new Set<number>();
  onChange: (what: Change) => void = () => {};

  private refCount = 0;
  private readonly refs = new Map<string, ErrorTarget>();
  private readonly pendingTakes = new Map<string, { lineId: string; text: string; requestedAt: number }>();
  private textTimer: number | undefined;

  constructor(url: string, withTap: boolean) {
    this.playback = new Playback(this, withTap);
    this.socket = new StudioSocket(url, {
      open: () => this.session.open(),
      message: (message) => this.receive(message),
      audio: (frame) => {
        const take = this.scene.audio(frame);
        if (take === undefined) return;
        this.playback.push(take.id, frame.pcm, frame.last);
        this.onChange("takes");
      },
      state: (state, detail) => {
        if (state !== "open") this.wentOffline();
        this.connection = { state, detail };
        this.onChange("connection");
      },
    });
  }

  get sessionId(): string | null {
    return this.session.id;
  }

  /** A session is open on a live socket: directing actions can go to the server. */
  get online(): boolean {
    return this.session.live && this.connection.state === "open";
  }

  get sampleRate(): number {
    return this.ready?.sample_rate ?? 44100;
  }

  start(): void {
    this.socket.connect();
  }

  /** The take Space plays on a line: the one clicked last, else the latest with something to play. */
  selectedTakeFor(lineId: string): Take | undefined {
    const chosen = this.selectedTakeId === null ? undefined : this.scene.takes.get(this.selectedTakeId);
    if (chosen?.lineId === lineId && this.playback.playable(chosen)) return chosen;
    return this.scene.takesOf(lineId).filter((t) => this.playback.playable(t)).at(-1);
  }

  /** Takes the script shows: all but those cancelled before any audio (an interrupted one stays, marked). */
  shownTakes(lineId: string): Take[] {
    return this.scene.takesOf(lineId).filter((t) =>
      !(t.phase === "done" && t.finishReason === "cancelled" && t.samples === 0 && !this.interrupted.has(t.id)));
  }

  /** The voice a take spoke with, in words. */
  voiceWords(voiceId: number | null): string {
    if (voiceId === null) return "default voice";
    const voice = this.voices.get(voiceId);
    if (voice === undefined) return `voice ${voiceId}`;
    if (voice.character !== null) return voice.character.name;
    const n = voice.references.length;
    return `${n} clip${n === 1 ? "" : "s"}`;
  }

  // ─── the script ────────────────────────────────────────────────────────────

  /** After an edit of the script: show it, store the draft, and send it (text after a pause). */
  scriptEdited(kind: "text" | "structure"): void {
    this.saveScene();
    this.onChange("script");
    window.clearTimeout(this.textTimer);
    if (kind === "structure") this.flushScript();
    else this.textTimer = window.setTimeout(() => this.flushScript(), TEXT_DEBOUNCE_MS);
  }

  /** Send the script edits not sent yet (nothing while no session is open: they wait). */
  flushScript(): void {
    window.clearTimeout(this.textTimer);
    if (!this.session.live) return;
    const messages = this.scene.script.send((edit) =>
      this.nextRef(edit.kind === "order" ? "session" : `line:${edit.lineId}`));
    for (const message of messages) this.socket.send(message);
  }

  // ─── directing actions ─────────────────────────────────────────────────────

  /** Start a take of a line (a retake if it has takes): it plays as it streams. `lengthGuard`
   * false lets this one take run past the line's length cap. */
  takeLine(lineId: string, lengthGuard = this.lengthGuard): void {
    const line = this.scene.line(lineId);
    if (line === undefined) return;
    this.errors.delete(`line:${lineId}`);
    const text = line.text.trim();
    if (text === "") return this.setError(`line:${lineId}`, "write the line first");
    if (!this.online) return this.setError(`line:${lineId}`, OFFLINE);
    const setting = this.samplingErrors.values().next();
    if (setting.done !== true) return this.setError(`line:${lineId}`, `fix the sampling first: ${setting.value}`);
    void this.playback.ensureAudio();
    this.flushScript(); // the line is on the server, in its place, before its take
    const ref = this.nextRef(`line:${lineId}`);
    // History "kept": the server gives the take the kept takes of the lines above it (what Scene.historyFor shows).
    const sent = this.send(takeStart(lineId, text, { sampling: this.sampling, lengthGuard, ref }));
    if (sent) this.pendingTakes.set(ref, { lineId, text, requestedAt: performance.now() });
    this.saveScene();
    this.onChange("errors");
  }

  cancel(takeId: number): void {
    this.send({ type: "take.cancel", take_id: takeId, ref: this.nextRef(`take:${takeId}`) });
  }

  /** Keep a take: the server makes it its line's kept take, in place of the one before (undoable). */
  keep(takeId: number): void {
    const take = this.scene.takes.get(takeId);
    const replaced = take === undefined ? undefined : this.scene.keptTake(take.lineId);
    if (!this.send({ type: "take.keep", take_id: takeId, ref: this.nextRef(`take:${takeId}`) })) return;
    if (replaced !== undefined && replaced.id !== takeId) {
      this.remember(`Kept take ${this.takeNumber(takeId)} in place of take ${this.takeNumber(replaced.id)}`,
                    () => this.keepAgain(replaced.id));
    }
  }

  /** Drop a take from the directing history (un-keep it); undoable. */
  drop(takeId: number): void {
    const kept = this.scene.takes.get(takeId)?.kept === true;
    if (!this.send({ type: "take.drop", take_id: takeId, ref: this.nextRef(`take:${takeId}`) })) return;
    if (kept) this.remember(`Dropped take ${this.takeNumber(takeId)} from the history`, () => this.keepAgain(takeId));
  }

  /** Delete a line (its takes stay on the server and come back with it); undoable. */
  deleteLine(lineId: string): void {
    const lines = this.scene.lines;
    const at = lines.findIndex((l) => l.id === lineId);
    const line = lines[at];
    if (line === undefined) return;
    const after = at > 0 ? lines[at - 1]!.id : null;
    this.scene.deleteLine(lineId);
    this.scriptEdited("structure");
    const { text, characterId } = line;
    const words = text.length > 30 ? `${text.slice(0, 30)}…` : text;
    this.remember(`Deleted line ${at + 1}${words === "" ? "" : ` “${words}”`}`, () => {
      this.scene.script.restore(lineId, text, after, characterId);
      this.scene.selectedLineId = lineId;
      this.scriptEdited("structure");
      return true;
    });
  }

  // ─── the cast, and notes ───────────────────────────────────────────────────

  /** Add or rename a cast member; with `voice`, give it that voice (errors go to the cast panel). */
  setCastMember(characterId: string, name: string, voice?: CastVoiceSpec): void {
    this.errors.delete("cast");
    if (this.send({ type: "cast.set", character_id: characterId, name, ...(voice !== undefined ? { voice } : {}),
                    ref: this.nextRef("cast") })) this.castPending = true;
    this.onChange("voice");
  }

  removeCastMember(characterId: string): void {
    if (this.send({ type: "cast.delete", character_id: characterId, ref: this.nextRef("cast") })) this.castPending = true;
    this.onChange("voice");
  }

  /** Give a line to a cast member (null: the scene's first). */
  setLineCharacter(lineId: string, characterId: string | null): void {
    this.scene.script.setCharacter(lineId, characterId);
    this.scriptEdited("structure");
  }

  /** The director's note and/or rating of a take. */
  noteTake(takeId: number, change: { note?: string; rating?: number }): void {
    const take = this.scene.takes.get(takeId);
    if (take === undefined) return;
    if (change.note !== undefined) take.note = change.note; // shown at once; take.noted confirms
    if (change.rating !== undefined) take.rating = change.rating;
    this.send({ type: "take.note", take_id: takeId, ...change, ref: this.nextRef(`take:${takeId}`) });
    this.onChange("takes");
  }

  /** The name of the cast member whose take it is (null: none, or no longer in the cast). */
  characterName(characterId: string | null): string | null {
    return this.scene.cast.find((c) => c.character_id === characterId)?.name ?? null;
  }

  /** Undo the last destructive action (Ctrl+Z, or the notice's Undo). */
  undo(): void {
    const done = this.undoStack.undo();
    if (done !== undefined) this.showNotice(`Undone: ${done.label[0]!.toLowerCase()}${done.label.slice(1)}`, false);
  }

  private keepAgain(takeId: number): boolean {
    return this.send({ type: "take.keep", take_id: takeId, ref: this.nextRef(`take:${takeId}`) });
  }

  /** Keep an undoable action (with its notice). */
  remember(label: string, undo: UndoEntry["undo"]): void {
    this.undoStack.push({ label, undo });
    this.showNotice(label, true);
  }

  showNotice(text: string, undo = false): void {
    this.notice = { text, undo, at: performance.now() };
    this.onChange("errors");
  }

  /** A take's number on its line (1, 2, …), as its row shows it. */
  takeNumber(takeId: number): number {
    const take = this.scene.takes.get(takeId);
    return take === undefined ? 0 : this.shownTakes(take.lineId).findIndex((t) => t.id === takeId) + 1;
  }

  /** The take's audio is still coming from the server (after a reload). */
  audioLoading(takeId: number): boolean {
    return this.audio.isFetching(takeId);
  }

  async exportTake(takeId: number): Promise<WavFile | null> {
    const take = this.scene.takes.get(takeId);
    return take === undefined ? null : this.audio.exportTake(take);
  }

  /** The kept take of every line, in script order, with `gapMs` of silence between. */
  async exportScene(gapMs: number): Promise<WavFile | null> {
    const takes = this.scene.keptInScriptOrder();
    if (takes.length === 0) {
      this.setError("session", "keep a take first: the scene export holds the kept take of each line");
      return null;
    }
    return this.audio.exportScene(takes, gapMs, this.sessionId);
  }

  /** Store what the browser keeps of the scene: unconfirmed script edits, selection, heard latencies. */
  saveScene(): void {
    const id = this.ready?.session_id;
    if (id !== undefined) storeScene(id, this.scene.stored());
  }

  clearError(target: ErrorTarget): void {
    if (this.errors.delete(target)) this.onChange("errors");
  }

  // ─── protocol ──────────────────────────────────────────────────────────────

  private receive(message: ServerMessage): void {
    switch (message.type) {
      case "session.ready":
        return this.session.ready(message);
      case "voice.ready":
        this.voice = message.voice;
        if (message.voice !== null) this.voices.set(message.voice.voice_id, message.voice);
        return this.onChange("voice");
      case "script":
        this.scene.scriptReply(message);
        this.saveScene();
        this.onChange("script");
        return this.onChange("takes");
      case "take.queued": {
        const pending = message.ref === null ? undefined : this.pendingTakes.get(message.ref);
        if (message.ref !== null) this.pendingTakes.delete(message.ref);
        const take = this.scene.takeQueued(message, pending?.text ?? "", pending?.requestedAt ?? null);
        if (pending !== undefined) {
          // The take asked for here plays as it streams (replacing whatever played).
          this.playback.playStreaming(take.id);
          this.selectedTakeId = take.id;
          this.revealTakeId = take.id;
        }
        return this.onChange("takes");
      }
      case "take.started":
        this.scene.takeStarted(message);
        return this.onChange("takes");
      case "take.retry": {
        const take = this.scene.takeRetry(message);
        if (take !== undefined) this.playback.restart(take.id);
        this.errors.set(`take:${message.take_id}`, message.message);
        return this.onChange("takes");
      }
      case "take.done": {
        const take = this.scene.takeDone(message);
        if (take !== undefined) this.playback.end(take.id);
        this.scene.trimAudio(AUDIO_BUDGET_SAMPLES);
        if (message.error !== null) this.errors.set(`take:${message.take_id}`, message.error);
        this.onChange("takes");
        return this.onChange("errors");
      }
      case "history":
        this.scene.history(message);
        return this.onChange("takes");
      case "error":
        return this.serverError(message);
      case "cast":
        this.scene.castReply(message);
        for (const member of message.characters) if (member.voice !== null) this.voices.set(member.voice.voice_id, member.voice);
        this.castPending = false;
        this.onChange("voice");
        return this.onChange("script");
      case "take.noted":
        this.scene.noted(message);
        return this.onChange("takes");
      case "pong":
        return;
    }
  }

  private serverError(error: ServerMessageOf<"error">): void {
    if (this.session.refused(error)) return;
    const fromRef = error.ref === null ? undefined : this.refs.get(error.ref);
    let target = fromRef ?? (error.take_id !== null ? `take:${error.take_id}` : "session");
    const edit = error.ref === null ? undefined : this.scene.scriptRefused(error.ref);
    if (edit !== undefined) {
      // The refused edit is undone on screen; its error goes to its line if the line is still there.
      if (edit.kind === "order" || this.scene.line(edit.lineId) === undefined) target = "session";
      this.saveScene();
      this.onChange("script");
    }
    if (target === "cast") this.castPending = false;
    const retry = error.retry_after_ms === null ? "" : ` (retry in ${(error.retry_after_ms / 1000).toFixed(1)} s)`;
    this.setError(target, `${error.message}${retry}`);
    this.onChange("voice");
  }

  /** The player reported (playback.ts): the first audio heard of a take asked for here is its latency. */
  heard(report: PlayerReport): void {
    const take = this.scene.takes.get(report.takeId);
    if (take !== undefined && report.firstHeardAt !== null && take.requestedAt !== null && take.heardLatencyMs === null) {
      take.heardLatencyMs = report.firstHeardAt - take.requestedAt;
      this.lastLatencyMs = take.heardLatencyMs;
      this.saveScene();
      this.onChange("takes");
    }
    this.onChange("meter");
  }

  private send(message: ClientMessage): boolean {
    if (this.online && this.socket.send(message)) return true;
    this.setError("session", OFFLINE);
    return false;
  }

  /** The socket is not open: mark what was in flight, and let the player finish what it has. */
  private wentOffline(): void {
    this.session.live = false;
    for (const take of this.scene.takes.values()) if (take.phase !== "done") this.interrupted.add(take.id);
    const playing = this.playback.playingTakeId === null ? undefined : this.scene.takes.get(this.playback.playingTakeId);
    if (playing !== undefined && playing.phase !== "done") this.playback.end(playing.id);
    this.pendingTakes.clear();
    this.onChange("takes");
  }

  nextRef(target: ErrorTarget): string {
    const ref = `r${++this.refCount}`;
    this.refs.set(ref, target);
    return ref;
  }

  setError(target: ErrorTarget, message: string): void {
    this.errors.set(target, message);
    this.onChange("errors");
  }
}
