/**
 * The page's side of playback: the AudioContext, the player worklet, and what it reports.
 *
 * - The context runs at the engine's rate (44.1 kHz for Drama 3) with latencyHint
 *   "interactive"; browsers only let it start from a user gesture, so `Player.create()` is
 *   called from the first click or key press.
 * - Windows go to the worklet as port messages, each window's buffer transferred (not
 *   copied). A SharedArrayBuffer ring would need COOP/COEP headers on every response; at
 *   ~4 messages a second per take, messages cost nothing that matters.
 * - The worklet never posts on its own (that would allocate in `process()`): the page polls
 *   it every 50 ms and gets its counters back.
 * - First-audio latency "as heard": the worklet gives the context frame of a take's first
 *   sample; `getOutputTimestamp()` maps context time to performance.now() at the speaker,
 *   so the latency includes the output path, from the click to the first sample leaving it.
 * - With `?tap` in the page's URL a recorder worklet sits behind the player so the
 *   end-to-end test can read back exactly what was rendered.
 */
import { PLAY_STATE_NAMES, type PlaybackStats } from "./jitter_buffer";
import workletUrl from "./worklet/player.worklet.ts?worker&url";
import tapUrl from "./worklet/tap.worklet.ts?worker&url";
import {
  PLAYER_PROCESSOR, TAP_PROCESSOR, type FromPlayer, type FromTap, type ToPlayer, type ToTap,
} from "./worklet_messages";

const POLL_MS = 50;

export interface PlayerReport extends PlaybackStats {
  stateName: (typeof PLAY_STATE_NAMES)[number];
  /** performance.now() when the take's first sample is heard; null before it plays. */
  firstHeardAt: number | null;
  bufferedMs: number;
  playheadMs: number;
}

export class Player {
  readonly sampleRate: number;
  /** Called after every poll with the worklet's counters. */
  onReport: (report: PlayerReport) => void = () => {};
  private pollTimer: number | undefined;
  private lastReport: PlayerReport | null = null;

  private constructor(
    readonly context: AudioContext,
    private readonly node: AudioWorkletNode,
    private readonly tap: AudioWorkletNode | null,
  ) {
    this.sampleRate = context.sampleRate;
    node.port.onmessage = (event: MessageEvent<FromPlayer>) => this.receive(event.data);
    this.pollTimer = window.setInterval(() => this.post({ type: "poll" }), POLL_MS);
  }

  /** Call from a user gesture: creates and resumes the context, then loads the worklet. */
  static async create(sampleRate: number, withTap: boolean): Promise<Player> {
    const context = new AudioContext({ sampleRate, latencyHint: "interactive" });
    const resumed = context.resume(); // inside the gesture, before any await
    await context.audioWorklet.addModule(workletUrl);
    const node = new AudioWorkletNode(context, PLAYER_PROCESSOR, {
      numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
    });
    node.connect(context.destination);
    let tap: AudioWorkletNode | null = null;
    if (withTap) {
      await context.audioWorklet.addModule(tapUrl);
      tap = new AudioWorkletNode(context, TAP_PROCESSOR, { numberOfInputs: 1, numberOfOutputs: 0 });
      node.connect(tap);
    }
    await resumed;
    return new Player(context, node, tap);
  }

  /**
   * Start playing a take: `windows` is what has arrived so far; `complete` if nothing more
   * comes; `fromSample` skips the take's start (A/B comparison switches takes in place).
   */
  play(takeId: number, windows: readonly Int16Array[], complete: boolean, fromSample = 0): void {
    this.post({ type: "play", takeId });
    let skip = fromSample;
    const rest: Int16Array[] = [];
    for (const pcm of windows) {
      if (skip >= pcm.length) skip -= pcm.length;
      else (rest.push(skip > 0 ? pcm.subarray(skip) : pcm), (skip = 0));
    }
    rest.forEach((pcm, k) => this.push(takeId, pcm, complete && k === rest.length - 1));
    if (complete && rest.length === 0) this.end(takeId);
  }

  /** Queue a window of a take; the worklet drops it if that take is not the one playing. */
  push(takeId: number, pcm: Int16Array, last: boolean): void {
    const copy = pcm.slice(); // the caller keeps its samples; the copy's buffer moves
    this.post({ type: "push", takeId, pcm: copy, last }, [copy.buffer]);
  }

  /** Nothing more comes for this take (take.done without a flagged last window). */
  end(takeId: number): void {
    this.push(takeId, new Int16Array(0), true);
  }

  stop(): void {
    this.post({ type: "stop" });
  }

  get report(): PlayerReport | null {
    return this.lastReport;
  }

  /** Everything the tap recorded (only with `?tap`). */
  async readTap(): Promise<{ startFrame: number; skipped: number; samples: Float32Array }> {
    const reply = await this.askTap({ type: "read" });
    if (reply.type !== "tape") throw new Error("the tap answered a read with a reset");
    return reply;
  }

  /** Forget what the tap recorded so far; resolves once it has (only with `?tap`). */
  async resetTap(): Promise<void> {
    await this.askTap({ type: "reset" });
  }

  private askTap(message: ToTap): Promise<FromTap> {
    const tap = this.tap;
    if (tap === null) return Promise.reject(new Error("the page was loaded without ?tap"));
    return new Promise((resolve) => {
      tap.port.onmessage = (event: MessageEvent<FromTap>) => resolve(event.data);
      tap.port.postMessage(message);
    });
  }

  close(): void {
    window.clearInterval(this.pollTimer);
    void this.context.close();
  }

  private post(message: ToPlayer, transfer: Transferable[] = []): void {
    this.node.port.postMessage(message, transfer);
  }

  private receive(message: FromPlayer): void {
    const s = message.stats;
    const report: PlayerReport = {
      ...s,
      stateName: PLAY_STATE_NAMES[s.state],
      firstHeardAt: s.firstFrame < 0 ? null : this.heardAt(s.firstFrame),
      bufferedMs: (s.buffered * 1000) / this.sampleRate,
      playheadMs: (s.rendered * 1000) / this.sampleRate,
    };
    this.lastReport = report;
    this.onReport(report);
  }

  /** performance.now() at which the sample of context frame `frame` leaves the speaker. */
  private heardAt(frame: number): number {
    const stamp = this.context.getOutputTimestamp();
    const contextTime = stamp.contextTime ?? 0;
    const performanceTime = stamp.performanceTime ?? 0;
    if (performanceTime > 0) return performanceTime + (frame / this.sampleRate - contextTime) * 1000;
    // No output timestamp (no audio device): render time plus the reported output latency.
    const latency = this.context.baseLatency + (this.context.outputLatency || 0);
    return performance.now() + (frame / this.sampleRate - this.context.currentTime + latency) * 1000;
  }
}
