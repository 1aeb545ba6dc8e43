import { describe, expect, it } from "vitest";
import { DECLICK_SAMPLES, FADE_SAMPLES, asSamples } from "../../../frontend/src/audio/jitter_buffer";
import { GROW_MS, LiveBuffer, MAX_START_MS, RING_MS, SLACK_MS, START_MS } from "../../../frontend/src/audio/live_buffer";

const RATE = 24000;
const BLOCK = 128;
const TICK = 1920; // 80 ms
const START = asSamples(START_MS, RATE);

/** Tick `n` of the agent: distinct, non-zero samples. */
const tick = (n: number, length = TICK): Int16Array => Int16Array.from({ length }, (_, k) => ((n * 7919 + k * 31) % 20000) + 1);

/** Render `samples` (a multiple of the quantum) and return them. */
function render(buffer: LiveBuffer, samples: number): Float32Array {
  const out = new Float32Array(samples);
  for (let at = 0; at < samples; at += BLOCK) buffer.render(out.subarray(at, at + BLOCK));
  return out;
}

const asFloat = (pcm: Int16Array): number[] => [...pcm].map((v) => v / 32768);

describe("LiveBuffer", () => {
  it("waits for the start level, then plays the agent's samples exactly, ramping in once", () => {
    const buffer = new LiveBuffer(RATE);
    buffer.push(tick(0));
    expect(render(buffer, 1280).every((v) => v === 0)).toBe(true); // 80 ms < 120 ms: still waiting
    expect(buffer.stats()).toMatchObject({ playing: false, played: 0, buffered: TICK });
    buffer.push(tick(1));
    const out = render(buffer, 2 * TICK);
    const sent = [...asFloat(tick(0)), ...asFloat(tick(1))];
    for (let k = 0; k < FADE_SAMPLES; k++) expect(out[k]).toBeCloseTo((sent[k]! * (k + 1)) / FADE_SAMPLES, 6);
    expect([...out.subarray(FADE_SAMPLES)]).toEqual(sent.slice(FADE_SAMPLES).map(Math.fround));
    expect(buffer.stats()).toMatchObject({ playing: true, played: 2 * TICK, buffered: 0, underruns: 0, dropped: 0 });
  });

  it("keeps time with a tick every 80 ms: no underrun, nothing dropped, a bounded delay", () => {
    const buffer = new LiveBuffer(RATE);
    let most = 0;
    for (let n = 0; n < 200; n++) { // 16 s, the server a little early or late each tick
      buffer.push(tick(n));
      render(buffer, TICK + (n % 3 === 0 ? 128 : n % 3 === 1 ? -128 : 0));
      most = Math.max(most, buffer.buffered);
    }
    expect(buffer.stats()).toMatchObject({ playing: true, underruns: 0, dropped: 0 });
    expect(most).toBeLessThanOrEqual(START + TICK);
  });

  it("ramps out at an underrun, then waits for a higher level before playing again", () => {
    const buffer = new LiveBuffer(RATE);
    buffer.push(tick(0));
    buffer.push(tick(1));
    const played = render(buffer, 2 * TICK);
    const last = played[played.length - 1]!;
    const gap = render(buffer, 2 * BLOCK);
    for (let k = 0; k < DECLICK_SAMPLES; k++) expect(gap[k]).toBeCloseTo((last * (DECLICK_SAMPLES - 1 - k)) / DECLICK_SAMPLES, 6);
    expect(gap.subarray(DECLICK_SAMPLES).every((v) => v === 0)).toBe(true);
    expect(buffer.stats()).toMatchObject({ playing: false, underruns: 1, target: START + asSamples(GROW_MS, RATE) });
    buffer.push(tick(2));
    buffer.push(tick(3).subarray(0, 960)); // 120 ms: not the new 160 ms yet
    expect(render(buffer, BLOCK).every((v) => v === 0)).toBe(true);
    buffer.push(tick(3).subarray(960));
    const again = render(buffer, BLOCK);
    expect(again[0]).toBeCloseTo(tick(2)[0]! / 32768 / FADE_SAMPLES, 6);
    expect(buffer.stats().playing).toBe(true);
  });

  it("raises the start level after each underrun, up to its ceiling", () => {
    const buffer = new LiveBuffer(RATE);
    for (let n = 0; n < 10; n++) {
      buffer.push(tick(n, buffer.target));
      render(buffer, Math.ceil((buffer.target + DECLICK_SAMPLES) / BLOCK) * BLOCK + BLOCK);
    }
    expect(buffer.stats()).toMatchObject({ underruns: 10, target: asSamples(MAX_START_MS, RATE) });
  });

  it("drops the oldest audio after a burst, back to the start level, and plays the newest", () => {
    const buffer = new LiveBuffer(RATE);
    const ceiling = START + asSamples(SLACK_MS, RATE);
    buffer.push(tick(0));
    buffer.push(tick(1));
    render(buffer, TICK); // playing, one tick left
    const burst = [2, 3, 4, 5, 6].map((n) => tick(n)); // a stall, then five ticks at once
    const levels = burst.map((pcm) => (buffer.push(pcm), buffer.buffered));
    // Past the ceiling the level falls back to the start level, then climbs again.
    expect(levels).toEqual([2 * TICK, 3 * TICK, START, START + TICK, START + 2 * TICK]);
    expect(Math.max(...levels)).toBeLessThanOrEqual(ceiling);
    const kept = buffer.buffered;
    expect(buffer.stats().dropped).toBe(TICK + 5 * TICK - kept);
    const out = render(buffer, DECLICK_SAMPLES + kept - (kept % BLOCK) + BLOCK);
    const newest = burst.flatMap((pcm) => asFloat(pcm)).slice(-kept);
    // The old audio ramps out (made-up samples), then the newest ramps in and plays as sent.
    const after = out.subarray(DECLICK_SAMPLES + FADE_SAMPLES, DECLICK_SAMPLES + kept);
    expect([...after]).toEqual(newest.slice(FADE_SAMPLES).map(Math.fround));
    expect(buffer.stats()).toMatchObject({ played: TICK + kept, underruns: 1 }); // dry after the kept audio
  });

  it("keeps only the newest ring's worth of one huge push", () => {
    const buffer = new LiveBuffer(RATE);
    const ring = asSamples(RING_MS, RATE);
    buffer.push(new Int16Array(ring + 5000).fill(3));
    expect(buffer.stats()).toMatchObject({ buffered: START, dropped: ring + 5000 - START });
  });
});
