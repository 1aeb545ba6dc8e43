/**
 * The studio's controller: joins the socket, the scene and the player, and offers the
 * directing actions (take, cancel, keep, drop, play, stop, voice, export) to the UI.
 *
 * - The session's id is in the page's URL (`?session=`) and in localStorage, and is sent with
 *   every `session.open` with the session's key, which the server gave when it made the
 *   session: kept in localStorage and in the URL's fragment (`#key=`, which browsers never
 *   send to a server), so a reload, a reconnect, or the same URL in another browser resumes
 *   the scene, and the id alone (in export URLs and server logs) opens nothing. The server holds the whole scene, the script included; the browser keeps only
 *   script edits not yet confirmed (an offline draft, sent on the next session.ready) and
 *   what only this page measured.
 * - Script edits go out at once, except text, which goes a moment after typing stops (and
 *   before any take of the line, so the take and the script agree).
 * - Every message that can fail gets a `ref`; an `error` with that ref is shown next to the
 *   control that sent it (a line, the voice panel, a take), others in the status bar.
 * - A take asked for from this page plays as it streams; replays come from the PCM the page
 *   kept (or, after a reload, from the server's WAV export of the take).
 * - Offline (the socket is not open with a session): directing actions are refused with a
 *   line of words, the UI disables them and shows a banner; takes that were queued or
 *   streaming are marked interrupted (the server ends them: cancelled when the socket drops,
 *   an error when it restarts), and the player ends the take it was waiting on instead of
 *   rebuffering forever. The socket reconnects by itself and session.ready restores the
 *   scene, so nothing needs a reload.
 * - The UI reads state from here and is told what changed through `onChange`.
 */
import { Player, type PlayerReport } from "../audio/player";
import { SceneRun } from "./scene_run";
import {
  takeStart, type CastVoiceSpec, type ClientMessage, type SamplingSpec,
  type ServerMessage, type ServerMessageOf, type VoiceInfo,
} from "./protocol";
import { Scene, readStoredScene, type StoredScene, type Take } from "./scene";
import { StudioSocket, type ConnectionState } from "./socket";
import { TakeAudio, type WavFile } from "./take_audio";
import { UndoStack, type UndoEntry } from "./undo";
import { rememberScene, rememberSceneKey, restoreScene, sceneKey as storedSceneKey } from "./scenes";

export type Change = "script" | "takes" | "connection" | "voice" | "errors" | "meter" | "session";
/** Where an error is shown: `line:<id>`, `take:<id>`, `voice`, or `session`. */
export type ErrorTarget = string;

const SESSION_KEY = "retake.session";
const SESSION_PARAM = "session";
const NEW_PARAM = "new";
const KEY_PARAM = "key";
/** Text edits wait this long after the last keystroke before they are sent. */
const TEXT_DEBOUNCE_MS = 400;
/** Take audio the page holds at most (~11 minutes at 44.1 kHz, 60 MB); see Scene.trimAudio. */
const AUDIO_BUDGET_SAMPLES = 30_000_000;
const sceneKey = (sessionId: string): string => `retake.script.${sessionId}`;
const OFFLINE = "offline: the studio is reconnecting to the server; try again once it is back";

export class Studio {
  readonly scene = new Scene();
  private readonly audio = new TakeAudio(this.scene, () => this.sampleRate, () => this.onChange("takes"),
                                         (take, message) => this.setError(`take:${take.id}`, message),
                                         () => (this.ready === null ? null : this.keyOf(this.ready.session_id)));
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
  playingTakeId: number | null = null;
  /** Where in the playing take playback started (an A/B switch starts mid-take). */
  private playOffset = 0;
  /** Two takes of one line to compare: A, then B; `compareTakes` plays one from where the other was. */
  compare: { lineId: string; a: number; b: number | null } | null = null;
  /** A take the script view scrolls into view once it is drawn (one asked for from this page). */
  revealTakeId: number | null = null;
  /** Every voice this page has seen, by id, to say which voice a take spoke with. */
  readonly voices = new Map<number, VoiceInfo>();
  /** The take Space plays: the one clicked last, else the selected line's latest. */
  selectedTakeId: number | null = null;
  /** The take last asked for from this page, with its first-audio latency once heard. */
  lastLatencyMs: number | null = null;
  report: PlayerReport | null = null;
  /** The scene playing from its first kept take to its last (Play scene); null when none. */
  run: SceneRun | null = null;
  takenOver = false;
  /** The last destructive actions, to undo (undo.ts); `notice` is the latest, shown with its Undo button. */
  readonly undoStack = new UndoStack();
  notice: { text: string; undo: boolean; at: number } | null = null;
  /** Takes that were queued or streaming when the connection went. */
  readonly interrupted = new Set<number>();
  onChange: (what: Change) => void = () => {};

  private player: Player | null = null;
  private playerLoading: Promise<Player> | null = null;
  private refCount = 0;
  private readonly refs = new Map<string, ErrorTarget>();
  private readonly pendingTakes = new Map<string, { lineId: string; text: string; requestedAt: number }>();
  /** The socket has a session open (session.ready came on this connection). */
  private live = false;
  /** The session the URL asked for, tried once before the one in localStorage. */
  private requestedSession = new URLSearchParams(location.search).get(SESSION_PARAM);
  /** `?new` in the URL: open a new scene, not the browser's last one. */
  private wantsNew = new URLSearchParams(location.search).has(NEW_PARAM);
  /** The scene this page holds was deleted (scene_deleted): the banner offers to restore it. */
  sceneDeleted = false;
  /** The browser's stored draft is read into the scene once per page, at its first session.ready. */
  private draftRead = false;
  private textTimer: number | undefined;

  constructor(url: string, private readonly withTap: boolean) {
    this.socket = new StudioSocket(url, {
      open: () => this.openSession(),
      message: (message) => this.receive(message),
      audio: (frame) => {
        const take = this.scene.audio(frame);
        if (take === undefined) return;
        if (take.id === this.playingTakeId) this.player?.push(take.id, frame.pcm, frame.last);
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
    return this.ready?.session_id ?? this.requestedSession ?? localStorage.getItem(SESSION_KEY);
  }

  /** A session is open on a live socket: directing actions can go to the server. */
  get online(): boolean {
    return this.live && this.connection.state === "open";
  }

  get sampleRate(): number {
    return this.ready?.sample_rate ?? 44100;
  }

  start(): void {
    this.socket.connect();
  }

  /** Create the AudioContext: call from a click or key handler (autoplay policy). */
  ensureAudio(): Promise<Player> {
    // A context can be suspended again (the OS took the device, a background tab): resume it.
    if (this.player !== null && this.player.context.state === "suspended") void this.player.context.resume();
    if (this.playerLoading === null) {
      this.playerLoading = Player.create(this.sampleRate, this.withTap).then((player) => {
        this.player = player;
        player.onReport = (report) => this.onReport(report);
        // Anything that started while the worklet loaded plays from its first window.
        const take = this.playingTakeId === null ? undefined : this.scene.takes.get(this.playingTakeId);
        if (take !== undefined) player.play(take.id, take.windows, take.phase === "done", this.playOffset);
        return player;
      });
      this.playerLoading.catch((error: unknown) => this.setError("session", `audio could not start: ${String(error)}`));
    }
    return this.playerLoading;
  }

  /** The take Space plays on a line: the one clicked last, else the latest with something to play. */
  selectedTakeFor(lineId: string): Take | undefined {
    const chosen = this.selectedTakeId === null ? undefined : this.scene.takes.get(this.selectedTakeId);
    if (chosen?.lineId === lineId && this.playable(chosen)) return chosen;
    return this.scene.takesOf(lineId).filter((t) => this.playable(t)).at(-1);
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

  get audioPlayer(): Player | null {
    return this.player;
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
    if (!this.live) return;
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
    void this.ensureAudio();
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
  private takeNumber(takeId: number): number {
    const take = this.scene.takes.get(takeId);
    return take === undefined ? 0 : this.shownTakes(take.lineId).findIndex((t) => t.id === takeId) + 1;
  }

  /** The take's audio is still coming from the server (after a reload). */
  audioLoading(takeId: number): boolean {
    return this.audio.isFetching(takeId);
  }

  /** A take has something to play: it is streaming, or it ended with audio. */
  playable(take: Take): boolean {
    return take.phase !== "done" || take.samples > 0;
  }

  /** Play a take from `fromSample`; anything but the scene run (`run`) playing ends the run. */
  async play(takeId: number, fromSample = 0, run: SceneRun | null = null): Promise<void> {
    const take = this.scene.takes.get(takeId);
    if (take === undefined || !this.playable(take)) return;
    if (run !== this.run) this.endRun(this.run);
    const loading = this.ensureAudio();
    this.playingTakeId = takeId;
    this.playOffset = fromSample;
    this.onChange("takes");
    if (take.phase === "done" && this.scene.pcmOf(take) === null) {
      const pcm = await this.audio.fetch(take);
      if (pcm === null || this.playingTakeId !== takeId) return;
    }
    const player = await loading;
    if (this.playingTakeId !== takeId) return;
    player.play(takeId, take.windows, take.phase === "done", fromSample);
  }

  /** The sample of `takeId` being heard now; null when it is not the take playing. */
  playheadOf(takeId: number): number | null {
    const r = this.report;
    if (this.playingTakeId !== takeId || r === null || r.takeId !== takeId) return null;
    return this.playOffset + r.rendered;
  }

  // ─── comparing two takes ───────────────────────────────────────────────────

  /** Mark a take for A/B: the first marked is A, the next of the same line B; marking one again unmarks it. */
  markCompare(takeId: number): void {
    const take = this.scene.takes.get(takeId);
    if (take === undefined) return;
    const c = this.compare;
    if (c === null || c.lineId !== take.lineId) this.compare = { lineId: take.lineId, a: takeId, b: null };
    else if (c.a === takeId) this.compare = c.b === null ? null : { lineId: c.lineId, a: c.b, b: null };
    else if (c.b === takeId) this.compare = { ...c, b: null };
    else this.compare = { ...c, b: takeId };
    this.onChange("takes");
  }

  compareSide(takeId: number): "A" | "B" | null {
    return this.compare?.a === takeId ? "A" : this.compare?.b === takeId ? "B" : null;
  }

  /**
   * Play side A or B of the comparison (no side: the other one) from where the one playing
   * is now, so the same moment of both takes is heard back to back.
   */
  compareTakes(side?: "A" | "B"): void {
    const c = this.compare;
    if (c === null || c.b === null) return;
    const playingSide = this.playingTakeId === null ? null : this.compareSide(this.playingTakeId);
    const to = side ?? (playingSide === "A" ? "B" : "A");
    const takeId = to === "A" ? c.a : c.b;
    const take = this.scene.takes.get(takeId);
    if (take === undefined) return;
    const here = playingSide === null || !this.isSounding(this.playingTakeId!) ? 0 : this.playheadOf(this.playingTakeId!) ?? 0;
    const length = take.phase === "done" ? take.samples : take.received;
    this.selectedTakeId = takeId;
    void this.play(takeId, here < length ? here : 0);
  }

  /** Play the kept take of every line in script order, `gapMs` apart (scene_run.ts). */
  playScene(gapMs: number): void {
    const takes = this.scene.keptInScriptOrder().filter((t) => t.samples > 0);
    if (takes.length === 0) return this.setError("session", "keep a take first: the scene plays the kept take of each line");
    this.endRun(this.run);
    this.run = new SceneRun(this, takes.map((t) => t.id), gapMs);
    this.run.start();
    this.onChange("takes");
  }

  /** The scene run is over (or stopped): forget it. */
  endRun(run: SceneRun | null): void {
    if (run === null || run !== this.run) return;
    run.stop();
    this.run = null;
    this.onChange("takes");
  }

  stop(): void {
    this.endRun(this.run);
    this.player?.stop();
    this.playingTakeId = null;
    this.onChange("takes");
  }

  /** The take is playing, or waiting for its audio to play. */
  isSounding(takeId: number): boolean {
    const r = this.report;
    return this.playingTakeId === takeId && r !== null && r.takeId === takeId
      && (r.stateName === "playing" || r.stateName === "waiting" || r.stateName === "rebuffering");
  }

  togglePlay(takeId: number): void {
    if (this.isSounding(takeId)) this.stop();
    else void this.play(takeId);
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

  /** Bring back the deleted scene this page held, and open it again. */
  async restoreScene(): Promise<void> {
    const id = this.sessionId;
    if (id === null) return;
    try {
      await restoreScene(id);
    } catch (error) {
      return this.setError("session", `the scene could not be restored: ${(error as Error).message}`);
    }
    this.sceneDeleted = false;
    this.socket.connect();
    this.onChange("session");
  }

  /** Reconnect after another tab took the session over. */
  reclaim(): void {
    this.takenOver = false;
    this.socket.connect();
    this.onChange("session");
  }

  /** Store what the browser keeps of the scene: unconfirmed script edits, selection, heard latencies. */
  saveScene(): void {
    const id = this.ready?.session_id;
    if (id !== undefined) localStorage.setItem(sceneKey(id), JSON.stringify(this.scene.stored()));
  }

  clearError(target: ErrorTarget): void {
    if (this.errors.delete(target)) this.onChange("errors");
  }

  // ─── protocol ──────────────────────────────────────────────────────────────

  private openSession(): void {
    this.live = false;
    const id = this.requestedSession ?? (this.wantsNew ? null : localStorage.getItem(SESSION_KEY));
    const key = id === null ? null : this.keyOf(id);
    this.socket.send({ type: "session.open", ...(id !== null ? { session_id: id } : {}), ...(key !== null ? { session_key: key } : {}),
                       ref: this.nextRef("session") });
  }

  /** The session's key: from the URL's fragment (a link to the scene) or this browser's storage. */
  private keyOf(sessionId: string): string | null {
    const fromUrl = new URLSearchParams(location.hash.slice(1)).get(KEY_PARAM);
    if (fromUrl !== null && new URLSearchParams(location.search).get(SESSION_PARAM) === sessionId) return fromUrl;
    return storedSceneKey(sessionId);
  }

  private receive(message: ServerMessage): void {
    switch (message.type) {
      case "session.ready":
        return this.sessionReady(message);
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
          this.playingTakeId = take.id;
          this.playOffset = 0;
          this.selectedTakeId = take.id;
          this.revealTakeId = take.id;
          this.player?.play(take.id, [], false);
        }
        return this.onChange("takes");
      }
      case "take.started":
        this.scene.takeStarted(message);
        return this.onChange("takes");
      case "take.retry": {
        const take = this.scene.takeRetry(message);
        if (take !== undefined && take.id === this.playingTakeId) this.player?.play(take.id, [], false);
        this.errors.set(`take:${message.take_id}`, message.message);
        return this.onChange("takes");
      }
      case "take.done": {
        const take = this.scene.takeDone(message);
        if (take !== undefined && take.id === this.playingTakeId) this.player?.end(take.id);
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

  private sessionReady(ready: ServerMessageOf<"session.ready">): void {
    const stored = this.draftRead ? null : this.loadScene(ready.session_id);
    this.draftRead = true;
    const key = ready.session_key ?? this.keyOf(ready.session_id);
    this.requestedSession = ready.session_id;
    this.wantsNew = false;
    this.sceneDeleted = false;
    localStorage.setItem(SESSION_KEY, ready.session_id);
    if (key !== null) rememberSceneKey(ready.session_id, key);
    rememberScene(ready.session_id);
    this.showSessionInUrl(ready.session_id, key);
    this.ready = ready;
    this.live = true;
    this.voice = ready.voice;
    if (ready.voice !== null) this.voices.set(ready.voice.voice_id, ready.voice);
    for (const member of ready.cast) if (member.voice !== null) this.voices.set(member.voice.voice_id, member.voice);
    this.scene.applyReady(ready, stored);
    if (this.compare !== null && ![this.compare.a, this.compare.b].every((id) => id === null || this.scene.takes.has(id))) {
      this.compare = null;
    }
    if (this.scene.lines.length === 0) this.scene.addLine("");
    this.flushScript(); // what was edited offline, or not confirmed before the socket dropped
    this.saveScene();
    this.errors.delete("session");
    for (const [target, message] of this.errors) if (message === OFFLINE) this.errors.delete(target);
    this.onChange("session");
    this.onChange("script");
    this.onChange("voice");
    void this.audio.loadWaveforms();
  }

  private serverError(error: ServerMessageOf<"error">): void {
    if (error.code === "unknown_session") {
      // The server does not know the session (a new data directory, a mistyped URL): start a
      // fresh one and write the script the page shows into it.
      const old = this.requestedSession ?? localStorage.getItem(SESSION_KEY);
      const stored = this.draftRead || old === null ? null : this.loadScene(old);
      this.draftRead = true;
      if (stored !== null) this.scene.script.resync([], stored.draft);
      this.scene.script.rebase();
      this.requestedSession = null;
      localStorage.removeItem(SESSION_KEY);
      this.openSession();
      return;
    }
    if (error.code === "session_taken_over") {
      this.takenOver = true;
      this.onChange("session");
    }
    if (error.code === "scene_deleted") {
      // The socket closes (1000) and does not reconnect: the banner offers Restore.
      this.sceneDeleted = true;
      return this.onChange("session");
    }
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

  private onReport(report: PlayerReport): void {
    this.report = report;
    this.run?.report(report);
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
    this.live = false;
    for (const take of this.scene.takes.values()) if (take.phase !== "done") this.interrupted.add(take.id);
    const playing = this.playingTakeId === null ? undefined : this.scene.takes.get(this.playingTakeId);
    if (playing !== undefined && playing.phase !== "done") this.player?.end(playing.id);
    this.pendingTakes.clear();
    this.onChange("takes");
  }

  private nextRef(target: ErrorTarget): string {
    const ref = `r${++this.refCount}`;
    this.refs.set(ref, target);
    return ref;
  }

  private setError(target: ErrorTarget, message: string): void {
    this.errors.set(target, message);
    this.onChange("errors");
  }

  private loadScene(sessionId: string): StoredScene | null {
    const text = localStorage.getItem(sceneKey(sessionId));
    if (text === null) return null;
    try {
      return readStoredScene(JSON.parse(text));
    } catch {
      return null;
    }
  }

  /** Put the session in the address bar (its key after #), so the URL opens this scene in any browser. */
  private showSessionInUrl(sessionId: string, key: string | null): void {
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
}
