/**
 * The scene as the studio sees it: the script (lines in order, script.ts), every
 * take with its audio, and which takes are kept. Pure state with no DOM and no socket, so it is
 * tested in Node.
 *
 * Directing history: the server's, shown as it says it (docs/protocol.md §2.1).
 * - The server keeps every kept take of the script in script order (`serverHistory`), and says
 *   how many of them a new take of each line hears (`serverHears`): a take of line L hears
 *   the kept takes of the lines above L. `historyFor` shows that; the page never works it out.
 * - A line has at most one kept take, and the server enforces it: a keep un-keeps the line's
 *   other kept take, which the reply names (`unkept`).
 * - Takes of a deleted line stay on the server (exportable) but leave the history; the page
 *   does not show them.
 */
import type { AudioFrame } from "../shared/wire";
import type { CastInfo, FinishReason, SamplingInfo, ServerMessageOf, TakeInfo, Timings } from "./protocol";
import { Script, type Line, type ScriptEdit } from "./script";
import { Peaks } from "./waveform";

export type { Line } from "./script";

export type TakePhase = "queued" | "running" | "done";

export interface Take {
  id: number;
  lineId: string;
  text: string;
  phase: TakePhase;
  queuePosition: number;
  finishReason: FinishReason | null;
  error: string | null;
  timings: Timings;
  frames: number;
  /** Samples the server says the take has (known at take.done). */
  samples: number;
  attempts: number;
  kept: boolean;
  /** The takes this take was conditioned on, and those dropped for length. */
  history: number[];
  dropped: number[];
  sampling: SamplingInfo | null;
  /** The voice it speaks with (null: the engine's default). */
  voiceId: number | null;
  /** The cast member whose take it is (null: no cast). */
  characterId: string | null;
  note: string;
  /** 1..5; 0 not rated. */
  rating: number;
  /** The length guard's cap on its frames (null: it did not bind). */
  guardFrames: number | null;
  audioUrl: string | null;
  /** PCM windows as they arrived (of the current attempt). */
  windows: Int16Array[];
  received: number;
  peaks: Peaks;
  /** performance.now() of the click that asked for it; null for takes from before a reload. */
  requestedAt: number | null;
  /** Click to first sample out of the speaker, measured by the page. */
  heardLatencyMs: number | null;
  /** A problem with the take's audio stream noticed by the page (gap, short take). */
  streamProblem: string | null;
}

/** What the browser keeps of a session (localStorage, by session id). */
export interface StoredScene {
  /** Script edits the server had not confirmed when the page last saved (an offline draft). */
  draft: ScriptEdit[];
  selectedLineId: string | null;
  /** First-audio latency as heard, by take id: only this page measured it. */
  heard?: Record<string, number>;
}

/** What older studios stored: the whole script. Read once, and sent to the server as edits. */
interface LegacyStoredScript {
  lines: Line[];
  selectedLineId: string | null;
  heard?: Record<string, number>;
  deleted?: string[];
}

/** A stored scene, from this studio or an older one (which kept the whole script here). */
export function readStoredScene(value: unknown): StoredScene | null {
  if (typeof value !== "object" || value === null) return null;
  const stored = value as Partial<StoredScene> & Partial<LegacyStoredScript>;
  const selectedLineId = typeof stored.selectedLineId === "string" ? stored.selectedLineId : null;
  const heard = stored.heard ?? {};
  if (Array.isArray(stored.draft)) return { draft: stored.draft, selectedLineId, heard };
  if (!Array.isArray(stored.lines)) return null;
  // Its lines become edits in its order (those the server has get this page's text), then its deletions.
  const lines = stored.lines.filter((l) => typeof l?.id === "string" && typeof l.text === "string");
  const draft: ScriptEdit[] = lines.map((l) => ({ kind: "set", lineId: l.id, text: l.text }));
  if (lines.length > 0) draft.push({ kind: "order", lineIds: lines.map((l) => l.id) });
  for (const id of stored.deleted ?? []) draft.push({ kind: "delete", lineId: id });
  return { draft, selectedLineId, heard };
}

/** Scene order: the order in which the model hears kept takes. */
export type History = number[];

export class Scene {
  readonly script = new Script();
  readonly takes = new Map<number, Take>();
  /** The scene's characters, in cast order (the server's). */
  cast: CastInfo[] = [];
  /** The scene's name ("" unnamed). */
  name = "";
  selectedLineId: string | null = null;
  /** Every kept take of the script in script order, as the server last said (session.ready, history, script). */
  serverHistory: number[] = [];
  /** Line id -> how many of `serverHistory` (its first ones) a new take of the line hears, as the server said. */
  serverHears: Record<string, number> = {};

  // ─── the script ──────────────────────────────────────────────────────────

  get lines(): readonly Line[] {
    return this.script.lines;
  }

  line(id: string): Line | undefined {
    return this.script.line(id);
  }

  addLine(text = "", after: string | null = this.selectedLineId, characterId?: string | null): Line {
    const line = this.script.add(text, after, characterId);
    this.selectedLineId = line.id;
    return line;
  }

  editLine(id: string, text: string): void {
    this.script.setText(id, text);
  }

  /** Move a line up (-1) or down (+1); false at either end. */
  moveLine(id: string, delta: -1 | 1): boolean {
    return this.script.move(id, delta);
  }

  /** Remove a line from the script (its takes stay on the server, out of the history). */
  deleteLine(id: string): void {
    const at = this.lines.findIndex((l) => l.id === id);
    if (at < 0) return;
    this.script.delete(id);
    if (this.selectedLineId === id) this.selectedLineId = this.lines[Math.min(at, this.lines.length - 1)]?.id ?? null;
  }

  /** The server's script, in reply to a line message (or not). */
  scriptReply(message: ServerMessageOf<"script">): void {
    this.script.confirm(message.lines, message.ref);
    this.markKept(message.history, message.hears);
    this.keepSelection();
  }

  /** The server refused the script edit sent with `ref`; returns it (undefined: not a script edit). */
  scriptRefused(ref: string): ScriptEdit | undefined {
    const edit = this.script.refused(ref);
    if (edit !== undefined) this.keepSelection();
    return edit;
  }

  private keepSelection(): void {
    if (this.selectedLineId === null || this.line(this.selectedLineId) === undefined) {
      this.selectedLineId = this.lines[0]?.id ?? null;
    }
  }

  selectRelative(delta: number): void {
    const at = this.lines.findIndex((l) => l.id === this.selectedLineId);
    const next = this.lines[Math.max(0, Math.min(this.lines.length - 1, at + delta))];
    if (next !== undefined) this.selectedLineId = next.id;
  }

  // ─── the cast ────────────────────────────────────────────────────────────

  /** The member who says the line: its own, else the cast's first; undefined without a cast. */
  characterOf(lineId: string): CastInfo | undefined {
    const chosen = this.line(lineId)?.characterId ?? null;
    return this.cast.find((c) => c.character_id === chosen) ?? this.cast[0];
  }

  castReply(message: ServerMessageOf<"cast">): void {
    this.cast = [...message.characters];
  }

  noted(message: ServerMessageOf<"take.noted">): void {
    const take = this.takes.get(message.take_id);
    if (take === undefined) return;
    take.note = message.note;
    take.rating = message.rating;
  }

  // ─── takes and history ───────────────────────────────────────────────────

  takesOf(lineId: string): Take[] {
    return [...this.takes.values()].filter((t) => t.lineId === lineId).sort((a, b) => a.id - b.id);
  }

  latestTake(lineId: string): Take | undefined {
    return this.takesOf(lineId).at(-1);
  }

  keptTake(lineId: string): Take | undefined {
    return this.takesOf(lineId).filter((t) => t.kept).at(-1);
  }

  /** What a new take of `lineId` will hear, as the server said; null for a line the server has not placed yet. */
  historyFor(lineId: string): History | null {
    const hears = this.serverHears[lineId];
    return hears === undefined ? null : this.serverHistory.slice(0, hears);
  }

  /** Every kept take in scene order (script order, then take id), as the server said: what the export holds. */
  keptInScriptOrder(): Take[] {
    return this.serverHistory.flatMap((id) => this.takes.get(id) ?? []);
  }

  // ─── server messages ─────────────────────────────────────────────────────

  /**
   * Rebuild from session.ready: the server's script, with this page's unconfirmed edits (and
   * those of `stored`, the browser's draft from before a reload) on top, to be sent again.
   */
  applyReady(ready: ServerMessageOf<"session.ready">, stored: StoredScene | null): void {
    this.script.resync(ready.lines, stored?.draft ?? []);
    this.cast = [...ready.cast];
    this.name = ready.name;
    const previous = this.takes;
    const fresh = new Map<number, Take>();
    for (const info of ready.takes) {
      const before = previous.get(info.take_id);
      const take = fromInfo(info);
      // Keep audio that is already here (a reconnect, not a reload), if it is the whole take.
      if (before !== undefined && info.state === "done" && before.received === info.samples) {
        take.windows = before.windows;
        take.received = before.received;
        take.peaks = before.peaks;
        take.requestedAt = before.requestedAt;
        take.heardLatencyMs = before.heardLatencyMs;
      }
      take.heardLatencyMs ??= stored?.heard?.[String(info.take_id)] ?? null;
      fresh.set(info.take_id, take);
    }
    this.takes.clear();
    for (const [id, take] of fresh) this.takes.set(id, take);
    this.serverHistory = [...ready.history];
    this.serverHears = { ...ready.hears };
    this.selectedLineId ??= stored?.selectedLineId ?? null;
    this.keepSelection();
  }

  takeQueued(message: ServerMessageOf<"take.queued">, text: string, requestedAt: number | null): Take {
    const take = blankTake(message.take_id, message.line_id, text);
    take.queuePosition = message.position;
    take.audioUrl = message.audio_url;
    take.sampling = message.sampling;
    take.voiceId = message.voice_id;
    take.characterId = message.character_id;
    take.guardFrames = message.guard_frames;
    take.requestedAt = requestedAt;
    this.takes.set(take.id, take);
    return take;
  }

  takeStarted(message: ServerMessageOf<"take.started">): Take | undefined {
    const take = this.takes.get(message.take_id);
    if (take === undefined) return undefined;
    take.phase = "running";
    take.attempts = message.attempt;
    take.sampling = message.sampling;
    return take;
  }

  /** A silent attempt is retried from sample 0: what arrived for the take is thrown away. */
  takeRetry(message: ServerMessageOf<"take.retry">): Take | undefined {
    const take = this.takes.get(message.take_id);
    if (take === undefined) return undefined;
    take.attempts = message.attempt;
    clearAudio(take);
    return take;
  }

  /** Append a window; returns the take, or undefined for a take this scene does not know. */
  audio(frame: AudioFrame): Take | undefined {
    const take = this.takes.get(frame.take_id);
    if (take === undefined) return undefined;
    if (frame.start_sample !== take.received) {
      take.streamProblem = `window ${frame.seq} starts at sample ${frame.start_sample}, expected ${take.received}`;
    }
    take.windows.push(frame.pcm);
    take.received += frame.pcm.length;
    take.peaks.add(frame.pcm);
    return take;
  }

  takeDone(message: ServerMessageOf<"take.done">): Take | undefined {
    const take = this.takes.get(message.take_id);
    if (take === undefined) return undefined;
    take.phase = "done";
    take.finishReason = message.finish_reason;
    take.timings = message.timings;
    take.frames = message.frames;
    take.samples = message.samples;
    take.attempts = message.attempts;
    take.audioUrl = message.audio_url;
    take.error = message.error;
    if (take.received !== message.samples && take.streamProblem === null) {
      take.streamProblem = `received ${take.received} of ${message.samples} samples`;
    }
    return take;
  }

  history(message: ServerMessageOf<"history">): void {
    if (message.take_id !== null) {
      const take = this.takes.get(message.take_id);
      if (take !== undefined) {
        take.history = [...message.take_ids];
        take.dropped = [...message.dropped];
      }
      return;
    }
    this.markKept(message.take_ids, message.hears ?? {});
    for (const id of message.unkept) {
      const take = this.takes.get(id);
      if (take !== undefined) take.kept = false; // a keep replaced it (also a take of a deleted line)
    }
  }

  /** The server's kept takes of the script: takes of deleted lines keep their flag (they return with the line). */
  private markKept(history: readonly number[], hears: Record<string, number>): void {
    this.serverHistory = [...history];
    this.serverHears = { ...hears };
    const kept = new Set(history);
    for (const take of this.takes.values()) if (this.line(take.lineId) !== undefined) take.kept = kept.has(take.id);
  }

  /** The take's whole audio, when the page holds all of it. */
  pcmOf(take: Take): Int16Array | null {
    if (take.phase !== "done" || take.received !== take.samples) return null;
    const out = new Int16Array(take.received);
    let at = 0;
    for (const w of take.windows) (out.set(w, at), (at += w.length));
    return out;
  }

  /**
   * Keep at most `budget` samples of take audio in the page: past it, the audio of the
   * oldest takes that are neither kept nor the latest of their line is let go (their
   * waveforms stay; playing or exporting one fetches it again from the server).
   */
  trimAudio(budget: number): void {
    let held = 0;
    for (const take of this.takes.values()) held += take.received;
    const spare = [...this.takes.values()]
      .filter((t) => t.phase === "done" && !t.kept && t.received > 0 && this.latestTake(t.lineId) !== t)
      .sort((a, b) => a.id - b.id);
    for (const take of spare) {
      if (held <= budget) break;
      held -= take.received;
      take.windows = [];
      take.received = 0;
    }
  }

  /** Install audio fetched from the server's WAV export (after a reload). */
  setAudio(take: Take, pcm: Int16Array): void {
    clearAudio(take);
    take.windows = [pcm];
    take.received = pcm.length;
    take.peaks.add(pcm);
  }

  stored(): StoredScene {
    const heard: Record<string, number> = {};
    for (const take of this.takes.values()) if (take.heardLatencyMs !== null) heard[String(take.id)] = take.heardLatencyMs;
    return { draft: this.script.draft, selectedLineId: this.selectedLineId, heard };
  }
}

function clearAudio(take: Take): void {
  take.windows = [];
  take.received = 0;
  take.peaks.reset();
  take.streamProblem = null;
}

function blankTake(id: number, lineId: string, text: string): Take {
  return {
    id, lineId, text, phase: "queued", queuePosition: 0, finishReason: null, error: null, timings: {},
    frames: 0, samples: 0, attempts: 1, kept: false, history: [], dropped: [], sampling: null, voiceId: null, characterId: null, note: "",
    rating: 0, guardFrames: null, audioUrl: null,
    windows: [], received: 0, peaks: new Peaks(), requestedAt: null, heardLatencyMs: null, streamProblem: null,
  };
}

function fromInfo(info: TakeInfo): Take {
  const take = blankTake(info.take_id, info.line_id, info.text);
  take.phase = info.state;
  take.finishReason = info.finish_reason;
  take.error = info.error;
  take.timings = info.timings;
  take.frames = info.frames;
  take.samples = info.samples;
  take.attempts = info.attempts;
  take.kept = info.kept;
  take.history = [...info.history];
  take.dropped = [...info.dropped];
  take.sampling = info.sampling;
  take.voiceId = info.voice_id;
  take.characterId = info.character_id;
  take.note = info.note;
  take.rating = info.rating;
  take.guardFrames = info.guard_frames;
  take.audioUrl = info.audio_url;
  return take;
}
