/**
 * The playback policy of a take, as a pure class: the worklet owns one and calls `render()`
 * from `process()`; tests drive it in Node with no Web Audio at all.
 *
 * Design choices (take mode; the duplex "live" mode with drop-oldest is not built yet):
 * - Audio of the playing take is never dropped. Windows queue as the server sends them
 *   (a take may run many times faster than real time), so the queue has no ceiling.
 * - Playback starts with the first window: no pre-buffer, that is the first-audio latency.
 * - Fades happen only where audio starts and where it breaks: the first FADE_SAMPLES of a
 *   take (and of the audio after an underrun) ramp in; an underrun, a stop, or a switch to
 *   another take ramps the last value out to zero over DECLICK_SAMPLES (samples made up
 *   for the ramp, so no sample of the take is changed). Inside a continuous take every
 *   sample is the server's PCM16 / 32768, exactly.
 * - After an underrun it waits for REBUFFER_MS of audio before resuming (doubling after
 *   each further underrun, up to REBUFFER_MAX_MS), or for the take's last window.
 * - Windows of any take but the one playing are discarded by take id; so are late
 *   windows of a take that was stopped.
 * - `render()` allocates nothing: the queue is a ring of window references that grows
 *   only in `push()` (which runs in the port's message handler, not in `process()`).
 */

/** Ramp-in length at a take's start and after an underrun: one render quantum, 2.9 ms. */
export const FADE_SAMPLES = 128;
/** Ramp-out length from the last rendered value to silence. */
export const DECLICK_SAMPLES = 64;
/** Audio to gather after the first underrun before playing again. */
export const REBUFFER_MS = 100;
export const REBUFFER_MAX_MS = 1600;

export const PlayState = { idle: 0, waiting: 1, playing: 2, rebuffering: 3, ended: 4, stopped: 5 } as const;
export type PlayState = (typeof PlayState)[keyof typeof PlayState];
export const PLAY_STATE_NAMES = ["idle", "waiting", "playing", "rebuffering", "ended", "stopped"] as const;

export const asSamples = (ms: number, sampleRate: number): number => Math.round((ms * sampleRate) / 1000);
export const asMs = (samples: number, sampleRate: number): number => (samples * 1000) / sampleRate;

/** What the worklet reports about the take it plays (copied out on a poll). */
export interface PlaybackStats {
  takeId: number;
  state: PlayState;
  /** Samples of the take rendered so far: the playhead. */
  rendered: number;
  /** Samples queued and not yet rendered. */
  buffered: number;
  /** Context frame of the take's first rendered sample, -1 before it. */
  firstFrame: number;
  /** Context frame just after the take's last sample, -1 before the end. */
  endFrame: number;
  underruns: number;
  /** Silent samples rendered inside the take while waiting for audio after an underrun. */
  silence: number;
  /** Windows thrown away because they belonged to a take not playing. */
  discarded: number;
}

export class JitterBuffer {
  readonly sampleRate: number;
  private windows: (Int16Array | null)[] = new Array<Int16Array | null>(64).fill(null);
  private head = 0; // index of the window being read
  private count = 0; // windows queued
  private offset = 0; // read position inside the head window
  private lastQueued = false; // the take's last window has been queued
  private fadePos = FADE_SAMPLES; // < FADE_SAMPLES while ramping in
  private declickLeft = 0; // > 0 while ramping the last value out
  private lastValue = 0;
  private resumeSamples: number;

  takeId = -1;
  state: PlayState = PlayState.idle;
  rendered = 0;
  buffered = 0;
  firstFrame = -1;
  endFrame = -1;
  underruns = 0;
  silence = 0;
  discarded = 0;

  constructor(sampleRate: number) {
    this.sampleRate = sampleRate;
    this.resumeSamples = asSamples(REBUFFER_MS, sampleRate);
  }

  /** Start playing `takeId` from its first window (already queued ones of another take go). */
  play(takeId: number): void {
    this.cut();
    this.takeId = takeId;
    this.state = PlayState.waiting;
    this.rendered = 0;
    this.firstFrame = -1;
    this.endFrame = -1;
    this.underruns = 0;
    this.silence = 0;
    this.resumeSamples = asSamples(REBUFFER_MS, this.sampleRate);
    this.fadePos = 0;
  }

  /** Stop now (ramping out); later windows of this take are discarded. */
  stop(): void {
    if (this.state === PlayState.idle) return;
    const wasPlaying = this.state === PlayState.playing || this.state === PlayState.waiting || this.state === PlayState.rebuffering;
    this.cut();
    if (wasPlaying) this.state = PlayState.stopped;
  }

  /** Queue a window; returns false when it was discarded (another take, or this one stopped). */
  push(takeId: number, pcm: Int16Array, last: boolean): boolean {
    const open = this.state === PlayState.waiting || this.state === PlayState.playing || this.state === PlayState.rebuffering;
    if (takeId !== this.takeId || !open || this.lastQueued) {
      this.discarded++;
      return false;
    }
    if (this.count === this.windows.length) this.grow();
    this.windows[(this.head + this.count) % this.windows.length] = pcm;
    this.count++;
    this.buffered += pcm.length;
    this.lastQueued = last;
    return true;
  }

  /** Fill `out` with the next block; `frame` is the context frame of out[0]. No allocation. */
  render(out: Float32Array, frame: number): void {
    const n = out.length;
    let i = 0;
    while (i < n) {
      if (this.declickLeft > 0) {
        this.declickLeft--;
        out[i++] = (this.lastValue * this.declickLeft) / DECLICK_SAMPLES;
        continue;
      }
      const state = this.state;
      if (state === PlayState.waiting || state === PlayState.rebuffering) {
        const ready = state === PlayState.waiting ? this.buffered > 0 : this.buffered >= this.resumeSamples;
        if (ready || (this.lastQueued && this.buffered > 0)) {
          if (state === PlayState.rebuffering) this.fadePos = 0;
          this.state = PlayState.playing;
          continue;
        }
        if (this.lastQueued) {
          this.finish(frame + i); // an empty last window after an underrun
          continue;
        }
        if (state === PlayState.rebuffering) this.silence += n - i;
        while (i < n) out[i++] = 0;
        break;
      }
      if (state !== PlayState.playing) {
        while (i < n) out[i++] = 0;
        break;
      }
      if (this.buffered === 0) {
        if (this.lastQueued) this.finish(frame + i);
        else this.underrun();
        continue;
      }
      const win = this.windows[this.head] as Int16Array;
      if (this.firstFrame < 0) this.firstFrame = frame + i;
      const take = Math.min(n - i, win.length - this.offset);
      for (let k = 0; k < take; k++) {
        let v = win[this.offset + k]! / 32768;
        if (this.fadePos < FADE_SAMPLES) v *= ++this.fadePos / FADE_SAMPLES;
        out[i + k] = v;
      }
      i += take;
      this.offset += take;
      this.rendered += take;
      this.buffered -= take;
      this.lastValue = out[i - 1]!;
      if (this.offset === win.length) this.advance();
    }
  }

  stats(): PlaybackStats {
    return {
      takeId: this.takeId, state: this.state, rendered: this.rendered, buffered: this.buffered,
      firstFrame: this.firstFrame, endFrame: this.endFrame, underruns: this.underruns,
      silence: this.silence, discarded: this.discarded,
    };
  }

  private underrun(): void {
    this.underruns++;
    this.state = PlayState.rebuffering;
    this.declickLeft = DECLICK_SAMPLES;
    if (this.underruns > 1) {
      this.resumeSamples = Math.min(this.resumeSamples * 2, asSamples(REBUFFER_MAX_MS, this.sampleRate));
    }
  }

  private finish(frame: number): void {
    this.state = PlayState.ended;
    this.endFrame = frame;
  }

  /** Drop everything queued, ramping out if audio was sounding. */
  private cut(): void {
    if (this.state === PlayState.playing && this.rendered > 0) this.declickLeft = DECLICK_SAMPLES;
    while (this.count > 0) this.advance();
    this.offset = 0;
    this.buffered = 0;
    this.lastQueued = false;
  }

  private advance(): void {
    this.windows[this.head] = null;
    this.head = (this.head + 1) % this.windows.length;
    this.count--;
    this.offset = 0;
  }

  private grow(): void {
    const bigger = new Array<Int16Array | null>(this.windows.length * 2).fill(null);
    for (let k = 0; k < this.count; k++) bigger[k] = this.windows[(this.head + k) % this.windows.length]!;
    this.windows = bigger;
    this.head = 0;
  }
}
