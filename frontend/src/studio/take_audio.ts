/**
 * The audio of finished takes: from the page's memory, or fetched once from the server's
 * WAV export of the take, and the WAV files the studio downloads (a take, the scene).
 *
 * - A take heard on this page keeps its streamed PCM in the scene; after a reload the
 *   audio comes from `take.audioUrl` (the audio the server kept when the take ended), fetched
 *   at most once at a time per take, with the session's key in a header (the server's token,
 *   if any, goes in the cookie); the take's row says "loading audio" meanwhile.
 * - The scene export is the kept take of every line, in script order, with a gap of
 *   silence between them.
 */
import type { Scene, Take } from "./scene";
import { decodeWav, encodeWav, joinPcm } from "../audio/wav";

/** Take audio fetched at once after a reload. */
const FETCHES_AT_ONCE = 4;

export interface WavFile {
  name: string;
  wav: ArrayBuffer;
}

export class TakeAudio {
  private readonly fetching = new Map<number, Promise<Int16Array | null>>();

  constructor(
    private readonly scene: Scene,
    private readonly sampleRate: () => number,
    /** A take's audio arrived from the server. */
    private readonly loaded: () => void,
    /** A take's audio could not be fetched; shown next to the take. */
    private readonly failed: (take: Take, message: string) => void,
    /** The session's key: exports need it (header Retake-Session-Key, never in the URL). */
    private readonly sessionKey: () => string | null = () => null,
  ) {}

  /** The take's whole PCM: from memory, or the server's WAV export of it. */
  of(take: Take): Promise<Int16Array | null> {
    const pcm = this.scene.pcmOf(take);
    return pcm !== null ? Promise.resolve(pcm) : this.fetch(take);
  }

  async exportTake(take: Take): Promise<WavFile | null> {
    const pcm = await this.of(take);
    return pcm === null ? null : { name: `take-${take.id}.wav`, wav: encodeWav(pcm, this.sampleRate()) };
  }

  /** `takes` (non-empty) joined with `gapMs` of silence between them. */
  async exportScene(takes: Take[], gapMs: number, sessionId: string | null): Promise<WavFile | null> {
    const parts: Int16Array[] = [];
    for (const take of takes) {
      const pcm = await this.of(take);
      if (pcm === null) return null;
      parts.push(pcm);
    }
    const gap = Math.round((gapMs / 1000) * this.sampleRate());
    const name = `scene-${(sessionId ?? "retake").slice(0, 8)}.wav`;
    return { name, wav: encodeWav(joinPcm(parts, gap), this.sampleRate()) };
  }

  /** The take's audio is on its way from the server (its row says so). */
  isFetching(takeId: number): boolean {
    return this.fetching.has(takeId);
  }

  /**
   * After a reload: fetch the audio of every take of the script for its waveform, the kept and
   * latest of each line first, FETCHES_AT_ONCE at a time (the server answers from the audio it
   * kept, without the engine).
   */
  async loadWaveforms(): Promise<void> {
    const first = new Set<Take>();
    for (const line of this.scene.lines) {
      const kept = this.scene.keptTake(line.id);
      const latest = this.scene.latestTake(line.id);
      if (kept !== undefined) first.add(kept);
      if (latest !== undefined) first.add(latest);
    }
    const rest = this.scene.lines.flatMap((line) => this.scene.takesOf(line.id)).filter((t) => !first.has(t));
    const queue = [...first, ...rest].filter((t) => t.phase === "done" && t.samples > 0 && this.scene.pcmOf(t) === null);
    const worker = async (): Promise<void> => {
      for (let take = queue.shift(); take !== undefined; take = queue.shift()) await this.fetch(take);
    };
    await Promise.all(Array.from({ length: FETCHES_AT_ONCE }, worker));
  }

  /** The server's WAV export of a finished take, decoded and kept in the scene. */
  fetch(take: Take): Promise<Int16Array | null> {
    const running = this.fetching.get(take.id);
    if (running !== undefined) return running;
    const url = take.audioUrl;
    if (url === null || take.phase !== "done" || take.samples === 0) return Promise.resolve(null);
    const key = this.sessionKey();
    const job = fetch(url, { headers: key === null ? {} : { "Retake-Session-Key": key } })
      .then(async (response) => {
        if (!response.ok) throw new Error(`HTTP ${response.status} ${await response.text()}`);
        const wav = decodeWav(await response.arrayBuffer());
        this.scene.setAudio(take, wav.samples);
        this.loaded();
        return wav.samples;
      })
      .catch((error: unknown) => {
        this.failed(take, `could not load the take's audio: ${String(error)}`);
        return null;
      })
      .finally(() => this.fetching.delete(take.id));
    this.fetching.set(take.id, job);
    return job;
  }
}
