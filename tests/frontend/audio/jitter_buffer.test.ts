import { describe, expect, it } from "vitest";
import {
  DECLICK_SAMPLES, FADE_SAMPLES, JitterBuffer, PlayState, REBUFFER_MS, asSamples,
} from "../../../frontend/src/audio/jitter_buffer";

const RATE = 44100;
const BLOCK = 128;

/** Deterministic non-zero PCM, different for every (seed, index). */
function pcm(length: number, seed = 1): Int16Array {
  const out = new Int16Array(length);
  let x = seed * 2654435761;
  for (let k = 0; k < length; k++) {
    x = (Math.imul(x, 1103515245) + 12345) | 0;
    out[k] = ((x >>> 8) % 60000) - 30000 || 1;
  }
  return out;
}

/** Render `blocks` quanta starting at context frame `frame`; returns the samples. */
function render(buffer: JitterBuffer, blocks: number, frame = 0): Float32Array {
  const out = new Float32Array(blocks * BLOCK);
  for (let b = 0; b < blocks; b++) buffer.render(out.subarray(b * BLOCK, (b + 1) * BLOCK), frame + b * BLOCK);
  return out;
}

/** What the take should sound like: PCM / 32768 with the ramp-in over the first samples. */
function expected(take: Int16Array, fadeFrom = 0): Float32Array {
  const out = new Float32Array(take.length);
  for (let k = 0; k < take.length; k++) {
    const into = k - fadeFrom;
    const gain = into >= 0 && into < FADE_SAMPLES ? (into + 1) / FADE_SAMPLES : 1;
    out[k] = (take[k]! / 32768) * gain;
  }
  return out;
}

/** Index of the first sample where `a` and `b` differ (-1 when equal): fast on long takes. */
function firstMismatch(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  for (let k = 0; k < a.length; k++) if (a[k] !== b[k]) return k;
  return -1;
}

function split(take: Int16Array, sizes: number[]): Int16Array[] {
  const parts: Int16Array[] = [];
  let at = 0;
  for (let k = 0; at < take.length; k++) {
    const size = sizes[Math.min(k, sizes.length - 1)]!;
    parts.push(take.slice(at, at + size));
    at += size;
  }
  return parts;
}

describe("JitterBuffer in take mode", () => {
  it("starts with the first window and plays the take sample-exactly, fading only its start", () => {
    const take = pcm(20480 * 3 + 777);
    const windows = split(take, [20480, 20480, 24576, 65536]);
    const buffer = new JitterBuffer(RATE);
    buffer.play(7);
    expect(render(buffer, 3, 0).every((v) => v === 0)).toBe(true); // nothing queued yet: silence
    expect(buffer.firstFrame).toBe(-1);

    buffer.push(7, windows[0]!, false);
    const heard: Float32Array[] = [];
    let frame = 3 * BLOCK;
    heard.push(render(buffer, 1, frame)); // the very next quantum already sounds
    expect(buffer.firstFrame).toBe(frame);
    frame += BLOCK;
    for (let k = 1; k < windows.length; k++) buffer.push(7, windows[k]!, k === windows.length - 1);
    const blocks = Math.ceil(take.length / BLOCK) + 4;
    heard.push(render(buffer, blocks, frame));
    const all = new Float32Array(heard.reduce((n, h) => n + h.length, 0));
    heard.reduce((at, h) => (all.set(h, at), at + h.length), 0);

    expect(firstMismatch(all.subarray(0, take.length), expected(take))).toBe(-1);
    expect(all.subarray(take.length).every((v) => v === 0)).toBe(true); // the end is not faded or padded
    expect(buffer.state).toBe(PlayState.ended);
    expect(buffer.endFrame).toBe(3 * BLOCK + take.length);
    expect(buffer.rendered).toBe(take.length);
    expect(buffer.underruns).toBe(0);
    expect(buffer.silence).toBe(0);
  });

  it("never drops audio however far ahead the server runs", () => {
    const take = pcm(RATE * 60, 3); // a minute of audio queued before the first quantum
    const windows = split(take, [2048 * 64]);
    const buffer = new JitterBuffer(RATE);
    buffer.play(1);
    windows.forEach((w, k) => expect(buffer.push(1, w, k === windows.length - 1)).toBe(true));
    expect(buffer.buffered).toBe(take.length);
    const out = render(buffer, Math.ceil(take.length / BLOCK));
    expect(firstMismatch(out.subarray(0, take.length), expected(take))).toBe(-1);
    expect(buffer.state).toBe(PlayState.ended);
  });

  it("keeps window order when its queue grows while wrapped around", () => {
    const take = pcm(300 * 100, 5);
    const windows = split(take, [100]);
    const buffer = new JitterBuffer(RATE);
    buffer.play(2);
    const out: number[] = [];
    const block = new Float32Array(BLOCK);
    let pushed = 0;
    // Push 50 windows, render a little, push 250 more: the ring wraps, then grows.
    for (; pushed < 50; pushed++) buffer.push(2, windows[pushed]!, false);
    for (let b = 0; b < 30; b++) (buffer.render(block, b * BLOCK), out.push(...block));
    for (; pushed < windows.length; pushed++) buffer.push(2, windows[pushed]!, pushed === windows.length - 1);
    for (let b = 30; out.length < take.length; b++) (buffer.render(block, b * BLOCK), out.push(...block));
    expect(Float32Array.from(out.slice(0, take.length))).toEqual(expected(take));
  });

  it("on underrun ramps the last value out, waits to rebuffer, then fades back in", () => {
    const first = pcm(1000, 11);
    const second = pcm(asSamples(REBUFFER_MS, RATE) + 500, 12);
    const buffer = new JitterBuffer(RATE);
    buffer.play(3);
    buffer.push(3, first, false);
    const out = render(buffer, 20);
    expect(out.subarray(0, 1000)).toEqual(expected(first));
    expect(buffer.underruns).toBe(1);
    expect(buffer.state).toBe(PlayState.rebuffering);
    const last = out[999]!;
    for (let k = 0; k < DECLICK_SAMPLES; k++) {
      expect(out[1000 + k]).toBeCloseTo((last * (DECLICK_SAMPLES - 1 - k)) / DECLICK_SAMPLES, 7);
    }
    expect(out.subarray(1000 + DECLICK_SAMPLES).every((v) => v === 0)).toBe(true);
    expect(buffer.silence).toBe(20 * BLOCK - 1000 - DECLICK_SAMPLES);

    buffer.push(3, second.subarray(0, 1000), false); // less than REBUFFER_MS: keep waiting
    expect(render(buffer, 2, 20 * BLOCK).every((v) => v === 0)).toBe(true);
    buffer.push(3, second.subarray(1000), true);
    const resumed = render(buffer, Math.ceil(second.length / BLOCK) + 1, 22 * BLOCK);
    expect(resumed.subarray(0, second.length)).toEqual(expected(second));
    expect(buffer.state).toBe(PlayState.ended);
    expect(buffer.rendered).toBe(first.length + second.length);
  });

  it("waits longer after each further underrun, but plays the last window at once", () => {
    const buffer = new JitterBuffer(RATE);
    const wait = asSamples(REBUFFER_MS, RATE);
    buffer.play(4);
    buffer.push(4, pcm(200), false);
    render(buffer, 4);
    buffer.push(4, pcm(wait, 2), false); // exactly the first threshold: resumes
    render(buffer, Math.ceil(wait / BLOCK) + 2);
    expect(buffer.underruns).toBe(2);
    buffer.push(4, pcm(wait, 3), false); // now twice as much is needed
    expect(render(buffer, 2).every((v) => v === 0)).toBe(true);
    buffer.push(4, pcm(10, 4), true); // ...unless the take is complete
    const out = render(buffer, 2);
    expect(out[0]).not.toBe(0);
    expect(buffer.underruns).toBe(2);
  });

  it("discards windows of any take it is not playing, by take id", () => {
    const a = pcm(5000, 21);
    const b = pcm(3000, 22);
    const buffer = new JitterBuffer(RATE);
    expect(buffer.push(9, a, false)).toBe(false); // nothing is playing
    buffer.play(1);
    buffer.push(1, a, false);
    const before = render(buffer, 4);
    expect(before).toEqual(expected(a).subarray(0, 4 * BLOCK));
    buffer.play(2); // switch while take 1 is mid-window
    expect(buffer.push(1, pcm(100, 23), true)).toBe(false); // late window of take 1
    buffer.push(2, b, true);
    const out = render(buffer, Math.ceil(b.length / BLOCK) + 2);
    const last = before[before.length - 1]!;
    expect(out[0]).toBeCloseTo((last * (DECLICK_SAMPLES - 1)) / DECLICK_SAMPLES, 7);
    expect(out.subarray(DECLICK_SAMPLES, DECLICK_SAMPLES + b.length)).toEqual(expected(b));
    expect(buffer.firstFrame).toBe(DECLICK_SAMPLES);
    expect(buffer.discarded).toBe(2);
    expect(buffer.rendered).toBe(b.length);
  });

  it("stop ramps out and discards the rest of the take", () => {
    const buffer = new JitterBuffer(RATE);
    buffer.play(5);
    buffer.push(5, pcm(10000, 31), false);
    render(buffer, 2);
    buffer.stop();
    expect(buffer.state).toBe(PlayState.stopped);
    expect(buffer.buffered).toBe(0);
    expect(buffer.push(5, pcm(100, 32), true)).toBe(false);
    const out = render(buffer, 2);
    expect(out.subarray(DECLICK_SAMPLES).every((v) => v === 0)).toBe(true);
    expect(Math.abs(out[DECLICK_SAMPLES - 1]!)).toBeLessThan(1 / DECLICK_SAMPLES);
    expect(buffer.rendered).toBe(2 * BLOCK);
  });

  it("ends an empty take without sound", () => {
    const buffer = new JitterBuffer(RATE);
    buffer.play(6);
    buffer.push(6, new Int16Array(0), true);
    expect(render(buffer, 1, 640).every((v) => v === 0)).toBe(true);
    expect(buffer.state).toBe(PlayState.ended);
    expect(buffer.endFrame).toBe(640);
    expect(buffer.firstFrame).toBe(-1);
  });
});
