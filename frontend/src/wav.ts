/** WAV export: 16-bit PCM mono RIFF, the plain format every editor reads. Takes are kept as
 * the PCM16 the server sent, so export writes those samples unchanged. */

const HEADER_BYTES = 44;

/** A RIFF/WAVE file holding `pcm` (mono, 16-bit) at `sampleRate`. */
export function encodeWav(pcm: Int16Array, sampleRate: number): ArrayBuffer {
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
  view.setUint16(22, 1, true); // channels
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * 2, true); // byte rate
  view.setUint16(32, 2, true); // block align
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, dataBytes, true);
  for (let k = 0; k < pcm.length; k++) view.setInt16(HEADER_BYTES + 2 * k, pcm[k]!, true);
  return buffer;
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
