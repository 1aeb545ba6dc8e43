/**
 * The playback policy of a live conversation, as a pure class: the conversation's player
 * worklet owns one and calls `render()` from `process()`; tests drive it in Node.
 *
 * A take (jitter_buffer.ts) is heard whole, however late; a conversation is heard as it
 * happens, so this buffer keeps the agent's delay small and bounded instead:
 * - It starts (and restarts after an underrun) once `target` is queued: 120 ms at first, so
 *   with one 80 ms frame every 80 ms there is a frame plus 40 ms of margin for the network
 *   and the server's tick. Each underrun adds 40 ms to the target, up to 200 ms.
 * - A burst after a stall (frames queued beyond target + SLACK_MS) drops the oldest audio back
 *   to the target: late speech is worth less than a conversation that stays in time.
 * - Where the audio breaks (an underrun, a drop) the last value ramps to zero over
 *   DECLICK_SAMPLES made-up samples, and the audio that follows ramps in over FADE_SAMPLES.
 * - One preallocated Float32 ring (2 s); `push()` converts PCM16 into it (in the port's
 *   message handler) and `render()` copies out of it: neither allocates.
 */
import { DECLICK_SAMPLES, FADE_SAMPLES, asSamples } from "./jitter_buffer";

export const START_MS = 120;
export const GROW_MS = 40;
export const MAX_START_MS = 200;
export const SLACK_MS = 160;
export const RING_MS = 2000;

/** What the worklet reports (copied out on a poll). Counts are samples at the buffer's rate. */
export interface LiveStats {
  playing: boolean;
  /** Agent samples rendered so far. */
  played: number;
  buffered: number;
  /** The level playback (re)starts at. */
  target: number;
  underruns: number;
  /** Agent samples thrown away to stay in time. */
  dropped: number;
}

export class LiveBuffer {
  private readonly ring: Float32Array;
  private readonly slack: number;
  private readonly maxTarget: number;
  private readonly grow: number;
  private read = 0; // ring index of the next sample to play
  private size = 0; // samples queued
  private fadePos = FADE_SAMPLES; // < FADE_SAMPLES while ramping in
  private declickLeft = 0;
  private lastValue = 0;

  playing = false;
  played = 0;
  target: number;
  underruns = 0;
  dropped = 0;

  constructor(readonly sampleRate: number) {
    this.ring = new Float32Array(asSamples(RING_MS, sampleRate));
    this.target = asSamples(START_MS, sampleRate);
    this.slack = asSamples(SLACK_MS, sampleRate);
    this.maxTarget = asSamples(MAX_START_MS, sampleRate);
    this.grow = asSamples(GROW_MS, sampleRate);
  }

  get buffered(): number {
    return this.size;
  }

  /** Queue the agent's next samples (dropping the oldest if that puts it too far behind). */
  push(pcm: Int16Array): void {
    const capacity = this.ring.length;
    let from = 0;
    if (pcm.length > capacity) from = pcm.length - capacity; // only the newest fit
    if (this.size + pcm.length - from > capacity) this.drop(this.size + pcm.length - from - capacity);
    this.dropped += from;
    let at = (this.read + this.size) % capacity;
    for (let k = from; k < pcm.length; k++) {
      this.ring[at] = pcm[k]! / 32768;
      if (++at === capacity) at = 0;
    }
    this.size += pcm.length - from;
    if (this.size > this.target + this.slack) this.drop(this.size - this.target);
  }

  /** Fill `out` with the next block. No allocation. */
  render(out: Float32Array): void {
    const n = out.length;
    const capacity = this.ring.length;
    let i = 0;
    while (i < n) {
      if (this.declickLeft > 0) {
        this.declickLeft--;
        out[i++] = (this.lastValue * this.declickLeft) / DECLICK_SAMPLES;
        continue;
      }
      if (!this.playing) {
        if (this.size >= this.target) {
          this.playing = true;
          this.fadePos = 0;
          continue;
        }
        out.fill(0, i);
        break;
      }
      if (this.size === 0) {
        this.underruns++;
        this.playing = false;
        this.declickLeft = DECLICK_SAMPLES;
        this.target = Math.min(this.target + this.grow, this.maxTarget);
        continue;
      }
      const take = Math.min(n - i, this.size, capacity - this.read);
      for (let k = 0; k < take; k++) {
        let v = this.ring[this.read + k]!;
        if (this.fadePos < FADE_SAMPLES) v *= ++this.fadePos / FADE_SAMPLES;
        out[i + k] = v;
      }
      i += take;
      this.read = (this.read + take) % capacity;
      this.size -= take;
      this.played += take;
      this.lastValue = out[i - 1]!;
    }
  }

  stats(): LiveStats {
    return {
      playing: this.playing, played: this.played, buffered: this.size, target: this.target,
      underruns: this.underruns, dropped: this.dropped,
    };
  }

  private drop(count: number): void {
    this.read = (this.read + count) % this.ring.length;
    this.size -= count;
    this.dropped += count;
    if (this.playing) {
      if (this.declickLeft === 0) this.declickLeft = DECLICK_SAMPLES;
      this.fadePos = 0;
    }
  }
}
