/**
 * Waveforms drawn from peaks: each bucket of BUCKET samples keeps its min and max, added
 * window by window while a take streams, so drawing never rescans the samples.
 * (wavesurfer.js cannot draw a stream; its maintainers suggest precomputed peaks.)
 */

export const BUCKET = 256; // 5.8 ms at 44.1 kHz

export class Peaks {
  private min = new Float32Array(1024);
  private max = new Float32Array(1024);
  private samples = 0;

  get length(): number {
    return this.samples;
  }

  reset(): void {
    this.samples = 0;
  }

  add(pcm: Int16Array): void {
    for (let k = 0; k < pcm.length; k++) {
      const bucket = Math.floor(this.samples / BUCKET);
      if (bucket >= this.min.length) this.grow();
      const v = pcm[k]! / 32768;
      if (this.samples % BUCKET === 0) {
        this.min[bucket] = v;
        this.max[bucket] = v;
      } else {
        if (v < this.min[bucket]!) this.min[bucket] = v;
        if (v > this.max[bucket]!) this.max[bucket] = v;
      }
      this.samples++;
    }
  }

  /** Min and max over samples [from, to) from the buckets that cover them. */
  range(from: number, to: number): [number, number] {
    const first = Math.floor(from / BUCKET);
    const last = Math.min(Math.ceil(to / BUCKET), Math.ceil(this.samples / BUCKET));
    let lo = 0;
    let hi = 0;
    for (let b = first; b < last; b++) {
      lo = Math.min(lo, this.min[b]!);
      hi = Math.max(hi, this.max[b]!);
    }
    return [lo, hi];
  }

  private grow(): void {
    const min = new Float32Array(this.min.length * 2);
    const max = new Float32Array(this.max.length * 2);
    min.set(this.min);
    max.set(this.max);
    this.min = min;
    this.max = max;
  }
}

export interface WaveStyle {
  wave: string;
  played: string;
  playhead: string;
  baseline: string;
}

/**
 * Draw `peaks` across the canvas. `spanSamples` is how many samples the width shows: the
 * take's length once it is done; while it streams, at least a few seconds so the wave grows
 * from the left instead of rescaling every window.
 */
export function drawWave(canvas: HTMLCanvasElement, peaks: Peaks, spanSamples: number, playhead: number | null,
                         style: WaveStyle): void {
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
  const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
  }
  const g = canvas.getContext("2d");
  if (g === null) return;
  g.clearRect(0, 0, width, height);
  const mid = height / 2;
  g.fillStyle = style.baseline;
  g.fillRect(0, Math.floor(mid), width, 1);
  const span = Math.max(spanSamples, 1);
  const perPixel = span / width;
  const playedX = playhead === null ? -1 : (playhead / span) * width;
  for (let x = 0; x < width; x++) {
    const from = Math.floor(x * perPixel);
    if (from >= peaks.length) break;
    const [lo, hi] = peaks.range(from, Math.floor((x + 1) * perPixel) + 1);
    const top = mid - hi * mid;
    const bar = Math.max(1, (hi - lo) * mid);
    g.fillStyle = x < playedX ? style.played : style.wave;
    g.fillRect(x, top, 1, bar);
  }
  if (playedX >= 0 && playedX <= width) {
    g.fillStyle = style.playhead;
    g.fillRect(Math.floor(playedX), 0, Math.max(1, ratio), height);
  }
}
