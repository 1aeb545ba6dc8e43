/** WAV export: 16-bit PCM RIFF (mono takes, stereo conversations), the plain format every editor reads. Takes are kept as
 * the PCM16 the server sent, so export writes those samples unchanged. */

const HEADER_BYTES = 44;

/** A RIFF/WAVE file holding `pcm` (16-bit, `channels` interleaved: mono by default) at `sampleRate`. */
export function encodeWav(pcm: Int16Array, sampleRate: number, channels = 1): ArrayBuffer {
  const dataBytes = pcm.length * 2;
  const buffer = new ArrayBuffer(HEADER_BYTES + dataBytes);
  const view = new DataView(buffer);
  const ascii = (offset: number, text: string): void => {
    for (let k = 0; k < text.length; k++) view.setUint8(offset + k, text.charCodeAt(k));
  };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + dataBytes, true); // size of everything after this field
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, channels, true);
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * 2 * channels, true); // byte rate
  view.setUint16(32, 2 * channels, true); // block align
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, dataBytes, true);
  for (let k = 0; k < pcm.length; k++) view.setInt16(HEADER_BYTES + 2 * k, pcm[k]!, true);
  return buffer;
}

/** Two tracks as one interleaved stereo track (the shorter one padded with silence). */
export function interleave(left: Int16Array, right: Int16Array): Int16Array {
  const out = new Int16Array(2 * Math.max(left.length, right.length));
  for (let k = 0; k < left.length; k++) out[2 * k] = left[k]!;
  for (let k = 0; k < right.length; k++) out[2 * k + 1] = right[k]!;
  return out;
}

/** One PCM track of `parts` in order, with `gapSamples` of silence between them. */
export function joinPcm(parts: readonly Int16Array[], gapSamples = 0): Int16Array {
  const gaps = Math.max(0, parts.length - 1) * gapSamples;
  const out = new Int16Array(parts.reduce((n, p) => n + p.length, 0) + gaps);
  let at = 0;
  parts.forEach((part, k) => {
    if (k > 0) at += gapSamples;
    out.set(part, at);
    at += part.length;
  });
  return out;
}

/** Read a PCM16 WAV (any channel count: the first channel is taken), as the server exports it. */
export function decodeWav(buffer: ArrayBuffer): { sampleRate: number; samples: Int16Array } {
  const view = new DataView(buffer);
  const tag = (at: number): string => String.fromCharCode(...new Uint8Array(buffer, at, 4));
  if (buffer.byteLength < 12 || tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("not a WAV file");
  let format: { channels: number; rate: number; bits: number; code: number } | null = null;
  for (let at = 12; at + 8 <= buffer.byteLength; ) {
    const id = tag(at);
    const size = view.getUint32(at + 4, true);
    const body = at + 8;
    if (id === "fmt ") {
      format = {
        code: view.getUint16(body, true), channels: view.getUint16(body + 2, true),
        rate: view.getUint32(body + 4, true), bits: view.getUint16(body + 14, true),
      };
    } else if (id === "data") {
      if (format === null) throw new Error("a WAV data chunk before its fmt chunk");
      if (format.code !== 1 || format.bits !== 16) throw new Error("only 16-bit PCM WAV files are read here");
      // A streamed WAV may say 0 or 0xffffffff for its length: take what is there.
      const bytes = Math.min(size, buffer.byteLength - body);
      const frames = Math.floor(bytes / (2 * format.channels));
      const samples = new Int16Array(frames);
      for (let k = 0; k < frames; k++) samples[k] = view.getInt16(body + 2 * k * format.channels, true);
      return { sampleRate: format.rate, samples };
    }
    at = body + size + (size % 2);
  }
  throw new Error("a WAV file without a data chunk");
}
